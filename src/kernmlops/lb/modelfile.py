"""A model file as JSON, and the one check every reader of it makes, without numpy.

Every reader of a model file, ``lb train``'s float model or ``lb export``'s Q20.11
JSON, reads it here (:func:`read_model_doc`) and checks it here
(:func:`check_model_doc`): ``lb export``, ``lb shadow``, ``lb report --model``, ``lb
dump-weights`` through :mod:`kernmlops.lb.weights` (which makes numpy arrays of what
passed), and ``lb deploy``'s loader (:func:`kernmlops.lb.deploy.load_q11`) directly,
with plain lists: it runs in the kernel lab, where importing numpy is 20-28x slower.

The format and its version, MLLB's 15 features in order, Q20.11 for a fixed-point
model, the hidden units it states and the weights are checked. A weight must be a
finite number that Q20.11 can hold (``round(w * 2048)`` an int32, so ``|w| <
2^20``): the kernel computes in that fixed point, and a NaN model would otherwise
score as "always stay".
"""

from __future__ import annotations

import errno
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernmlops.errors import KernmlopsError
from kernmlops.host.pinned import open_regular
from kernmlops.lb.names import FBITS, FEATURES, NR_FEATURES, Q_LIMIT

HIDDEN = 10
#: 15*10 + 10 + 10*1 + 1
NR_PARAMS = NR_FEATURES * HIDDEN + HIDDEN + HIDDEN + 1
FLOAT_FORMAT = "kernmlops-lb-model"
FIXED_FORMAT = "kernmlops-lb-fixed"
#: the version each format is written in (lb train, lb export), the newest one read
VERSIONS = {FLOAT_FORMAT: 1, FIXED_FORMAT: 1}
INT32 = (-(1 << 31), (1 << 31) - 1)
ONE = 1 << FBITS
#: a model is ~10 KiB of JSON; far more is not a model, and json holds it all in memory
MAX_MODEL_BYTES = 16 << 20

Number = int | float


class WeightsError(KernmlopsError):
    """A model file that is not MLLB's 15 -> 10 -> 1 network."""


@dataclass(frozen=True)
class CheckedModel:
    """A model document that passed :func:`check_model_doc`, as plain lists: w1 flat and
    feature-major (``w1[feature * hidden + j]``, the layout of MLLB's ``w1[]``), b1 and
    w2 of ``hidden`` values, b2 one value. Integers (Q20.11) when ``fixed``; for a float
    model b2 is a float and the lists hold the file's numbers."""

    fixed: bool
    hidden: int
    w1: list[Number]
    b1: list[Number]
    w2: list[Number]
    b2: Number


#: the largest |Q20.11 input| of each feature (features.fixed_features clamps the raw
#: values to Q_LIMIT): flags are 1, lengths and fault shares up to Q_LIMIT, loads / 1000
_FLAG = ONE
_WIDE = Q_LIMIT << FBITS
X_MAX = (*[_FLAG] * 8, _WIDE, Q_LIMIT * ONE // 1000, Q_LIMIT * ONE // 1000, _WIDE, _WIDE,
         _FLAG, _FLAG)  # fmt: skip
INT64_MAX = (1 << 63) - 1


def _q(v: Number) -> int:
    """``round(v * 2048)`` half away from zero (fixed.quantize), for a checked weight."""
    if isinstance(v, int):
        return v
    x = v * ONE
    return math.floor(x + 0.5) if x >= 0 else math.ceil(x - 0.5)


def _sums_fit(w1: list[Number], b1: list[Number], w2: list[Number], b2: Number,
              fixed: bool, hidden: int) -> bool:  # fmt: skip
    """Whether the forward pass's 64-bit products and sums (fixed.py, the header,
    ``bpf/lb_model.h``, kmo_lb) stay below 2^63 on every input the features can
    take: weights that each fit Q20.11 may still multiply past it, and the sum wraps,
    turning the decision over with no sign of it."""
    q = (lambda v: v) if fixed else _q
    out = abs(q(b2))
    for j in range(hidden):
        h = abs(q(b1[j])) + sum(
            (X_MAX[k] * abs(q(w1[k * hidden + j])) >> FBITS) + 1 for k in range(NR_FEATURES)
        )
        prod = h * abs(q(w2[j]))
        if h > INT64_MAX or prod > INT64_MAX:
            return False
        out += (prod >> FBITS) + 1
    return out <= INT64_MAX


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


def fits_q11(v: float) -> bool:
    """Whether ``round(v * 2048)``, half away from zero as fixed.quantize rounds,
    is an int32."""
    if not abs(v) < 1 << 21:  # far out (or inf): no product to round
        return False
    x = v * ONE
    q = math.floor(x + 0.5) if x >= 0 else math.ceil(x - 0.5)
    return INT32[0] <= q <= INT32[1]


def _shown(value: object, width: int = 20) -> str:
    """``value`` as JSON, a long string cut inside its quotes (with an ellipsis);
    an object too long to show is named, not cut open."""
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= width:
        return text
    if isinstance(value, str):
        return json.dumps(value[: width - 3] + "…", ensure_ascii=False)
    return "an object" if isinstance(value, dict) else f"a {type(value).__name__}"


def _values(doc: dict, key: str, shapes: Sequence[tuple[int, ...]], where: str,
            integers: bool, error: type[KernmlopsError]) -> list[Number]:  # fmt: skip
    """doc[key]'s numbers, flat in row-major order, when it has one of ``shapes``:
    int32 integers for a fixed-point model, finite numbers that fit Q20.11 for a
    float one."""
    if key not in doc:
        raise error(f"{where}: no {key} (a model holds w1, b1, w2, b2)")
    want = " or ".join(_shape_name(s) for s in shapes)
    try:
        shape, flat = _shape(doc[key])
    except (ValueError, RecursionError):
        raise error(f"{where}: {key} must be {want}, its rows differ in length") from None
    for v in flat:  # what a value is says more than the shape it came in
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise error(f"{where}: {key} holds {_shown(v)}, not a number")
        if integers and not (isinstance(v, int) and INT32[0] <= v <= INT32[1]):
            raise error(f"{where}: {key} holds {v}, not a Q20.{FBITS} int32")
        try:
            finite = math.isfinite(v)
        except OverflowError:
            finite = False
        if not finite:
            raise error(f"{where}: {key} holds {v}, not a finite number")
        if not integers and not fits_q11(v):
            raise error(f"{where}: {key} holds {v:g}, outside Q20.{FBITS} fixed point "
                        "(|w| < 2^20), which the kernel computes in")  # fmt: skip
    if shape not in shapes:
        raise error(f"{where}: {key} is {_shape_name(shape)}, must be {want}")
    return flat  # type: ignore[return-value]  # each checked above


def check_weights_doc(
    doc: dict[str, Any],
    where: str,
    *,
    fixed: bool,
    hidden: int | None = None,
    error: type[KernmlopsError] = WeightsError,
) -> CheckedModel:
    """w1 (15, hidden), b1 (hidden,), w2 (hidden,) or (hidden, 1) and b2 (one value) of
    a model document, each checked: present, of the network's shape, finite numbers
    that fit Q20.11 (``fixed``: the int32 integers of Q20.11). ``hidden`` None takes
    the hidden units from w1. Raises ``error`` with one line naming the file, the
    array and the value."""
    if hidden is None:
        try:
            shape, _ = _shape(doc.get("w1"))
        except (ValueError, RecursionError):
            shape = ()
        hidden = shape[1] if len(shape) == 2 and shape[1] > 0 else HIDDEN
    w1 = _values(doc, "w1", [(NR_FEATURES, hidden)], where, fixed, error)
    b1 = _values(doc, "b1", [(hidden,)], where, fixed, error)
    w2 = _values(doc, "w2", [(hidden, 1), (hidden,)], where, fixed, error)
    (b2,) = _values(doc, "b2", [(1,), ()], where, fixed, error)
    if not _sums_fit(w1, b1, w2, b2, fixed, hidden):
        raise error(f"{where}: weights this large overflow the 64-bit sums of the forward "
                    "pass on some inputs (up to a runqueue of 2^20 tasks), which would turn "
                    "its decision over unseen; no trained model comes near")  # fmt: skip
    return CheckedModel(fixed, hidden, w1, b1, w2, int(b2) if fixed else float(b2))


def check_model_doc(
    doc: dict[str, Any],
    where: str,
    *,
    hidden: int | None = None,
    error: type[KernmlopsError] = WeightsError,
) -> CheckedModel:
    """Every reader's check of a model document, ``lb train``'s float model or ``lb
    export``'s Q20.11 JSON: a format this kernmlops knows in a version not newer than
    its own, MLLB's 15 features in order, Q20.11 (fixed point), the weights
    (:func:`check_weights_doc`) and the hidden units the file states. Raises ``error``
    with one line naming ``where``."""
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
    checked = check_weights_doc(doc, where, fixed=fixed, hidden=hidden, error=error)
    stated = doc.get("hidden", checked.hidden)
    if stated != checked.hidden:
        raise error(f"{where}: hidden is {stated!r}, but w1 has {checked.hidden} columns")
    return checked


def read_model_doc(path: Path, error: type[KernmlopsError] = WeightsError) -> dict[str, Any]:
    """A model file's JSON object (at most MAX_MODEL_BYTES); ``error`` with one
    line when it is missing, a folder, too large or not a JSON object."""
    path = Path(path)
    try:
        # a plain file only: a FIFO put at a model's name would hang the read
        with open(open_regular(path), "rb") as f:
            raw = f.read(MAX_MODEL_BYTES + 1)
        if len(raw) > MAX_MODEL_BYTES:
            raise error(f"{path} is over {MAX_MODEL_BYTES >> 20} MiB: not a model file "
                        "(lb train and lb export write ~10 KiB)")  # fmt: skip
        doc = json.loads(raw)
    except FileNotFoundError:
        raise error(f"model {path} not found") from None
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise error(f"cannot read model {path}: {err.strerror}") from None
        if path.is_dir():
            raise error(f"{path} is a folder, not a model file") from None
        raise error(f"{path} is not a plain file: not a model file") from None
    except (ValueError, RecursionError):  # not UTF-8, not JSON, a number past 4300 digits
        raise error(f"{path} is not a model: not JSON (lb train and lb export write "
                    "JSON)") from None  # fmt: skip
    if not isinstance(doc, dict):
        raise error(f"{path} is not a model: not a JSON object (lb train and lb export "
                    "write one)")  # fmt: skip
    return doc
