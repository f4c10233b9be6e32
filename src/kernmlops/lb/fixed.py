"""The model in fixed point: Q20.11 int32 weights, the integer forward pass,
its error bound against the float model, and the exported C header / JSON.

Arithmetic (identical in Python here, in the exported header and in
``bpf/lb_model.h``; the same as MLLB's ``CONFIG_JC_SCHED_FXDPT`` code):

* a weight ``w`` becomes ``round(w * 2048)`` (half away from zero);
* a product is ``(int64)a * b >> 11`` (arithmetic shift: rounds down);
* ``h_j = max(0, b1_j + sum_k x_k * w1_kj)``, ``out = b2 + sum_j h_j * w2_j``;
* the decision is ``out > 0`` (the float model's logit > 0, i.e. p > 0.5).

Sums are kept in 64 bits; :func:`max_abs_sum` checks they also fit the
int32 accumulators of MLLB's patch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from kernmlops.lb.features import FBITS, FEATURES, NR_FEATURES, ONE
from kernmlops.lb.model import Model
from kernmlops.lb.weights import FIXED_FORMAT, VERSIONS

FORMAT = FIXED_FORMAT
FORMAT_VERSION = VERSIONS[FORMAT]
INT32 = (-(1 << 31), (1 << 31) - 1)


def quantize(values: np.ndarray) -> np.ndarray:
    """float -> Q20.11 int64, rounding half away from zero (MLLB's float_to_fxdpt)."""
    v = np.asarray(values, dtype=np.float64) * ONE
    r = np.where(v >= 0, np.floor(v + 0.5), np.ceil(v - 0.5))
    # checked as floats: a cast of NaN, inf or 1e300 to int64 is undefined
    if r.size and not (np.isfinite(r).all() and r.min() >= INT32[0] and r.max() <= INT32[1]):
        raise ValueError("a weight does not fit Q20.11 (|w| >= 2^20)")
    return r.astype(np.int64)


@dataclass(frozen=True)
class FixedModel:
    """Integer weights: w1 is (15, 10), feature-major as MLLB's ``w1[]``."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: int

    @classmethod
    def from_model(cls, model: Model) -> FixedModel:
        return cls(
            w1=quantize(model.w1),
            b1=quantize(model.b1),
            w2=quantize(model.w2),
            b2=int(quantize(np.array([model.b2]))[0]),
        )

    def hidden(self, xq: np.ndarray) -> np.ndarray:
        prod = (xq[:, :, None].astype(np.int64) * self.w1[None, :, :]) >> FBITS
        return np.maximum(prod.sum(axis=1) + self.b1[None, :], 0)

    def output(self, xq: np.ndarray) -> np.ndarray:
        """Q20.11 logits of fixed-point features ``xq`` (rows, 15)."""
        h = self.hidden(xq)
        return ((h * self.w2[None, :]) >> FBITS).sum(axis=1) + self.b2

    def predict(self, xq: np.ndarray) -> np.ndarray:
        return (self.output(xq) > 0).astype(np.int8)

    def to_float(self) -> Model:
        """The quantized weights as a float model (for the error split)."""
        return Model(
            w1=self.w1 / ONE, b1=self.b1 / ONE, w2=self.w2 / ONE, b2=self.b2 / ONE, meta={}
        )

    def max_abs_sum(self, xq: np.ndarray) -> int:
        """The largest |partial sum| the forward pass reaches on ``xq``: below
        2^31 means MLLB's int32 accumulators give the same results. Its output
        counts with MLLB's b2, ours + 0.5 (1024), as the header writes it."""
        if not len(xq):
            return 0
        prod = (xq[:, :, None].astype(np.int64) * self.w1[None, :, :]) >> FBITS
        partial = np.cumsum(prod, axis=1) + self.b1[None, None, :]
        h = np.maximum(prod.sum(axis=1) + self.b1[None, :], 0)
        out = np.cumsum((h * self.w2[None, :]) >> FBITS, axis=1) + self.b2
        mllb_out = np.abs(out[:, -1] + ONE // 2).max()
        return int(max(np.abs(partial).max(), np.abs(out).max(), mllb_out, np.abs(xq).max()))


def error_bound(model: Model, fixed: FixedModel, x: np.ndarray, xq: np.ndarray) -> np.ndarray:
    """A per-row bound on |fixed logit - float logit| (in logit units).

    With input errors ``ex = |xq/2048 - x|``, weight errors ``ew = |wq/2048 - w|``
    (<= 2^-12) and each product's floor (< 2^-11):
    ``|dz_j| <= sum_k (ex_k |w_kj| + |xq_k/2048| ew_kj) + 15 * 2^-11 + eb1_j``;
    ReLU keeps it; ``|dout| <= sum_j (|dz_j| |w2_j| + |hq_j/2048| ew2_j)
    + 10 * 2^-11 + eb2``.
    """
    step = 1.0 / ONE
    ex = np.abs(xq / ONE - x)
    xqf = np.abs(xq / ONE)
    ew1 = np.abs(fixed.w1 / ONE - model.w1)
    eb1 = np.abs(fixed.b1 / ONE - model.b1)
    ew2 = np.abs(fixed.w2 / ONE - model.w2)
    eb2 = abs(fixed.b2 / ONE - model.b2)
    dz = ex @ np.abs(model.w1) + xqf @ ew1 + NR_FEATURES * step + eb1[None, :]
    hq = fixed.hidden(xq) / ONE
    return dz @ np.abs(model.w2) + hq @ ew2 + len(model.w2) * step + eb2


def agreement(model: Model, fixed: FixedModel, x: np.ndarray, xq: np.ndarray) -> dict[str, Any]:
    """Float vs fixed on the same decisions: decision agreement, logit
    differences and the bound they must stay within."""
    out_f = model.logits(x)
    out_q = fixed.output(xq) / ONE
    diff = np.abs(out_q - out_f)
    bound = error_bound(model, fixed, x, xq)
    n = len(x)
    same = int(((out_f > 0) == (out_q > 0)).sum())
    return {
        "rows": n,
        "agree": same,
        "agreement": same / n if n else None,
        "max_abs_logit_diff": float(diff.max()) if n else 0.0,
        "max_bound": float(bound.max()) if n else 0.0,
        "within_bound": bool((diff <= bound).all()),
        "max_abs_sum": fixed.max_abs_sum(xq),
    }


# --- export ----------------------------------------------------------------------------


def _exact(q: int) -> str:
    """q / 2048 written exactly (a dyadic rational has a finite decimal form)."""
    text = format(Decimal(int(q)) / Decimal(ONE), "f")
    return text if "." in text else text + ".0"


def _ints(values: np.ndarray, per_line: int = 10, fmt=str) -> str:
    items = [fmt(int(v)) for v in np.asarray(values).ravel()]
    lines = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
    return ",\n\t".join(lines)


def c_header(fixed: FixedModel, meta: dict[str, Any], guard: str = "KMO_LB_MODEL_H") -> str:
    """A C header with the Q20.11 model.

    Stand-alone (C99 or kernel code): ``kmo_lb_w1`` ... ``kmo_lb_b2`` and
    ``kmo_lb_predict_q11(x)``. Inside MLLB's patch: ``jc_mlp.c`` includes
    ``jc_mlp.h`` (which defines ``dtype``, ``ftod`` and, with
    CONFIG_JC_SCHED_FXDPT, ``FXDPT_FBITS``); replace its four weight arrays
    with ``#include "<this header>"`` and the header defines ``w1``, ``b1``,
    ``w2``, ``b2`` in its layout, with b2 raised by 0.5 because the patch
    decides ``output > 0.5``.
    """
    nh = len(fixed.b1)
    feats = "\n".join(f" *   x[{i:2d}] {name}" for i, name in enumerate(FEATURES))
    info = json.dumps({k: meta[k] for k in sorted(meta) if k in _HEADER_META}, sort_keys=True)
    mllb_b2 = fixed.b2 + ONE // 2
    return f"""/* Generated by kernmlops lb export: MLLB's 15 -> {nh} ReLU -> 1 MLP in Q20.11 fixed
 * point (int32, {FBITS} fractional bits). Do not edit; re-export instead.
 * {info}
 *
 * Features, Q20.11 (see kernmlops.lb.features):
{feats}
 * Forward pass: h_j = max(0, b1[j] + sum_k (x[k] * w1[k*{nh}+j] >> {FBITS})),
 * out = b2 + sum_j (h_j * w2[j] >> {FBITS}) with 64-bit products and sums;
 * migrate when out > 0.
 */
#ifndef {guard}
#define {guard}

#define KMO_LB_NR_FEAT {NR_FEATURES}
#define KMO_LB_NR_HIDDEN {nh}
#define KMO_LB_FBITS {FBITS}

#ifdef __KERNEL__
#include <linux/types.h>
typedef s32 kmo_lb_q11_t;
typedef s64 kmo_lb_q11_ext;
#else
#include <stdint.h>
typedef int32_t kmo_lb_q11_t;
typedef int64_t kmo_lb_q11_ext;
#endif

/* w1[feature * {nh} + hidden], as MLLB's w1[] (input row times W1) */
static const kmo_lb_q11_t kmo_lb_w1[{NR_FEATURES * nh}] = {{
\t{_ints(fixed.w1, nh)}
}};
static const kmo_lb_q11_t kmo_lb_b1[{nh}] = {{
\t{_ints(fixed.b1, nh)}
}};
static const kmo_lb_q11_t kmo_lb_w2[{nh}] = {{
\t{_ints(fixed.w2, nh)}
}};
static const kmo_lb_q11_t kmo_lb_b2 = {fixed.b2};

/* The Q20.11 logit of one decision's features. */
static inline kmo_lb_q11_ext kmo_lb_output_q11(const kmo_lb_q11_t x[KMO_LB_NR_FEAT])
{{
\tkmo_lb_q11_ext out = kmo_lb_b2;
\tint j, k;

\tfor (j = 0; j < KMO_LB_NR_HIDDEN; j++) {{
\t\tkmo_lb_q11_ext h = kmo_lb_b1[j];

\t\tfor (k = 0; k < KMO_LB_NR_FEAT; k++)
\t\t\th += ((kmo_lb_q11_ext)x[k] * kmo_lb_w1[k * KMO_LB_NR_HIDDEN + j]) >> KMO_LB_FBITS;
\t\tif (h > 0)
\t\t\tout += (h * kmo_lb_w2[j]) >> KMO_LB_FBITS;
\t}}
\treturn out;
}}

/* 1: migrate, 0: keep the task where it is. */
static inline int kmo_lb_predict_q11(const kmo_lb_q11_t x[KMO_LB_NR_FEAT])
{{
\treturn kmo_lb_output_q11(x) > 0;
}}

#ifdef FXDPT_FBITS
/* Included from MLLB's kernel/sched/jc_mlp.c in place of its weight arrays. */
#if FXDPT_FBITS != {FBITS}
#error "this model is Q20.{FBITS}; set FXDPT_FBITS to {FBITS}"
#endif
#endif
#if defined(FXDPT_FBITS) || defined(KMO_LB_MLLB_ARRAYS)
/* ftod(q / 2048.0) gives back q exactly in fixed point, and the quantized
 * weight in float mode. */
dtype w1[] = {{
\t{_ints(fixed.w1, 5, lambda q: f"ftod({_exact(q)})")}
}};
dtype b1[] = {{
\t{_ints(fixed.b1, 5, lambda q: f"ftod({_exact(q)})")}
}};
dtype w2[] = {{
\t{_ints(fixed.w2, 5, lambda q: f"ftod({_exact(q)})")}
}};
/* b2 + 0.5: the patch migrates when output > ftod(0.5) */
dtype b2[] = {{ ftod({_exact(mllb_b2)}) }};
#endif

#endif /* {guard} */
"""


_HEADER_META = ("created", "migration_cost_ns", "kernmlops", "test_accuracy", "source")


def fixed_json(fixed: FixedModel, meta: dict[str, Any]) -> dict[str, Any]:
    """The integer model as JSON (what ``lb shadow`` loads into BPF)."""
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "fbits": FBITS,
        "features": list(FEATURES),
        "hidden": len(fixed.b1),
        "layout": "w1[feature][hidden]",
        "w1": fixed.w1.tolist(),
        "b1": fixed.b1.tolist(),
        "w2": fixed.w2.tolist(),
        "b2": int(fixed.b2),
        "decision": "migrate when out > 0",
        "meta": meta,
    }


def load_fixed_json(path: Path) -> tuple[FixedModel, dict[str, Any]]:
    """``lb export``'s ``*.q11.json``; ModelError with one line for anything else."""
    from kernmlops.lb.model import ModelError
    from kernmlops.lb.weights import check_model, read_model_doc

    doc = read_model_doc(path, ModelError)
    if doc.get("format") != FORMAT:
        raise ModelError(f"{path} is not a kernmlops fixed-point model (lb export writes one)")
    _, w1, b1, w2, b2 = check_model(doc, str(path), error=ModelError)
    meta = doc.get("meta")
    fixed = FixedModel(w1=w1, b1=b1, w2=w2, b2=int(b2))
    return fixed, dict(meta) if isinstance(meta, dict) else {}
