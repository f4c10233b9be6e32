"""Shadow mode: the fixed-point model in the kernel, beside the real scheduler.

In a collection (``lb collect --model``, ``lb shadow``) the hooks evaluate
the model on every observed decision (:mod:`kernmlops.lb.hook`); this module
turns their rows and counters into a summary, and runs the model alone in
the kernel with ``BPF_PROG_TEST_RUN`` (:func:`run_in_kernel`) to check it
against Python bit for bit and to time it (``bpf/lb_eval.bpf.c``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from kernmlops.ebpf import libbpf
from kernmlops.ebpf.btf import Kind, record_layout
from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.libbpf import LibbpfError, ProgTestRunOpts, check_int, lib
from kernmlops.ebpf.objects import open_and_load
from kernmlops.ebpf.spec import object_spec
from kernmlops.lb.features import FEATURE_INPUTS, LABEL, MIGRATION_COST_NS
from kernmlops.lb.model import metrics
from kernmlops.stats import quantile

XDP_PASS = 2


@dataclass(frozen=True)
class KernelRun:
    """The model evaluated by BPF on given decisions."""

    #: Q20.11 logits the kernel computed
    outputs: np.ndarray
    #: bpf_ktime_get_ns around features + MLP, per decision (ns)
    eval_ns: np.ndarray
    #: BPF_PROG_TEST_RUN's average time of one whole program run (ns), over ``repeat``
    run_ns_per_call: float
    repeat: int


def eval_layout(path: Path) -> np.dtype:
    """numpy dtype of struct lb_eval, from the object's BTF (C is the source of truth)."""
    btf = object_spec(path).btf
    return record_layout(btf, btf.find(Kind.STRUCT, "lb_eval")).dtype


def inputs_array(decisions: pl.DataFrame, dtype: np.dtype) -> np.ndarray:
    """Decisions -> struct lb_eval records (inputs filled, outputs zero)."""
    arr = np.zeros(decisions.height, dtype=dtype)
    for name in FEATURE_INPUTS:
        col = f"in_{name}"
        if col not in dtype.names:
            raise LibbpfError(f"struct lb_inputs has no field {name}")
        arr[col] = decisions[name].fill_null(0).cast(pl.Int64).to_numpy()
    arr["in_delta_faults"] = decisions["delta_faults"].fill_null(0).to_numpy()
    return arr


def run_in_kernel(
    fixed: Any,
    decisions: pl.DataFrame,
    *,
    migration_cost_ns: int = MIGRATION_COST_NS,
    repeat: int = 1000,
    bpf_dir: Path | None = None,
) -> KernelRun:
    """Evaluate ``fixed`` (a FixedModel) in the kernel on every decision, with
    the program BPF shadow mode uses; time ``repeat`` runs of the first one."""
    from kernmlops.lb.hook import model_globals

    path = object_path("lb_eval", bpf_dir)
    if not path.exists():
        raise LibbpfError(f"BPF object {path} not found (build it: kernmlops build-bpf)")
    dtype = eval_layout(path)
    records = inputs_array(decisions, dtype)
    obj = open_and_load(path, globals_=model_globals(fixed, [0], migration_cost_ns))
    try:
        fd = obj.programs["lb_eval_xdp"].fd
        out = np.zeros_like(records)
        size = dtype.itemsize
        # XDP wants a packet of at least an Ethernet header
        pkt_len = max(size, 64)
        buf_in = ctypes.create_string_buffer(pkt_len)
        buf_out = ctypes.create_string_buffer(pkt_len + 256)
        durations = []

        def run_one(raw: bytes, n: int) -> bytes:
            ctypes.memmove(buf_in, raw, size)
            opts = ProgTestRunOpts(sz=ctypes.sizeof(ProgTestRunOpts))
            opts.data_in = ctypes.cast(buf_in, ctypes.c_void_p)
            opts.data_size_in = pkt_len
            opts.data_out = ctypes.cast(buf_out, ctypes.c_void_p)
            opts.data_size_out = len(buf_out)
            opts.repeat = n
            rc = lib.bpf_prog_test_run_opts(fd, ctypes.byref(opts))
            check_int(rc if rc >= 0 else -ctypes.get_errno(), "BPF_PROG_TEST_RUN lb_eval_xdp")
            if opts.retval != XDP_PASS:
                raise LibbpfError(f"lb_eval_xdp returned {opts.retval}, want XDP_PASS")
            durations.append(opts.duration)
            return buf_out.raw[:size]

        for i in range(len(records)):
            out[i] = np.frombuffer(run_one(records[i].tobytes(), 1), dtype=dtype)[0]
        durations.clear()
        if len(records):
            run_one(records[0].tobytes(), repeat)
        return KernelRun(
            outputs=out["out"].astype(np.int64),
            eval_ns=out["ns"].astype(np.int64),
            run_ns_per_call=float(durations[0]) if durations else float("nan"),
            repeat=repeat,
        )
    finally:
        obj.close()


class BpfStats:
    """BPF run-time statistics (run_time_ns, run_cnt) on while held."""

    def __init__(self) -> None:
        self.fd = -1

    def __enter__(self) -> BpfStats:
        fd = libbpf.lib.bpf_enable_stats(0)  # BPF_STATS_RUN_TIME
        self.fd = fd if fd >= 0 else -1
        return self

    def __exit__(self, *exc: object) -> None:
        import os

        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _inference(rows: pl.DataFrame, population: str) -> dict[str, Any] | None:
    """Per-decision inference time (features + MLP) over ``rows``: every figure of
    one population, named."""
    if "infer_ns" not in rows.columns or rows.height == 0:
        return None
    ns = rows["infer_ns"].cast(pl.Float64).to_numpy()
    return {
        "population": population,
        "decisions": len(ns),
        "mean": float(ns.mean()),
        "p50": quantile(ns, 0.5),
        "p99": quantile(ns, 0.99),
        "max": float(ns.max()),
    }


def summarize(
    decisions: pl.DataFrame | None,
    stats: dict[str, Any] | None,
    variant: str,
    dataset: pl.DataFrame | None = None,
) -> dict[str, Any]:
    """What shadow mode found: in-kernel counters (every decision the program
    saw), and the same recomputed from the rows (model_pred vs can_migrate)
    over the data set's population: for kprobe, its decisions after MLLB's
    filter; for tracepoint, the pulls of ``dataset`` (the tracepoint data set
    of the same collection), when given: each carries the answer the program
    gave on the very inputs the row holds (:func:`kernmlops.lb.tracepoint.
    observed_pulls`). The program is attached before the scheduler tables'
    hooks and detached after them, so it also sees pulls the data set cannot
    hold (``outside_data_set``)."""
    out: dict[str, Any] = {"variant": variant, "kernel": stats}
    if decisions is None or decisions.height == 0 or "model_pred" not in decisions.columns:
        return out
    rows = decisions.filter(pl.col("model_pred") >= 0)
    if variant == "kprobe":
        from kernmlops.lb.features import mllb_filter

        kept = mllb_filter(rows)
        out["rows"] = {
            "population": "decisions after MLLB's filter",
            "decisions": rows.height,
            "filtered": kept.height,
            **metrics(kept[LABEL].to_numpy(), kept["model_pred"].to_numpy()),
        }
        out["inference_ns"] = _inference(kept, "decisions after MLLB's filter")
        return out
    if dataset is not None:
        pulls = dataset.filter(pl.col(LABEL) == 1)
        # the pulls the program evaluated (a pull it has no row for: null)
        has_model = "model_pred" in pulls.columns
        kept = pulls.filter(pl.col("model_pred") >= 0) if has_model else pulls.clear()
        population = "pulls of the data set"
        data_pulls = pulls.height
    else:
        kept, population, data_pulls = rows, "pulls the program saw", None
    n = kept.height
    agree = int((kept["model_pred"] == 1).sum()) if n else 0
    out["rows"] = {
        "population": population,
        "data_set_pulls": data_pulls,
        "pulls": n,
        "model_migrates": agree,
        "agreement": agree / n if n else None,
        # seen while the shadow program was attached and the scheduler tables' hooks not
        "outside_data_set": rows.height - n,
    }
    out["inference_ns"] = _inference(kept, population)
    return out
