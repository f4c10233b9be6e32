"""The model's 171 parameters, printed the way MLLB's ``dump_weights.py`` prints them.

MLLB (Chen et al., APSys'20) pickled Keras' ``get_weights()``: W1 (15, 10),
b1 (10,), W2 (10, 1), b2 (1,), and printed them for pasting into the C
arrays of its kernel patch (``w1[]``, ``b1[]``, ``w2[]``, ``b2[]``). Its second
argument picks one of three layouts:

* ``2`` (its default): each row of W1 on a line of ``% 8f`` values, each
  followed by ``,``; then an empty line; then b1, W2 and b2 each on one line
  of ``%8f, `` values;
* ``1``: each array flattened on one line of ``% 8f`` values ending in ``,``;
* ``0``: each row of W1 as in ``2``, every bias and W2 value on a line of its
  own (as Python prints a float), an empty line after each array.

Both of our model files are read: ``lb train``'s float model and ``lb
export``'s Q20.11 JSON (printed as the floats its integers stand for,
``q / 2048``). Anything that is not exactly 15 x 10 + 10 + 10 x 1 + 1 = 171
finite numbers is refused with one line.

Every reader of a model file checks it here, the same way (``read_model_doc``,
``check_model``): ``lb export``, ``lb shadow``, ``lb report --model`` and
``lb dump-weights``. The format and its version, MLLB's 15 features in order,
Q20.11 for a fixed-point model, the hidden units it states and the weights are
checked. A weight must be a finite number that Q20.11 can hold
(``round(w * 2048)`` an int32, so ``|w| < 2^20``): the kernel computes in
that fixed point, and a NaN model would otherwise score as "always stay".
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernmlops.errors import KernmlopsError
from kernmlops.lb.names import FBITS, FEATURES, NR_FEATURES

HIDDEN = 10
#: 15*10 + 10 + 10*1 + 1
NR_PARAMS = NR_FEATURES * HIDDEN + HIDDEN + HIDDEN + 1
FLOAT_FORMAT = "kernmlops-lb-model"
FIXED_FORMAT = "kernmlops-lb-fixed"
#: the version each format is written in (lb train, lb export), the newest one read
VERSIONS = {FLOAT_FORMAT: 1, FIXED_FORMAT: 1}
LAYOUTS = (0, 1, 2)
INT32 = (-(1 << 31), (1 << 31) - 1)
ONE = 1 << FBITS
#: a model is ~10 KiB of JSON; far more is not a model, and json holds it all in memory
MAX_MODEL_BYTES = 16 << 20


class WeightsError(KernmlopsError):
    """A model file that is not MLLB's 15 -> 10 -> 1 network."""


@dataclass(frozen=True)
class Weights:
    """Keras' shapes: w1 (15, 10), b1 (10,), w2 (10, 1), b2 (1,); float64."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    kind: str  # "float" or "q20.11"

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.w1, self.b1, self.w2, self.b2)

    @property
    def count(self) -> int:
        return sum(a.size for a in self.arrays)


def _shape(value: object) -> tuple[tuple[int, ...], list[object]]:
    """The shape of nested lists and their leaves, in order; ValueError when ragged."""
    if not isinstance(value, list):
        return (), [value]
    parts = [_shape(v) for v in value]
    inner = {p[0] for p in parts}
    if len(inner) > 1:
        raise ValueError("ragged")
    return (len(value), *(inner.pop() if inner else ())), [x for p in parts for x in p[1]]


def _shape_name(shape: tuple[int, ...]) -> str:
    if not shape:
        return "a single number"
    return "x".join(map(str, shape)) + (" number" if shape == (1,) else " numbers")


def _fits_q11(v: float) -> bool:
    """Whether ``round(v * 2048)``, half away from zero as fixed.quantize rounds,
    is an int32."""
    if not abs(v) < 1 << 21:  # far out (or inf): no product to round
        return False
    x = v * ONE
    q = math.floor(x + 0.5) if x >= 0 else math.ceil(x - 0.5)
    return INT32[0] <= q <= INT32[1]


def _array(doc: dict, key: str, shapes: Sequence[tuple[int, ...]], where: str,
           integers: bool, error: type[KernmlopsError]) -> np.ndarray:  # fmt: skip
    """doc[key] as an array of one of ``shapes`` (the first is the one kept):
    int64 for a fixed-point model, float64 for a float one."""
    if key not in doc:
        raise error(f"{where}: no {key} (a model holds w1, b1, w2, b2)")
    want = " or ".join(_shape_name(s) for s in shapes)
    try:
        shape, flat = _shape(doc[key])
    except (ValueError, RecursionError):
        raise error(f"{where}: {key} must be {want}, its rows differ in length") from None
    for v in flat:  # what a value is says more than the shape it came in
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise error(f"{where}: {key} holds {json.dumps(v)[:20]}, not a number")
        if integers and not (isinstance(v, int) and INT32[0] <= v <= INT32[1]):
            raise error(f"{where}: {key} holds {v}, not a Q20.{FBITS} int32")
        try:
            finite = math.isfinite(v)
        except OverflowError:
            finite = False
        if not finite:
            raise error(f"{where}: {key} holds {v}, not a finite number")
        if not integers and not _fits_q11(v):
            raise error(f"{where}: {key} holds {v:g}, outside Q20.{FBITS} fixed point "
                        "(|w| < 2^20), which the kernel computes in")  # fmt: skip
    if shape not in shapes:
        raise error(f"{where}: {key} is {_shape_name(shape)}, must be {want}")
    dtype = np.int64 if integers else np.float64
    return np.asarray(flat, dtype=dtype).reshape(shapes[0])


def check_weights(
    doc: dict[str, Any],
    where: str,
    *,
    fixed: bool,
    hidden: int | None = None,
    error: type[KernmlopsError] = WeightsError,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """w1 (15, hidden), b1 (hidden,), w2 (hidden,) and b2 of a model document,
    each checked: present, of the network's shape, finite numbers that fit
    Q20.11 (``fixed``: the int32 integers of Q20.11). ``hidden`` None takes
    the hidden units from w1. Raises ``error`` with one line naming the file,
    the array and the value."""
    if hidden is None:
        try:
            shape, _ = _shape(doc.get("w1"))
        except (ValueError, RecursionError):
            shape = ()
        hidden = shape[1] if len(shape) == 2 and shape[1] > 0 else HIDDEN
    w1 = _array(doc, "w1", [(NR_FEATURES, hidden)], where, fixed, error)
    b1 = _array(doc, "b1", [(hidden,)], where, fixed, error)
    w2 = _array(doc, "w2", [(hidden, 1), (hidden,)], where, fixed, error)
    b2 = _array(doc, "b2", [(1,), ()], where, fixed, error)
    return w1, b1, w2.reshape(-1), b2.reshape(-1)[0].item()


def check_model(
    doc: dict[str, Any],
    where: str,
    *,
    hidden: int | None = None,
    error: type[KernmlopsError] = WeightsError,
) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray, float]:
    """Every reader's check of a model document, ``lb train``'s float model or ``lb
    export``'s Q20.11 JSON: a format this kernmlops knows in a version not newer than
    its own, MLLB's 15 features in order, Q20.11 (fixed point), the weights
    (:func:`check_weights`) and the hidden units the file states. Returns whether it
    is fixed point, and w1, b1, w2, b2; raises ``error`` with one line naming ``where``."""
    kind = doc.get("format")
    if kind not in VERSIONS:
        raise error(f"{where} is not a kernmlops lb model (format {FLOAT_FORMAT} from lb "
                    f"train or {FIXED_FORMAT} from lb export)")  # fmt: skip
    version = doc.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version > VERSIONS[kind]:
        raise error(f"{where} is from a newer kernmlops (model version {version})")
    if doc.get("features", []) != list(FEATURES):
        raise error(f"{where}: features differ from MLLB's 15")
    fixed = kind == FIXED_FORMAT
    if fixed and doc.get("fbits") != FBITS:
        raise error(f"{where}: Q20.{doc.get('fbits')} model, expected Q20.{FBITS}")
    w1, b1, w2, b2 = check_weights(doc, where, fixed=fixed, hidden=hidden, error=error)
    stated = doc.get("hidden", len(b1))
    if stated != len(b1):
        raise error(f"{where}: hidden is {stated!r}, but w1 has {len(b1)} columns")
    return fixed, w1, b1, w2, b2


def read_model_doc(path: Path, error: type[KernmlopsError] = WeightsError) -> dict[str, Any]:
    """A model file's JSON object (at most MAX_MODEL_BYTES); ``error`` with one
    line when it is missing, a folder, too large or not a JSON object."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_MODEL_BYTES + 1)
        if len(raw) > MAX_MODEL_BYTES:
            raise error(f"{path} is over {MAX_MODEL_BYTES >> 20} MiB: not a model file "
                        "(lb train and lb export write ~10 KiB)")  # fmt: skip
        doc = json.loads(raw)
    except FileNotFoundError:
        raise error(f"model {path} not found") from None
    except IsADirectoryError:
        raise error(f"{path} is a folder, not a model file") from None
    except OSError as err:
        raise error(f"cannot read model {path}: {err.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise error(f"{path} is not a model: not JSON (lb train and lb export write "
                    "JSON)") from None  # fmt: skip
    if not isinstance(doc, dict):
        raise error(f"{path} is not a model: not a JSON object (lb train and lb export "
                    "write one)")  # fmt: skip
    return doc


def read_weights(path: Path) -> Weights:
    """W1, b1, W2, b2 of ``lb train``'s model or ``lb export``'s ``*.q11.json``."""
    path = Path(path)
    # MLLB's network exactly: 10 hidden units, what its patch's arrays hold
    fixed, w1, b1, w2, b2 = check_model(read_model_doc(path), str(path), hidden=HIDDEN)
    scale = float(ONE) if fixed else 1.0
    w = Weights(w1 / scale, b1 / scale, w2.reshape(HIDDEN, 1) / scale,
                np.array([b2], dtype=np.float64) / scale,
                "q20.11" if fixed else "float")  # fmt: skip
    assert w.count == NR_PARAMS  # the shapes above are the network's
    return w


def _row(values: np.ndarray) -> str:
    return ", ".join(f"{float(v): 8f}" for v in values) + ","


def dump(weights: Weights, layout: int = 2) -> str:
    """The text MLLB's ``dump_weights.py TAG LAYOUT`` prints for these weights."""
    if layout not in LAYOUTS:
        raise WeightsError(f"layout {layout}: one of {', '.join(map(str, LAYOUTS))}")
    lines: list[str] = []
    for arr in weights.arrays:
        if layout == 1:
            lines.append(_row(arr.reshape(-1)))
        elif layout == 0:
            # rows of 2-D arrays as value lines (W2's rows hold one value);
            # a 1-D array's entries are numbers, printed one per line
            lines += [_row(r) for r in arr] if arr.ndim == 2 else [repr(float(v)) for v in arr]
            lines.append("")
        else:
            # a row of more than one value is a line; single values share one line
            line, out = "", []
            for r in arr:
                if arr.ndim == 2 and len(r) > 1:
                    out.append(_row(r))
                else:
                    line += f"{float(r[0] if arr.ndim == 2 else r):8f}, "
            lines += [*out, line]
    return "\n".join(lines) + "\n"
