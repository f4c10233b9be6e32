"""``lb deploy`` and friends on this machine (no kprobes: the module never
loads here; tests/lb/test_kmod_lab.py loads it in the lab): the model check
before anything touches the kernel, the module's parameter layout, and the
one-line errors when no module is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kernmlops.lb import deploy
from kernmlops.lb.cli import lb_group
from kernmlops.lb.fixed import FixedModel, fixed_json
from kernmlops.lb.model import Model

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
        ({"fbits": 12}, "the module computes Q20.11, the model Q20.12"),
        ({"hidden": 9}, "the model has 9 hidden units"),
        ({"b1": [0] * 9}, "b1 must hold 10 values, has 9"),
        ({"w2": [0.5] * 10}, "w2 must hold integers"),
        ({"b2": 1 << 31}, "b2 must be one int32"),
        ({"w1": [[0] * 10] * 14}, "w1 must be 15 rows of 10"),
        ({"w1": [[0] * 10] * 14 + [[0] * 11]}, "row 14: w1 must hold 10 values, has 11"),
    ],
)
def test_wrong_models_are_refused_before_the_kernel(tmp_path: Path, change: dict,
                                                    message: str) -> None:  # fmt: skip
    doc = {**fixed_json(_fixed(), {}), **change}
    path = _write(tmp_path, doc)
    with pytest.raises(deploy.KmodError, match=message):
        deploy.load_q11(path)
    # the CLI says it in one line and exits 2, whatever the mode
    r = CliRunner().invoke(lb_group, ["deploy", str(path), "--mode", "replace"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and message in r.stderr


def test_features_in_another_order_are_refused(tmp_path: Path) -> None:
    doc = fixed_json(_fixed(), {})
    doc["features"] = list(reversed(doc["features"]))
    with pytest.raises(deploy.KmodError, match="not MLLB's 15 in kmo_lb's order"):
        deploy.load_q11(_write(tmp_path, doc))


def test_unreadable_models(tmp_path: Path) -> None:
    with pytest.raises(deploy.KmodError, match="not found"):
        deploy.load_q11(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(deploy.KmodError, match="is not JSON"):
        deploy.load_q11(bad)


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
