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

b2 is printed raised by 0.5, as the exported header's ``b2[]``: MLLB's network
ends in a linear unit trained as a probability, and its patch (``jc_mlp.c``,
like ``kmod/c_mlp.h``) migrates when ``output > 0.5``; ours ends in a logit and
migrates when it is above 0. With b2 as it is, the pasted arrays would move
the threshold to a logit of 0.5 and turn over every decision in between.

Every reader of a model file checks it the same way, with
:mod:`kernmlops.lb.modelfile` (``read_model_doc``, ``check_model_doc``: plain
lists, no numpy, so ``lb deploy``'s loader makes the same check in the lab);
:func:`check_model` here makes numpy arrays of what passed, for ``lb export``,
``lb shadow``, ``lb report --model`` and ``lb dump-weights``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernmlops.errors import KernmlopsError
from kernmlops.lb.modelfile import (
    FIXED_FORMAT,
    FLOAT_FORMAT,
    HIDDEN,
    NR_PARAMS,
    ONE,
    VERSIONS,
    CheckedModel,
    WeightsError,
    check_model_doc,
    check_weights_doc,
    read_model_doc,
)

__all__ = [
    "FIXED_FORMAT",
    "FLOAT_FORMAT",
    "HIDDEN",
    "LAYOUTS",
    "MLLB_THRESHOLD",
    "NR_PARAMS",
    "VERSIONS",
    "Weights",
    "WeightsError",
    "check_model",
    "check_weights",
    "dump",
    "mllb_arrays",
    "read_model_doc",
    "read_weights",
]

LAYOUTS = (0, 1, 2)


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


def _arrays(checked: CheckedModel) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """w1 (15, hidden), b1 and w2 (hidden,) as arrays (int64 for a fixed-point model,
    float64 for a float one) and b2."""
    dtype = np.int64 if checked.fixed else np.float64
    w1 = np.asarray(checked.w1, dtype=dtype).reshape(-1, checked.hidden)
    b1 = np.asarray(checked.b1, dtype=dtype)
    w2 = np.asarray(checked.w2, dtype=dtype)
    return w1, b1, w2, checked.b2


def check_weights(
    doc: dict[str, Any],
    where: str,
    *,
    fixed: bool,
    hidden: int | None = None,
    error: type[KernmlopsError] = WeightsError,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """w1 (15, hidden), b1 (hidden,), w2 (hidden,) and b2 of a model document, as
    :func:`kernmlops.lb.modelfile.check_weights_doc` checks them."""
    return _arrays(check_weights_doc(doc, where, fixed=fixed, hidden=hidden, error=error))


def check_model(
    doc: dict[str, Any],
    where: str,
    *,
    hidden: int | None = None,
    error: type[KernmlopsError] = WeightsError,
) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray, float]:
    """Every reader's check of a model document
    (:func:`kernmlops.lb.modelfile.check_model_doc`), its weights as arrays: whether it
    is fixed point, and w1, b1, w2, b2; raises ``error`` with one line naming ``where``."""
    checked = check_model_doc(doc, where, hidden=hidden, error=error)
    return (checked.fixed, *_arrays(checked))


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


#: MLLB's patch migrates when its network's output is above this (``jc_mlp.c``:
#: ``output > ftod(0.5)``); ours when the logit is above 0.
MLLB_THRESHOLD = 0.5


def mllb_arrays(weights: Weights) -> tuple[np.ndarray, ...]:
    """W1, b1, W2, b2 as MLLB's arrays hold them: b2 + 0.5, the same decisions
    under its ``output > 0.5``."""
    return (weights.w1, weights.b1, weights.w2, weights.b2 + MLLB_THRESHOLD)


def dump(weights: Weights, layout: int = 2) -> str:
    """The text MLLB's ``dump_weights.py TAG LAYOUT`` prints for these weights
    (:func:`mllb_arrays`: b2 raised to MLLB's threshold)."""
    if layout not in LAYOUTS:
        raise WeightsError(f"layout {layout}: one of {', '.join(map(str, LAYOUTS))}")
    lines: list[str] = []
    for arr in mllb_arrays(weights):
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
