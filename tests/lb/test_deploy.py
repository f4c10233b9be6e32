"""``lb deploy`` and friends on this machine (no kprobes: the module never
loads here; tests/lb/test_kmod_lab.py loads it in the lab): the model check
before anything touches the kernel, the module's parameter layout, and the
one-line errors when no module is loaded."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kernmlops.lb import deploy
from kernmlops.lb.cli import lb_group
from kernmlops.lb.fixed import FixedModel, fixed_json, load_fixed_json
from kernmlops.lb.model import Model
from kernmlops.lb.names import FEATURES
from kernmlops.lb.weights import WeightsError, check_model

pytestmark = pytest.mark.skipif(deploy.loaded(), reason="kmo_lb is loaded on this machine")


def _fixed() -> FixedModel:
    rng = np.random.default_rng(11)
    return FixedModel.from_model(Model(rng.normal(size=(15, 10)), rng.normal(size=10),
                                       rng.normal(size=10), 0.3))  # fmt: skip


def _write(tmp_path: Path, doc: dict, name: str = "m.q11.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_params_are_the_modules_layout(tmp_path: Path) -> None:
    fixed = _fixed()
    q = deploy.load_q11(_write(tmp_path, fixed_json(fixed, {"migration_cost_ns": 250_000})))
    params = dict(p.split("=", 1) for p in q.params())
    # kmo_lb.c reads w1[feature * 10 + hidden]
    w1 = np.array([int(v) for v in params["w1"].split(",")])
    assert w1.shape == (150,)
    for k in (0, 7, 14):
        for j in (0, 9):
            assert w1[k * 10 + j] == fixed.w1[k, j]
    assert [int(v) for v in params["b1"].split(",")] == fixed.b1.tolist()
    assert [int(v) for v in params["w2"].split(",")] == fixed.w2.tolist()
    assert int(params["b2"]) == fixed.b2
    assert deploy.migration_cost(q.meta, None) == 250_000
    assert deploy.migration_cost(q.meta, 7) == 7


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "kernmlops-lb-model"}, "is not a fixed-point model"),
        # the rest is every model reader's check (kernmlops.lb.modelfile.check_model_doc)
        ({"fbits": 12}, "Q20.12 model, expected Q20.11"),
        ({"version": 99}, "is from a newer kernmlops (model version 99)"),
        ({"hidden": 9}, "hidden is 9, but w1 has 10 columns"),
        ({"b1": [0] * 9}, "b1 is 9 numbers, must be 10 numbers"),
        ({"w2": [0.5] * 10}, "w2 holds 0.5, not a Q20.11 int32"),
        ({"b2": 1 << 31}, "b2 holds 2147483648, not a Q20.11 int32"),
        ({"b2": None}, "no b2 (a model holds w1, b1, w2, b2)"),
        ({"w1": [[0] * 10] * 14}, "w1 is 14x10 numbers, must be 15x10 numbers"),
        ({"w1": [[0] * 10] * 14 + [[0] * 11]}, "w1 must be 15x10 numbers, its rows differ"),
        ({"features": list(reversed(FEATURES))}, "features differ from MLLB's 15"),
        # the module's own network: 10 hidden units, whatever a float model may have
        ({"w1": [[0] * 8] * 15, "b1": [0] * 8, "w2": [0] * 8, "hidden": 8},
         "the module runs 15 -> 10 -> 1, the model has 8 hidden units"),
    ],
)  # fmt: skip
def test_wrong_models_are_refused_before_the_kernel(tmp_path: Path, change: dict,
                                                    message: str) -> None:  # fmt: skip
    doc = {**fixed_json(_fixed(), {}), **change}
    for key in [k for k, v in change.items() if v is None]:
        del doc[key]
    path = _write(tmp_path, doc)
    with pytest.raises(deploy.KmodError, match=re.escape(message)):
        deploy.load_q11(path)
    # the CLI says it in one line and exits 2, whatever the mode
    r = CliRunner().invoke(lb_group, ["deploy", str(path), "--mode", "replace"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and message in r.stderr
    # every other reader of a model refuses the same file with the same words (but
    # the module's 10 hidden units, which only the module needs)
    if "the module runs" not in message and "format" not in change:
        with pytest.raises(WeightsError, match=re.escape(message)):
            check_model(json.loads(path.read_text()), str(path))


def test_every_reader_takes_what_the_loader_takes(tmp_path: Path) -> None:
    # the same file, through the module's numpy-free loader and the numpy readers
    fixed = _fixed()
    path = _write(tmp_path, fixed_json(fixed, {}))
    q = deploy.load_q11(path)
    loaded, _ = load_fixed_json(path)
    assert q.w1 == tuple(loaded.w1.reshape(-1).tolist()) == tuple(fixed.w1.reshape(-1).tolist())
    assert q.b1 == tuple(loaded.b1.tolist()) and q.w2 == tuple(loaded.w2.tolist())
    assert q.b2 == loaded.b2 == fixed.b2
    # Keras' shapes, w2 (10, 1) and b2 (1,), are a model to both
    doc = fixed_json(fixed, {})
    doc.update(w2=[[v] for v in doc["w2"]], b2=[doc["b2"]])
    assert deploy.load_q11(_write(tmp_path, doc, "keras.q11.json")) == q


def test_the_loader_checks_a_model_without_numpy(tmp_path: Path) -> None:
    # kmo_lb's loader runs in the kernel lab, where importing numpy is 20-28x slower:
    # loading (and refusing) a model imports no numpy nor polars
    good = _write(tmp_path, fixed_json(_fixed(), {}))
    bad = _write(tmp_path, {**fixed_json(_fixed(), {}), "b1": [float("nan")] * 10}, "nan.json")
    code = (
        "import sys\n"
        "from kernmlops.lb import deploy\n"
        f"assert len(deploy.load_q11({str(good)!r}).w1) == 150\n"
        "try:\n"
        f"    deploy.load_q11({str(bad)!r})\n"
        "except deploy.KmodError as err:\n"
        "    assert 'b1 holds nan' in str(err), err\n"
        "else:\n"
        "    raise AssertionError('a NaN model was loaded')\n"
        "print(sorted(m for m in ('numpy', 'polars') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_unreadable_models(tmp_path: Path) -> None:
    with pytest.raises(deploy.KmodError, match="not found"):
        deploy.load_q11(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(deploy.KmodError, match="is not a model: not JSON"):
        deploy.load_q11(bad)
    with pytest.raises(deploy.KmodError, match="is a folder, not a model file"):
        deploy.load_q11(tmp_path)


def test_not_a_module(tmp_path: Path) -> None:
    f = tmp_path / "x.ko"
    f.write_bytes(b"\x7fELF not a module")
    with pytest.raises(deploy.KmodError, match="not a kernel module"):
        deploy.vermagic(f)
    assert not deploy.is_current(f, "6.1.0-56-amd64")


@pytest.mark.parametrize("args", [["status"], ["mode", "shadow"], ["undeploy"]])
def test_nothing_loaded_is_one_line(args: list[str]) -> None:
    r = CliRunner().invoke(lb_group, args)
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "kmo_lb is not loaded" in r.stderr


def test_root_loads_no_module_from_a_folder_another_user_can_change(tmp_path: Path) -> None:
    """--ko, --build-dir (or KERNMLOPS_KMOD_DIR) in a folder any user may write in:
    root would insmod (or build with make) what they put there. Refused in one line,
    exit 2, before the kernel's layout is read or anything built."""
    import os
    import shutil
    import tempfile

    from tests.conftest import skip_here

    if os.geteuid() != 0:
        skip_here("not root: the refusal is root's")
    top = Path(tempfile.mkdtemp(prefix="kmo-kmod-"))
    try:
        top.chmod(0o755)
        shared = top / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        (shared / "kmo_lb.ko").write_bytes(b"\x7fELF planted")
        model = tmp_path / "m.q11.json"
        model.write_text(json.dumps(fixed_json(_fixed(), {})))
        for args in (["--ko", str(shared / "kmo_lb.ko")], ["--build-dir", str(shared)]):
            r = CliRunner().invoke(lb_group, ["deploy", str(model), *args])
            assert r.exit_code == 2, r.output
            # the release's folder is not made yet: the one it would be made in is named
            folder, where = (shared, "it") if args[0] == "--ko" else (
                shared / os.uname().release, shared)  # fmt: skip
            assert r.stderr == (
                f"error: the kernel module folder {folder} can be changed by another user "
                f"(any user may write in {where}): as root, kernmlops loads no module (nor "
                "builds one) from it; use a folder only root can change (--build-dir or "
                "KERNMLOPS_KMOD_DIR)\n"
            )
        assert sorted(p.name for p in shared.iterdir()) == ["kmo_lb.ko"]  # nothing built
    finally:
        shutil.rmtree(top, ignore_errors=True)
