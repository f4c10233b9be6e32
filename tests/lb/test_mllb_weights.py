"""``lb import-weights``: MLLB's own model from the C arrays of its patch or its
dump_weights.py text, checked against MLLB's forward pass computed here by hand
(float: relu(x W1 + b1) W2 + b2 > 0.5; fixed: its ftod rounding, per-product
shifts, > ftod(0.5))."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kernmlops.lb.cli import lb_group
from kernmlops.lb.fixed import FixedModel
from kernmlops.lb.mllb_weights import parse
from kernmlops.lb.model import Model, ModelError


def _invoke(*args: object):
    return CliRunner().invoke(lb_group, [str(a) for a in args], catch_exceptions=False)


def _mllb_arrays(seed: int = 2) -> dict[str, np.ndarray]:
    """Weights as MLLB's files hold them: six decimals, b2 near its 0.5 threshold."""
    rng = np.random.default_rng(seed)
    return {
        "w1": np.round(rng.normal(0, 0.6, 150), 6),
        "b1": np.round(rng.normal(0, 0.4, 10), 6),
        "w2": np.round(rng.normal(0, 0.6, 10), 6),
        "b2": np.round(rng.normal(0.5, 0.2, 1), 6),
    }


def _c_source(a: dict[str, np.ndarray], wrap: str = "ftod") -> str:
    """The arrays in the form of MLLB's jc_mlp.c (values in ftod(...)), after a
    commented-out model of other sizes, as its kmod/c_mlp.h keeps one."""

    def body(v: np.ndarray) -> str:
        return ", ".join(f"{wrap}({x:f})" if wrap else f"{x:f}" for x in v)

    old = "/*\ndtype w1[] = { 1.0, 2.0 };\ndtype b2[] = {0};\n*/\n"
    arrays = "\n".join(
        f"dtype {n}[] = {{\n    {body(a[n])},\n}};" for n in ("w1", "b1", "w2", "b2")
    )
    return f'#include "jc_mlp.h"\n#define ftod(F) ftodtype(F)\n{old}{arrays}\n// w1[] = {{ 9 }};\n'


def _features(n: int, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2, (n, 15)).astype(np.float64)
    x[:, 8] = rng.integers(-2, 8, n)  # src_len - 2
    x[:, 9:11] = rng.integers(0, 4000, (n, 2)) / 1000  # loads / 1000
    x[:, 11] = rng.integers(0, 8, n)
    x[:, 12] = rng.integers(-50, 51, n) / 50  # delta_faults / total_faults
    return x


def test_c_arrays_decide_as_mllbs_float_patch(tmp_path: Path) -> None:
    a = _mllb_arrays()
    src = tmp_path / "jc_mlp.c"
    src.write_text(_c_source(a))
    out = tmp_path / "mllb-model.json"
    r = _invoke("import-weights", src, "-o", out)
    assert r.exit_code == 0, r.output
    m = Model.load(out)
    np.testing.assert_array_equal(m.w1.reshape(-1), a["w1"])  # w1[feature * 10 + hidden]
    np.testing.assert_array_equal(m.b1, a["b1"])
    np.testing.assert_array_equal(m.w2, a["w2"])
    assert m.b2 == pytest.approx(a["b2"][0] - 0.5, abs=1e-12)
    assert m.meta["migration_cost_ns"] == 500_000  # MLLB's prep.py
    x = _features(5000)
    mllb_out = np.maximum(x @ a["w1"].reshape(15, 10) + a["b1"], 0) @ a["w2"] + a["b2"][0]
    clear = np.abs(mllb_out - 0.5) > 1e-9
    assert ((mllb_out > 0) & (mllb_out <= 0.5)).sum() > 100  # rows a threshold of 0 gets wrong
    np.testing.assert_array_equal(m.predict(x)[clear], (mllb_out > 0.5)[clear])


def test_exported_fixed_point_is_mllbs_fixed_point(tmp_path: Path) -> None:
    """Imported, then quantized as lb export does: the decisions of MLLB's
    CONFIG_JC_SCHED_FXDPT patch on its own arrays, worked out here."""
    a = _mllb_arrays(3)
    m = parse(_c_source(a), "jc_mlp.c")
    fixed = FixedModel.from_model(m)

    def ftod(v: np.ndarray) -> np.ndarray:  # (s32)(F * 2048 + (F >= 0 ? 0.5 : -0.5))
        return np.trunc(v * 2048 + np.where(v >= 0, 0.5, -0.5)).astype(np.int64)

    w1, b1, w2, b2 = (ftod(a[n]) for n in ("w1", "b1", "w2", "b2"))
    xq = np.rint(_features(5000, 6) * 2048).astype(np.int64)
    h = np.maximum(((xq[:, :, None] * w1.reshape(15, 10)[None]) >> 11).sum(axis=1) + b1, 0)
    out = ((h * w2) >> 11).sum(axis=1) + b2[0]
    np.testing.assert_array_equal(fixed.predict(xq), (out > 1024).astype(np.int8))
    np.testing.assert_array_equal(fixed.output(xq), out - 1024)


def test_dump_weights_text_round_trip(tmp_path: Path) -> None:
    """Our model printed as MLLB's text (b2 + 0.5) and read back: the same model."""
    rng = np.random.default_rng(8)
    m = Model(w1=rng.normal(0, 0.5, (15, 10)), b1=rng.normal(0, 0.5, 10),
              w2=rng.normal(0, 0.5, 10), b2=-0.3, meta={})  # fmt: skip
    for layout in ("0", "1", "2"):
        r = _invoke("dump-weights", m.save(tmp_path / "m.json"), "--layout", layout)
        assert r.exit_code == 0, r.output
        text = tmp_path / f"weights{layout}.txt"
        text.write_text(r.stdout)
        back = parse(text.read_text(), str(text))
        np.testing.assert_allclose(back.w1, m.w1, atol=5e-7, rtol=0)
        np.testing.assert_allclose(back.w2, m.w2, atol=5e-7, rtol=0)
        assert back.b2 == pytest.approx(-0.3, abs=5e-7)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("dtype w1[] = {1.0};\ndtype b1[] = {0};", "no w2, b2 array"),
        ("dtype w1[] = {1.0};\ndtype b1[] = {0};\ndtype w2[] = {0};\ndtype b2[] = {0};",
         "w1[] holds 1 numbers, MLLB's network 150"),
        ("0.5, " * 170, "170 numbers, MLLB's weights are 171"),
        ("nothing here", "0 numbers, MLLB's weights are 171"),
    ],
)  # fmt: skip
def test_not_mllbs_weights_is_one_line(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "w.txt"
    path.write_text(text)
    r = _invoke("import-weights", path, "-o", tmp_path / "m.json")
    assert r.exit_code == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "m.json").exists()
    with pytest.raises(ModelError):
        parse(text, "w.txt")


def test_a_fifo_or_a_missing_file_is_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.c"
    os.mkfifo(fifo)  # no writer: a plain open would wait for ever
    for path, why in ((fifo, "not a plain file"), (tmp_path / "none.c", "not found")):
        r = _invoke("import-weights", path, "-o", tmp_path / "m.json")
        assert r.exit_code == 2 and why in r.stderr, r.output
