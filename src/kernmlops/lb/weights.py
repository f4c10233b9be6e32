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
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernmlops.errors import KernmlopsError
from kernmlops.lb.names import FBITS, NR_FEATURES

HIDDEN = 10
#: 15*10 + 10 + 10*1 + 1
NR_PARAMS = NR_FEATURES * HIDDEN + HIDDEN + HIDDEN + 1
FLOAT_FORMAT = "kernmlops-lb-model"
FIXED_FORMAT = "kernmlops-lb-fixed"
LAYOUTS = (0, 1, 2)
INT32 = (-(1 << 31), (1 << 31) - 1)


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


def _array(doc: dict, key: str, shapes: Sequence[tuple[int, ...]], where: str,
           integers: bool) -> np.ndarray:  # fmt: skip
    """doc[key] as a float array of one of ``shapes`` (the first is the one kept)."""
    if key not in doc:
        raise WeightsError(f"{where}: no {key} (a model holds w1, b1, w2, b2)")
    want = " or ".join(_shape_name(s) for s in shapes)
    try:
        shape, flat = _shape(doc[key])
    except (ValueError, RecursionError):
        raise WeightsError(f"{where}: {key} must be {want}, its rows differ in length") from None
    if shape not in shapes:
        raise WeightsError(f"{where}: {key} is {_shape_name(shape)}, must be {want}")
    for v in flat:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise WeightsError(f"{where}: {key} holds {json.dumps(v)[:20]}, not a number")
        if integers and not (isinstance(v, int) and INT32[0] <= v <= INT32[1]):
            raise WeightsError(f"{where}: {key} holds {v}, not a Q20.{FBITS} int32")
        try:
            finite = math.isfinite(v)
        except OverflowError:
            finite = False
        if not finite:
            raise WeightsError(f"{where}: {key} holds {v}, not a finite number")
    return np.asarray(flat, dtype=np.float64).reshape(shapes[0])


def read_weights(path: Path) -> Weights:
    """W1, b1, W2, b2 of ``lb train``'s model or ``lb export``'s ``*.q11.json``."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise WeightsError(f"model {path} not found") from None
    except IsADirectoryError:
        raise WeightsError(f"{path} is a folder, not a model file") from None
    except OSError as err:
        raise WeightsError(f"cannot read model {path}: {err.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise WeightsError(f"{path} is not a model: not JSON (lb train and lb export write "
                           "JSON)") from None  # fmt: skip
    kind = doc.get("format") if isinstance(doc, dict) else None
    if kind not in (FLOAT_FORMAT, FIXED_FORMAT):
        raise WeightsError(f"{path} is not a kernmlops lb model (format {FLOAT_FORMAT} from lb "
                           f"train or {FIXED_FORMAT} from lb export)")  # fmt: skip
    fixed = kind == FIXED_FORMAT
    if fixed and doc.get("fbits") != FBITS:
        raise WeightsError(f"{path}: Q20.{doc.get('fbits')} model, expected Q20.{FBITS}")
    where = str(path)
    w1 = _array(doc, "w1", [(NR_FEATURES, HIDDEN)], where, fixed)
    b1 = _array(doc, "b1", [(HIDDEN,)], where, fixed)
    w2 = _array(doc, "w2", [(HIDDEN, 1), (HIDDEN,)], where, fixed)
    b2 = _array(doc, "b2", [(1,), ()], where, fixed)
    scale = float(1 << FBITS) if fixed else 1.0
    w = Weights(w1 / scale, b1 / scale, w2 / scale, b2 / scale, "q20.11" if fixed else "float")
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
