"""The two BPF hooks of learning load balancing.

* :class:`LbKprobeHook` (``bpf/lb_kprobe.bpf.c``): every ``can_migrate_task``
  decision, exact; fexit where the kernel allows it, else kprobe +
  kretprobe. Table ``lb_decisions`` (canonical columns plus the record's
  extras).
* :class:`LbTracepointHook` (``bpf/lb_tp.bpf.c``): load-balancer pulls seen
  on ``sched_migrate_task``, for kernels without kprobes. Table
  ``lb_tp_shadow``: what the program read at each pull (and gave its model),
  the tracepoint data set's pull rows (``kernmlops.lb.tracepoint``).

Both can carry a fixed-point model (set before load) and evaluate it on
every decision in the kernel: shadow mode. The shadow statistics (per-CPU
counters) are read when the hook stops, into :attr:`stats`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import polars as pl

from kernmlops.ebpf.btf import RecordLayout
from kernmlops.ebpf.frames import records_to_frame
from kernmlops.errors import HookUnavailable
from kernmlops.hooks.base import HookContext
from kernmlops.hooks.bpf import BpfHook, BpfHookOptions
from kernmlops.host.cpus import parse_cpu_list
from kernmlops.lb.dataset import from_kprobe_records
from kernmlops.lb.features import MIGRATION_COST_NS

if TYPE_CHECKING:
    from kernmlops.lb.fixed import FixedModel

MAX_CPUS = 256  # LB_MAX_CPUS in lb_model.h
MAX_NODES = 4  # LB_MAX_NODES
NODE_ROOT = Path("/sys/devices/system/node")
#: enum lb_stat in lb_model.h
STAT_SLOTS = ("seen", "agree", "filtered", "tp", "fp", "fn", "tn", "ns_sum", "ns_max")


def cpu_nodes(root: Path = NODE_ROOT) -> list[int]:
    """NUMA node of each CPU id (index), 0 where sysfs says nothing."""
    nodes = [0] * (os.cpu_count() or 1)
    for path in sorted(root.glob("node[0-9]*")):
        if not path.name[4:].isdigit():
            continue
        try:
            cpus = parse_cpu_list((path / "cpulist").read_text()) or []
        except OSError:
            continue
        for cpu in cpus:
            if cpu >= len(nodes):
                nodes.extend([0] * (cpu + 1 - len(nodes)))
            nodes[cpu] = int(path.name[4:])
    return nodes


def _packed(values: np.ndarray, dtype: str) -> int:
    """An array global as one little-endian integer: set_globals writes an int
    into the symbol's bytes, so this writes the array unchanged."""
    return int.from_bytes(np.ascontiguousarray(values, dtype=dtype).tobytes(), "little")


def model_globals(
    fixed: FixedModel | None,
    nodes: list[int],
    migration_cost_ns: int = MIGRATION_COST_NS,
) -> dict[str, int | bool]:
    """The ``const volatile`` settings of lb_model.h."""
    if len(nodes) > MAX_CPUS:
        raise HookUnavailable(f"lb: {len(nodes)} CPUs; the BPF side keeps a map of {MAX_CPUS}")
    if nodes and max(nodes) >= MAX_NODES:
        raise HookUnavailable(f"lb: NUMA node {max(nodes)}; the BPF side reads {MAX_NODES} nodes")
    node_map = np.zeros(MAX_CPUS, dtype=np.uint8)
    node_map[: len(nodes)] = nodes
    out: dict[str, int | bool] = {
        "lb_migration_cost_ns": int(migration_cost_ns),
        "lb_nr_nodes": max(nodes) + 1 if nodes else 1,
        "lb_cpu_node": _packed(node_map, "u1"),
        "lb_model_on": fixed is not None,
    }
    if fixed is not None:
        if fixed.w1.shape != (15, 10):
            raise HookUnavailable(f"lb: the BPF model is 15 x 10, this one {fixed.w1.shape}")
        out |= {
            "lb_w1": _packed(fixed.w1.ravel(), "<i4"),
            "lb_b1": _packed(fixed.b1, "<i4"),
            "lb_w2": _packed(fixed.w2, "<i4"),
            "lb_b2": int(fixed.b2),
        }
    return out


@dataclass
class ShadowStats:
    """The in-kernel counters (enum lb_stat), summed over CPUs."""

    seen: int = 0
    agree: int = 0
    filtered: int = 0
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0
    ns_sum: int = 0
    ns_max: int = 0
    #: BPF stats of the hook's programs (run_time_ns, run_cnt) when enabled
    programs: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        evaluated = self.tp + self.fp + self.fn + self.tn
        return {
            "decisions": self.seen,
            "agree_all": self.agree,
            "filtered": self.filtered,
            "confusion": [[self.tn, self.fp], [self.fn, self.tp]],
            "agreement": (self.tp + self.tn) / evaluated if evaluated else None,
            "mean_inference_ns": self.ns_sum / self.seen if self.seen and self.ns_sum else None,
            "max_inference_ns": self.ns_max or None,
            "programs": self.programs,
        }


class LbHook(BpfHook[BpfHookOptions]):
    """Shared: model globals, stats read before the object closes."""

    libraries: ClassVar[tuple[str, ...]] = ("polars",)  # rows are built with polars
    #: rows need the model and collection given to the constructor: not from a spool
    spoolable: ClassVar[bool] = False

    def __init__(
        self,
        options: BpfHookOptions | None = None,
        *,
        model: FixedModel | None = None,
        migration_cost_ns: int = MIGRATION_COST_NS,
        collection_id: str = "",
        nodes: list[int] | None = None,
    ) -> None:
        super().__init__(options)
        self.model = model
        self.migration_cost_ns = migration_cost_ns
        self.collection_id = collection_id
        self.nodes = nodes if nodes is not None else cpu_nodes()
        self.stats: ShadowStats | None = None

    def extra_globals(self) -> dict[str, int | bool]:
        return model_globals(self.model, self.nodes, self.migration_cost_ns)

    def read_stats(self) -> ShadowStats:
        from kernmlops.ebpf import libbpf

        assert self.obj is not None
        stats = self.obj.map("lb_stats")
        values = {name: stats.lookup_percpu(i) for i, name in enumerate(STAT_SLOTS)}
        out = ShadowStats(
            **{k: int(v.max() if k == "ns_max" else v.sum()) for k, v in values.items()}
        )
        for p in self.obj.programs.values():
            if p.autoload and p.fd >= 0:
                info = libbpf.prog_info(p.fd)
                out.programs[p.name] = {"run_time_ns": info.run_time_ns, "run_cnt": info.run_cnt}
        return out

    def close(self) -> None:
        if self.obj is not None and self.obj.loaded and self.stats is None:
            try:
                self.stats = self.read_stats()
            except Exception:  # stats are extra; never lose the rows for them
                self.stats = None
        super().close()


class LbKprobeHook(LbHook):
    """Every can_migrate_task decision (exact): fexit, else kprobe + kretprobe."""

    name: ClassVar[str] = "lb_kprobe"
    object_name: ClassVar[str] = "lb_kprobe"
    rings: ClassVar[dict[str, str]] = {"lb_decisions": "lb_decisions_rb"}
    needs = ("fentry|kprobe", "ringbuf")
    VARIANT_NAMES: ClassVar[dict[str | None, str]] = {"btf": "fexit", "raw": "kprobe"}

    #: attach choice -> object variants to try, in order
    ATTACH: ClassVar[dict[str, tuple[str, ...]]] = {
        "auto": ("btf", "raw"),
        "fexit": ("btf",),
        "kprobe": ("raw",),
    }

    def __init__(self, *args: Any, attach: str = "auto", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if attach not in self.ATTACH:
            raise HookUnavailable(f"lb_kprobe: attach must be one of {', '.join(self.ATTACH)}")
        self.attach_choice = attach

    def variants(self) -> tuple[str, ...]:
        return self.ATTACH[self.attach_choice]

    def start(self, ctx: HookContext) -> None:
        try:
            super().start(ctx)
        except HookUnavailable as err:
            raise HookUnavailable(unavailable_reason(str(err))) from err
        self.status.variant = self.VARIANT_NAMES.get(self.status.variant, self.status.variant)

    def to_frame(self, table: str, records: np.ndarray, layout: RecordLayout) -> pl.DataFrame:
        return from_kprobe_records(records_to_frame(records, layout), self.collection_id).drop(
            "collection_id"
        )


class LbTracepointHook(LbHook):
    """Load-balancer pulls on sched_migrate_task, with the model beside them."""

    name: ClassVar[str] = "lb_tp_shadow"
    object_name: ClassVar[str] = "lb_tp"
    rings: ClassVar[dict[str, str]] = {"lb_tp_shadow": "lb_tp_rb"}


def unavailable_reason(detail: str) -> str:
    """Why the kprobe variant cannot run here, and what to do instead."""
    from kernmlops.ebpf.probe import probe_all

    features = probe_all()
    why = "; ".join(
        f"{name}: {features[name].detail}"
        for name in ("fentry", "kprobe")
        if name in features and not features[name].ok
    )
    return (
        f"lb_kprobe: this kernel ({os.uname().release}) cannot probe can_migrate_task "
        f"({why or detail}). Use --variant tracepoint here, or run it in the kernel lab: "
        "kernmlops vm -- kernmlops lb collect --variant kprobe ..."
    )
