"""``lb dump-weights``: the 171 parameters as MLLB's dump_weights.py prints
them, read back and checked against the model's own arrays; wrong models are
one error line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kernmlops.lb.cli import lb_group
from kernmlops.lb.fixed import FixedModel, fixed_json
from kernmlops.lb.model import Model

# MLLB's value formats: "% 8f" in rows (a space for the sign), "%8f, " for single values
ROW_VALUE = r"(?: |-)\d+\.\d{6}"


def _invoke(*args: object):
    return CliRunner().invoke(lb_group, [str(a) for a in args], catch_exceptions=False)


def _known_model() -> Model:
    """Values whose printed form is known by hand: w1[i][j] = (10 i + j) / 100 - 0.5."""
    w1 = (np.arange(150).reshape(15, 10) / 100.0) - 0.5
    b1 = np.arange(1, 11) / 10.0
    w2 = -np.arange(1, 11) / 8.0
    return Model(w1=w1, b1=b1, w2=w2, b2=0.25, meta={})


def _random_model(seed: int = 3) -> Model:
    rng = np.random.default_rng(seed)
    return Model(w1=rng.normal(0, 0.8, (15, 10)), b1=rng.normal(0, 0.5, 10),
                 w2=rng.normal(0, 0.8, 10), b2=float(rng.normal()), meta={})  # fmt: skip


def _numbers(line: str) -> list[float]:
    return [float(v) for v in line.rstrip().rstrip(",").split(",")]


def test_layout_2_is_mllbs_text(tmp_path: Path) -> None:
    path = _known_model().save(tmp_path / "m.json")
    r = _invoke("dump-weights", path)
    assert r.exit_code == 0, r.output
    lines = r.stdout.split("\n")
    assert lines[0] == ("-0.500000, -0.490000, -0.480000, -0.470000, -0.460000, -0.450000, "
                        "-0.440000, -0.430000, -0.420000, -0.410000,")  # fmt: skip
    assert lines[14] == (" 0.900000,  0.910000,  0.920000,  0.930000,  0.940000,  0.950000, "
                         " 0.960000,  0.970000,  0.980000,  0.990000,")  # fmt: skip
    assert lines[15] == ""  # the empty line after W1
    assert lines[16] == ("0.100000, 0.200000, 0.300000, 0.400000, 0.500000, 0.600000, "
                         "0.700000, 0.800000, 0.900000, 1.000000, ")  # fmt: skip
    assert lines[17] == ("-0.125000, -0.250000, -0.375000, -0.500000, -0.625000, -0.750000, "
                         "-0.875000, -1.000000, -1.125000, -1.250000, ")  # fmt: skip
    assert lines[18] == "0.750000, "  # b2 0.25 + MLLB's threshold 0.5
    assert lines[19:] == [""]  # ends with its newline
    assert "float model, 171 parameters" in r.stderr


def test_float_model_reads_back_as_its_arrays(tmp_path: Path) -> None:
    m = _random_model()
    path = m.save(tmp_path / "m.json")
    r = _invoke("dump-weights", path)
    assert r.exit_code == 0, r.output
    lines = r.stdout.split("\n")
    for line in lines[:15]:
        assert re.fullmatch(rf"{ROW_VALUE}(?:, {ROW_VALUE})*,", line), line
    w1 = np.array([_numbers(x) for x in lines[:15]])
    np.testing.assert_allclose(w1, m.w1, atol=5e-7, rtol=0)
    np.testing.assert_allclose(_numbers(lines[16]), m.b1, atol=5e-7, rtol=0)
    np.testing.assert_allclose(_numbers(lines[17]), m.w2, atol=5e-7, rtol=0)
    np.testing.assert_allclose(_numbers(lines[18]), [m.b2 + 0.5], atol=5e-7, rtol=0)
    assert sum(len(_numbers(x)) for x in lines[:15] + lines[16:19]) == 171


def test_q11_json_prints_the_floats_of_its_integers(tmp_path: Path) -> None:
    fixed = FixedModel.from_model(_random_model(5))
    path = tmp_path / "m.q11.json"
    path.write_text(json.dumps(fixed_json(fixed, {"migration_cost_ns": 500_000})))
    r = _invoke("dump-weights", path, "--layout", "1")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert [len(_numbers(x)) for x in lines] == [150, 10, 10, 1]
    # six decimals are finer than 1/2048: every integer comes back exactly
    q = [np.rint(np.array(_numbers(x)) * 2048).astype(np.int64) for x in lines]
    np.testing.assert_array_equal(q[0], fixed.w1.reshape(-1))  # row-major: feature by feature
    np.testing.assert_array_equal(q[1], fixed.b1)
    np.testing.assert_array_equal(q[2], fixed.w2)
    assert q[3].tolist() == [fixed.b2 + 1024]  # + 0.5, MLLB's threshold
    assert "q20.11 model, 171 parameters" in r.stderr


def test_layout_0_one_bias_a_line(tmp_path: Path) -> None:
    m = _known_model()
    r = _invoke("dump-weights", m.save(tmp_path / "m.json"), "--layout", "0")
    assert r.exit_code == 0, r.output
    lines = r.stdout.split("\n")
    # W1 15 rows, "", b1 10 values, "", W2 10 rows of one, "", b2, "", and the final newline
    assert len(lines) == 15 + 1 + 10 + 1 + 10 + 1 + 1 + 1 + 1
    assert lines[15] == lines[26] == lines[37] == lines[39] == ""
    assert [float(x) for x in lines[16:26]] == m.b1.tolist()
    assert lines[27:37] == [f"{-k / 8:.6f}," for k in range(1, 11)]
    assert lines[38] == "0.75"  # b2 + 0.5


def test_pasted_arrays_decide_as_the_model(tmp_path: Path) -> None:
    """The printed arrays, evaluated as MLLB's patch evaluates its w1..b2 (float
    mode of jc_mlp.c, kmod/jc_kmod.c: relu(x W1 + b1) W2 + b2, migrate when
    output > 0.5), decide as the model does (logit > 0). With b2 printed as it
    is, every row whose logit lies in (0, 0.5] turned to "stay"."""
    m = _random_model(11)
    r = _invoke("dump-weights", m.save(tmp_path / "m.json"))
    assert r.exit_code == 0, r.output
    lines = r.stdout.split("\n")
    w1 = np.array([_numbers(x) for x in lines[:15]])
    b1, w2, b2 = (np.array(_numbers(lines[i])) for i in (16, 17, 18))
    rng = np.random.default_rng(4)
    x = rng.normal(0, 1, (4000, 15))
    logit = np.maximum(x @ m.w1 + m.b1, 0) @ m.w2 + m.b2
    mllb_out = np.maximum(x @ w1 + b1, 0) @ w2 + b2[0]
    clear = np.abs(logit) > 1e-3  # six printed decimals move the output by < 1e-3
    assert ((logit > 0) & (logit <= 0.5) & clear).sum() > 100  # rows the threshold decides
    np.testing.assert_array_equal((mllb_out > 0.5)[clear], (logit > 0)[clear])


def _doc(tmp_path: Path, **change) -> Path:
    doc = _random_model().to_json()
    doc.update(change)
    for key in [k for k, v in change.items() if v is None]:
        del doc[key]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"w1": [[0.1] * 9] * 15}, "w1 is 15x9 numbers, must be 15x10 numbers"),
        ({"w1": [[0.1] * 10] * 14}, "w1 is 14x10 numbers, must be 15x10 numbers"),
        ({"w1": [[0.1] * 10] * 14 + [[0.1] * 9]}, "w1 must be 15x10 numbers, its rows differ"),
        ({"b1": [0.0] * 9}, "b1 is 9 numbers, must be 10 numbers"),
        ({"w2": [[0.0, 1.0]] * 10}, "w2 is 10x2 numbers, must be 10x1 numbers or 10 numbers"),
        ({"b2": [0.1, 0.2]}, "b2 is 2 numbers, must be 1 number or a single number"),
        ({"b2": None}, "no b2 (a model holds w1, b1, w2, b2)"),
        ({"b1": [0.0] * 9 + ["x"]}, 'b1 holds "x", not a number'),
        # a long string is cut inside its quotes, which stay balanced
        ({"b1": [0.0] * 9 + ["-0.89641234567890123456"]}, 'b1 holds "-0.89641234567890…", not a'),
        ({"w2": [{"w": "-0.89641234567890123456"}] * 10}, "w2 holds an object, not a number"),
        ({"b1": [0.0] * 9 + [True]}, "b1 holds true, not a number"),
        ({"format": "something"}, "is not a kernmlops lb model"),
    ],
)
def test_wrong_models_are_one_error_line(tmp_path: Path, change: dict, message: str) -> None:
    r = _invoke("dump-weights", _doc(tmp_path, **change))
    assert r.exit_code == 2
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error:"), r.stderr
    assert message in r.stderr


def test_unreadable_and_non_finite_models(tmp_path: Path) -> None:
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(_random_model().to_json()).replace('"b2": ', '"b2": NaN, "x": '))
    missing, binary = tmp_path / "none.json", tmp_path / "bin.json"
    binary.write_bytes(b"\x00\xff\xfe" * 10)
    q11 = tmp_path / "m.q11.json"
    doc = fixed_json(FixedModel.from_model(_random_model()), {})
    q11.write_text(json.dumps({**doc, "b2": 0.5}))
    big = tmp_path / "big.q11.json"
    big.write_text(json.dumps({**doc, "b2": 1 << 40}))
    # past Python's 4300-digit int parsing limit: json.loads raises a plain ValueError
    digits = tmp_path / "digits.json"
    digits.write_text('{"b2": ' + "9" * 5000 + "}")
    for path, message in [
        (nan, "b2 holds nan, not a finite number"),
        (missing, "not found"),
        (binary, "not JSON"),
        (digits, "not JSON"),
        (tmp_path, "is a folder"),
        (q11, "b2 holds 0.5, not a Q20.11 int32"),
        (big, f"b2 holds {1 << 40}, not a Q20.11 int32"),
    ]:
        r = _invoke("dump-weights", path)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
        assert message in r.stderr, r.stderr


# --- every command that reads a model refuses bad weights in one line ------------------


def _bad(tmp_path: Path, fixed: bool, key: str, value: object) -> Path:
    """A model of either kind with one weight set to ``value`` (None: no ``key``)."""
    m = _random_model()
    doc = fixed_json(FixedModel.from_model(m), {}) if fixed else m.to_json()
    if value is None:
        del doc[key]
    elif key == "b2":
        doc[key] = value
    else:
        doc[key] = np.asarray(doc[key]).tolist()
        flat = doc[key][3] if key == "w1" else doc[key]
        flat[2] = value
    path = tmp_path / ("bad.q11.json" if fixed else "bad.json")
    path.write_text(json.dumps(doc))  # NaN and Infinity as Python's json writes them
    return path


BAD_FLOATS = [
    ("w1", float("nan"), "w1 holds nan, not a finite number"),
    ("b1", float("inf"), "b1 holds inf, not a finite number"),
    ("b2", float("-inf"), "b2 holds -inf, not a finite number"),
    ("w2", 1e300, "w2 holds 1e+300, outside Q20.11 fixed point (|w| < 2^20)"),
    ("w1", 2.0**20, "w1 holds 1.04858e+06, outside Q20.11 fixed point"),
    ("w1", None, "no w1 (a model holds w1, b1, w2, b2)"),
]
BAD_FIXED = [
    ("w1", float("nan"), "w1 holds nan, not a Q20.11 int32"),
    ("b2", 1 << 31, f"b2 holds {1 << 31}, not a Q20.11 int32"),
    ("w1", None, "no w1 (a model holds w1, b1, w2, b2)"),
]
COMMANDS = {
    "export": lambda m, d: ["export", m, "-o", d / "out"],
    "shadow": lambda m, d: ["shadow", m, "-o", d / "data", "--no-progress", "--", "true"],
    "report": lambda m, d: ["report", d / "no-data-needed", "--model", m],
    "dump-weights": lambda m, d: ["dump-weights", m],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(("key", "value", "message"), BAD_FLOATS)
def test_bad_float_weights_are_one_line_in_every_command(
    tmp_path: Path, command: str, key: str, value: object, message: str
) -> None:
    args = COMMANDS[command](_bad(tmp_path, False, key, value), tmp_path)
    r = CliRunner().invoke(lb_group, [str(a) for a in args])
    assert r.exit_code == 2, r.output
    assert r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("error:"), r.stderr
    assert message in r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("command", ["shadow", "dump-weights"])
@pytest.mark.parametrize(("key", "value", "message"), BAD_FIXED)
def test_bad_fixed_point_weights_are_one_line(
    tmp_path: Path, command: str, key: str, value: object, message: str
) -> None:
    args = COMMANDS[command](_bad(tmp_path, True, key, value), tmp_path)
    r = CliRunner().invoke(lb_group, [str(a) for a in args])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert message in r.stderr


# what a model file says of itself: the same check in every reader (check_model)
BAD_HEADERS = [
    ({"features": 3}, "features differ from MLLB's 15"),
    ({"features": None}, "features differ from MLLB's 15"),
    ({"version": 99}, "is from a newer kernmlops (model version 99)"),
    ({"hidden": 7}, "hidden is 7, but w1 has 10 columns"),
]


def _with(tmp_path: Path, fixed: bool, change: dict) -> Path:
    m = _random_model()
    doc = fixed_json(FixedModel.from_model(m), {}) if fixed else m.to_json()
    doc.update(change)
    for key in [k for k, v in change.items() if v is None]:
        del doc[key]
    path = tmp_path / ("bad.q11.json" if fixed else "bad.json")
    path.write_text(json.dumps(doc))
    return path


def _refused_in_one_line(args: list, message: str) -> None:
    r = CliRunner().invoke(lb_group, [str(a) for a in args])
    assert r.exit_code == 2, r.output
    assert r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("error:"), r.stderr
    assert message in r.stderr


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(("change", "message"), BAD_HEADERS)
def test_a_float_model_is_checked_alike_by_every_command(
    tmp_path: Path, command: str, change: dict, message: str
) -> None:
    # dump-weights printed a model with features: 3 that lb export refused
    _refused_in_one_line(COMMANDS[command](_with(tmp_path, False, change), tmp_path), message)
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("command", ["shadow", "dump-weights"])
@pytest.mark.parametrize(
    ("change", "message"), [*BAD_HEADERS, ({"fbits": 12}, "Q20.12 model, expected Q20.11")]
)
def test_a_fixed_point_model_is_checked_alike_by_every_command(
    tmp_path: Path, command: str, change: dict, message: str
) -> None:
    _refused_in_one_line(COMMANDS[command](_with(tmp_path, True, change), tmp_path), message)


def test_an_all_nan_model_is_not_scored_as_always_stay(tmp_path: Path) -> None:
    from kernmlops.lb.dataset import synthetic_decisions, write_decisions

    data = tmp_path / "data"
    frame = synthetic_decisions(300, "syn-0", seed=1)
    write_decisions(frame, data, "syn-0", "synthetic", {"lb": {"variant": "synthetic"}})
    doc = _random_model().to_json()
    doc.update(w1=[[float("nan")] * 10] * 15, b1=[float("nan")] * 10)
    model = tmp_path / "nan.json"
    model.write_text(json.dumps(doc))
    r = CliRunner().invoke(lb_group, ["report", str(data), "--model", str(model)])
    assert r.exit_code == 2 and r.stderr == f"error: {model}: w1 holds nan, not a finite number\n"
    good = _random_model().save(tmp_path / "good.json")
    r = CliRunner().invoke(lb_group, ["report", str(data), "--model", str(good)])
    assert r.exit_code == 0, r.output


def test_the_q11_range_is_the_one_quantize_keeps() -> None:
    # the check on load and fixed.quantize agree on every value at the edges of Q20.11
    from kernmlops.lb.fixed import quantize
    from kernmlops.lb.weights import WeightsError, check_weights

    top = 2.0**20
    for v in (top - 1, top - 0.25 / 2048, top - 0.5 / 2048, top - 0.75 / 2048, top,
              -top, -top - 0.25 / 2048, -top - 0.5 / 2048, -top - 1 / 2048, 1e300):  # fmt: skip
        doc = _random_model().to_json()
        doc["b2"] = v
        try:
            quantize(np.array([v]))
            fits = True
        except ValueError:
            fits = False
        try:
            check_weights(doc, "m", fixed=False)
            accepted = True
        except WeightsError:
            accepted = False
        assert accepted == fits, v


def test_a_huge_model_file_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse
    r = _invoke("dump-weights", big)
    assert r.exit_code == 2 and "is over 16 MiB: not a model file" in r.stderr


def _wide_model(w1_src_len: float, w2_0: float) -> Model:
    """Zeros but for the src_len input of hidden unit 0 and that unit's output weight."""
    w1, w2 = np.zeros((15, 10)), np.zeros(10)
    w1[8, 0], w2[0] = w1_src_len, w2_0
    return Model(w1=w1, b1=np.zeros(10), w2=w2, b2=0.0, meta={})


def test_weights_whose_sums_overflow_64_bits_are_refused(tmp_path: Path) -> None:
    """Each weight fits Q20.11 (|w| < 2^20), yet on a runqueue of 10 tasks unit 0 is
    (10 - 2) * (2^31 - 1) in Q20.11 and its product with w2 passes 2^63: the int64
    forward pass (fixed.py, the header, BPF, kmo_lb) wrapped to -16,777,216, "stay",
    where the model says "migrate"."""
    big = (2**31 - 1) / 2048  # the largest Q20.11 weight
    fixed = FixedModel.from_model(_wide_model(big, big))
    x = np.zeros((1, 15), dtype=np.int64)
    x[0, 8] = (10 - 2) << 11
    h = ((10 - 2) << 11) * (2**31 - 1) >> 11  # Python's ints do not wrap
    assert (h * (2**31 - 1)) >> 11 > 0  # the model's answer: migrate
    with np.errstate(over="ignore"):
        assert int(fixed.output(x)[0]) == -16_777_216  # what 64 bits made of it
    for doc, name in ((_wide_model(big, big).to_json(), "m.json"),
                      (fixed_json(fixed, {}), "m.q11.json")):  # fmt: skip
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        for args in (["dump-weights", path], ["export", path, "-o", tmp_path / "out"]):
            if name.endswith("q11.json") and args[0] == "export":
                continue  # export takes lb train's model
            _refused_in_one_line(args, "overflow the 64-bit sums of the forward pass")
    # large weights that stay below 2^63 on every input are kept: 2000 x 1000 ...
    ok = _wide_model(2000.0, 1000.0).save(tmp_path / "ok.json")
    assert _invoke("dump-weights", ok).exit_code == 0
    # ... the bound: (2^20 - 1) << 11 inputs times w1 shifted, times w2, within 2^63
    assert ((2**20 - 1) << 11) * (2000 * 2048) >> 11 < 2**63 // (1000 * 2048)
