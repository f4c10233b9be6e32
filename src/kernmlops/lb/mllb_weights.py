"""MLLB's own trained model, read from the files it kept its weights in.

MLLB (Chen et al., APSys'20) deployed its network as C arrays: ``dtype w1[]``,
``b1[]``, ``w2[]``, ``b2[]`` in its kernel patch (``kernel/sched/jc_mlp.c``, the
values wrapped in ``ftod(...)`` there) and in its module's ``kmod/c_mlp.h``;
it made them from the text of ``training/dump_weights.py`` (Keras'
``get_weights()``: W1 15 x 10 feature-major, b1, W2 10 x 1, b2, in any of its
three layouts). Either file is read here: the C arrays by name (comments
skipped: ``c_mlp.h`` keeps an older model in one), the text as its 171
numbers in order. Its pickles are not read: unpickling a file runs its code.

Its last unit is linear, trained as a probability, and its patch migrates
when the output is above 0.5; ours migrates when the logit is above 0, so the
imported b2 is MLLB's minus 0.5: the same decision on every input (``lb
dump-weights`` and ``lb export`` add the 0.5 back for MLLB's arrays).
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

import numpy as np

from kernmlops.host.pinned import open_regular
from kernmlops.lb.model import Model, ModelError
from kernmlops.lb.modelfile import HIDDEN, MAX_MODEL_BYTES, NR_PARAMS
from kernmlops.lb.names import NR_FEATURES
from kernmlops.lb.weights import MLLB_THRESHOLD, check_model

#: MLLB's prep.py: delta_hot is delta < 500000 ns
MLLB_MIGRATION_COST_NS = 500_000

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_ARRAY = re.compile(r"\b(w1|b1|w2|b2)\s*\[\s*\d*\s*\]\s*=\s*\{([^}]*)\}")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_SIZES = {"w1": NR_FEATURES * HIDDEN, "b1": HIDDEN, "w2": HIDDEN, "b2": 1}


def _numbers(text: str) -> list[float]:
    # ftod(0.5) and ftodtype(0.5) hold one number each; the names' digits are not
    # numbers (the lookbehind: no letter or underscore before)
    return [float(m) for m in re.findall(r"(?<![A-Za-z_\d.])" + _NUMBER.pattern, text)]


def parse(text: str, where: str) -> Model:
    """MLLB's weights in C arrays or dump_weights.py text -> our float model."""
    code = _COMMENT.sub(" ", text)
    arrays = {name: body for name, body in _ARRAY.findall(code)}
    if arrays:
        missing = [n for n in _SIZES if n not in arrays]
        if missing:
            raise ModelError(f"{where}: no {', '.join(missing)} array (MLLB's patch "
                             "defines w1, b1, w2 and b2)")  # fmt: skip
        values = {n: _numbers(arrays[n]) for n in _SIZES}
        for n, size in _SIZES.items():
            if len(values[n]) != size:
                raise ModelError(f"{where}: {n}[] holds {len(values[n])} numbers, MLLB's "
                                 f"network {size}")  # fmt: skip
        flat = [v for n in _SIZES for v in values[n]]
    else:
        flat = _numbers(code)
        if len(flat) != NR_PARAMS:
            raise ModelError(f"{where}: {len(flat)} numbers, MLLB's weights are {NR_PARAMS} "
                             "(W1 15x10, b1 10, W2 10x1, b2 1)")  # fmt: skip
    v = np.array(flat, dtype=np.float64)
    if not np.isfinite(v).all():
        raise ModelError(f"{where}: a weight is not a finite number")
    n1 = NR_FEATURES * HIDDEN
    model = Model(
        w1=v[:n1].reshape(NR_FEATURES, HIDDEN),
        b1=v[n1 : n1 + HIDDEN],
        w2=v[n1 + HIDDEN : n1 + 2 * HIDDEN],
        b2=float(v[-1]) - MLLB_THRESHOLD,
        meta={"source": "mllb", "migration_cost_ns": MLLB_MIGRATION_COST_NS},
    )
    check_model(model.to_json(), where, error=ModelError)  # every reader's check
    return model


def read(path: Path) -> Model:
    """:func:`parse` of a file; ModelError with one line when it cannot be read."""
    path = Path(path)
    try:
        # a plain file only: a FIFO at its name would hang the read
        with open(open_regular(path), "rb") as f:
            raw = f.read(MAX_MODEL_BYTES + 1)
    except FileNotFoundError:
        raise ModelError(f"{path} not found") from None
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise ModelError(f"cannot read {path}: {err.strerror}") from None
        raise ModelError(f"{path} is not a plain file: not MLLB's weights") from None
    if len(raw) > MAX_MODEL_BYTES:
        raise ModelError(f"{path} is over {MAX_MODEL_BYTES >> 20} MiB: not MLLB's weights")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ModelError(f"{path} is not text: not MLLB's weights") from None
    return parse(text, str(path))
