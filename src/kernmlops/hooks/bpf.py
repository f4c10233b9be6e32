"""Base of hooks backed by one BPF object whose tables come from ring buffers."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import Field, field_validator

from kernmlops.ebpf import libbpf
from kernmlops.ebpf.btf import RecordLayout, unbatch
from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.copier import Copier
from kernmlops.ebpf.copier import available as copier_available
from kernmlops.ebpf.copier import default_workers as copier_workers
from kernmlops.ebpf.frames import records_to_table
from kernmlops.ebpf.objects import VARIANTS, BpfObject, open_and_load
from kernmlops.ebpf.ringbuf import RingBuffer, RingGroup
from kernmlops.ebpf.spec import ObjectSpec, object_spec
from kernmlops.errors import HookUnavailable, KernmlopsError
from kernmlops.hooks.base import Hook, HookContext, HookOptions, OptionsT
from kernmlops.host.cpus import online_cpu_count, online_cpus
from kernmlops.lazy import lazy_import
from kernmlops.spool.copy import SYNC_BYTES, RingSpool
from kernmlops.spool.frames import FRAME_RAW, FRAME_RAW_MAX
from kernmlops.spool.jobs import SpoolWork

if TYPE_CHECKING:
    import numpy as np

    from kernmlops.tables import Rows
else:
    np = lazy_import("numpy")


#: a ring's default size per 4 CPUs, and the largest default (KiB)
RING_KIB_PER_4_CPUS = 8192
RING_KIB_MAX_DEFAULT = 256 << 10


#: CPUs per ring group by default: one ring (and one copier thread) per 16 CPUs online,
#: the most one ring was measured to serve without a loss (the 16-core machine's storm,
#: bench/README.md). There, 7.1-7.4M switches a second kept its one copier 0.17-0.21 of
#: a core busy while the spool was in memory (`storm-16cpu-2026-11-28.json`, 5-s runs;
#: ~33M records a CPU-second in `python -m bench capacity` on 2 vCPUs): a ring of 64
#: such CPUs would need 0.7-0.85 of one thread's core, with every CPU's batches taking
#: one ring's lock. Up to 16 CPUs a hook has one ring.
CPUS_PER_RING_GROUP = 16


def default_ring_groups(cpus: int | None = None) -> int:
    """Rings per table on a machine with ``cpus`` CPUs online: one per 16."""
    n = cpus if cpus is not None else online_cpu_count()
    return max(1, -(-n // CPUS_PER_RING_GROUP))


def zstd_workers_per_copier(workers: int, groups: int, ring_bytes: int) -> int:
    """The zstd workers beside each copier of a table with ``groups`` rings of
    ``ring_bytes``, ``workers`` being the table's in all (collector.copier_workers)."""
    if groups > 1:  # the compression workers shared by the groups' copiers
        workers = -(-workers // groups)
    # a frame is cut in jobs of 512 KiB, one per worker, and must fit a quarter ring
    return min(workers, ring_bytes // 4 // (512 << 10))


def ring_group_plan(groups: int, possible: int) -> tuple[int, int]:
    """(rings, CPUs per ring) for ``groups`` asked on a machine whose CPUs are numbered
    below ``possible`` (online ones: cpu_span): CPU c writes into ring c // per. No ring is
    left without a CPU: at most one ring per CPU, and fewer where the CPUs do not
    split evenly (10 CPUs in 4 groups: 3 per ring, 4 rings)."""
    groups = max(1, min(groups, possible))
    per = -(-possible // groups)
    return -(-possible // per), per


def cpu_span() -> int:
    """One past the highest CPU online: the CPU numbers cut in groups. A CPU that
    comes online later past it writes into ring 0 (common.h, kmo_ring_of)."""
    return max(online_cpus()) + 1


def default_ring_kib(cpus: int | None = None) -> int:
    """A ring's default size on a machine with ``cpus`` CPUs online: 8 MiB per 4 CPUs,
    a power of two, at most 256 MiB. Every CPU writes into the one ring, so a storm
    fills it at a rate that grows with the CPU count, and the time it bridges while
    the copier waits for a CPU (8 MiB: ~40 ms of a 16-CPU storm) must not shrink."""
    n = cpus if cpus is not None else online_cpu_count()
    quarters = max(1, -(-n // 4))
    return min(RING_KIB_MAX_DEFAULT, RING_KIB_PER_4_CPUS << (quarters - 1).bit_length())


def _runway_status(copiers: list[Copier]) -> dict[str, Any]:
    """The copiers' runways as one (a ring group's copiers write one spool's segments;
    the first one's thread allocates them)."""
    each = [c.runway for c in copiers]
    counts = ("allocations", "allocated_bytes", "outside_bytes", "short_of_space")
    out = {k: sum(r.get(k, 0) for r in each) for k in counts}
    out["longest_ms"] = max(r["longest_ms"] for r in each)
    if not out["short_of_space"]:
        del out["short_of_space"]
    errors = sorted({r["error"] for r in each if "error" in r})
    if errors:
        out["error"] = ", ".join(errors)
    return out


def core_share(before: Sequence[float], after: Sequence[float], seconds: float) -> float:
    """The busiest thread's share of a core over ``seconds`` of wall time, from each
    one's CPU seconds at its start (``before``) and end (``after``), both read within
    those seconds. A thread's CPU clock cannot outrun the wall clock but by the two
    clocks' rates (the scheduler's clock against CLOCK_MONOTONIC, which NTP slews by
    up to 0.05%): that much is cut off at 1."""
    busiest = max((b - a for a, b in zip(before, after, strict=True)), default=0.0)
    return min(1.0, max(0.0, busiest) / seconds)


def _ring_list(reader: RingBuffer | RingGroup) -> list[RingBuffer]:
    """A table's rings: one, or its group's."""
    return reader.rings if isinstance(reader, RingGroup) else [reader]


class BpfHookOptions(HookOptions):
    ring_kib: int | None = Field(
        None,
        ge=4,
        le=1 << 20,
        description="size of each ring buffer in KiB (a power of two); null: 8 MiB per 4 "
        "CPUs online (per 4 CPUs of its group, with ring_groups), at most 256 MiB (every "
        "CPU writes into the ring: a storm fills it faster on a larger machine)",
    )

    ring_groups: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="rings per table, each written by one group of CPUs (and, where the "
        "hook spools, moved by a copier thread of its own into the table's one spool); "
        "null: one per 16 CPUs online (the most one ring was measured to serve under a "
        "switch storm without a loss; up to 16 CPUs one ring). More "
        "rings split a storm's writes (each ring has its own reservation lock) and its "
        "copy over more cores; a table's rows keep each CPU's order, not the order across "
        "rings. At most one ring per CPU (more is said at start, and the manifest's "
        "hooks.<hook>.rings says how many ran)",
    )

    batch_ms: int = Field(
        250,
        ge=0,
        le=10_000,
        description=(
            "drain a ring at least this often, sooner once it is a quarter full: fewer, "
            "larger batches cost the collector less CPU (0: every poll)"
        ),
    )

    @field_validator("ring_kib")
    @classmethod
    def _power_of_two(cls, kib: int | None) -> int | None:
        if kib is not None and kib & (kib - 1):
            raise ValueError(f"must be a power of two, got {kib}")
        return kib

    @property
    def groups(self) -> int:
        """Rings per table asked for on this machine (ring_groups, or its default)."""
        return self.ring_groups if self.ring_groups is not None else default_ring_groups()

    @property
    def ring_bytes(self) -> int:
        """Each ring's size on this machine (ring_kib, or its default here: a ring
        serves its group's CPUs, so the default follows their count)."""
        if self.ring_kib is not None:
            return self.ring_kib * 1024
        return default_ring_kib(-(-online_cpu_count() // self.groups)) * 1024


#: seconds over which a copier's busy share is measured (status.copier.busy_peak)
COPIER_WINDOW_S = 1.0
#: the longest a poll makes rows from a spool before it copies the rings again (s): a
#: default ring (8 MiB) holds hundreds of milliseconds of the busiest storm
ROWS_BUDGET_S = 0.05
#: a ring is drained once 1/DRAIN_FRACTION of it is unread; common.h's submits wake the
#: collector at the same marks (KMO_WAKE_SHIFT). A quarter: a storm's ring is drained
#: in 2-MiB pieces (each wake-up of the loop costs ~0.5 ms of CPU) with 3/4 left free
DRAIN_FRACTION = 4

#: a BPF hook's options: ring sizes and batching, and the hook's own settings
BpfOptionsT = TypeVar("BpfOptionsT", bound=BpfHookOptions)


class BpfObjectHook(Hook[OptionsT]):
    """A hook that loads one BPF object: its programs, links and maps, the
    detach-then-drain stop, and the kernel's own counts at close. Options are the
    hook's own (no rings: see BpfHook)."""

    object_name: ClassVar[str]

    def __init__(self, options: OptionsT | HookOptions | None = None) -> None:
        super().__init__(options)
        self.obj: BpfObject | None = None
        self._detached = False

    def attach(self, obj: BpfObject) -> None:
        """Attach the loaded programs. Override for programs that attach to
        something other than their section name (perf events, iterators); set
        ``self.status.variant`` / ``programs`` there if the defaults mislead."""
        obj.attach_all()

    def detach(self) -> None:
        """Stop the programs; rings and maps stay readable. Stopping before the
        final drain means the rows, drops and counters read then are final."""
        if self.obj is not None:
            self.obj.detach()
        self._detached = True

    def stop(self) -> Iterator[tuple[str, Rows]]:
        try:
            self.detach()
            yield from self.final_rows()
        finally:
            self.close()

    def final_rows(self) -> Iterator[tuple[str, Rows]]:
        """What is left once detached; override where rows are not only rings."""
        return self.poll()

    def drops(self) -> int:
        """Records the kernel could not hand over (see BpfHook)."""
        return 0

    def missed(self) -> int:
        """Runs of this hook's programs that the kernel skipped (recursion guard)."""
        if self.obj is None:
            return 0
        progs = [p for p in self.obj.programs.values() if p.autoload and p.fd >= 0]
        return sum(libbpf.prog_info(p.fd).recursion_misses for p in progs)

    def counters(self) -> dict[str, int]:
        """Hook-specific in-kernel counters, kept in the manifest at stop."""
        return {}

    def close(self) -> None:
        if self.obj is not None and self.obj.loaded:
            self.status.drops = self.drops()
            self.status.missed = self.missed()
            self.status.counters = self.counters()
            by_cpu = getattr(self, "drops_by_cpu", None)
            self.status.drops_by_cpu = by_cpu() if by_cpu is not None else []
        if self.obj is not None:
            self.obj.close()
            self.obj = None


class BpfHook(BpfObjectHook[BpfOptionsT]):
    """Loads ``bpf/<object_name>.bpf.c``'s object; each table drains one ring.

    The order of ``rings`` is the order of drop slots in the object's ``drops``
    map (the slot passed to KMO_RESERVE).
    """

    Options: ClassVar[type[HookOptions]] = BpfHookOptions
    #: table name -> ring buffer map name
    rings: ClassVar[dict[str, str]]
    needs = ("tp_btf|raw_tp", "ringbuf")
    #: rows come from the records alone (rows_from keeps no state), so the rings can
    #: go through a spool and rows be made later (kernmlops.spool)
    spoolable: ClassVar[bool] = True
    #: the programs submit with common.h's KMO_SUBMIT / KMO_BATCH_PUSH, which wake
    #: the collector when a ring passes a quarter full (DRAIN_FRACTION); False (a program of its
    #: own that submits with BPF_RB_NO_WAKEUP): the session polls at least every
    #: collector.poll_max_interval_ms
    wakes_at_fill: ClassVar[bool] = True

    def __init__(self, options: BpfOptionsT | HookOptions | None = None) -> None:
        super().__init__(options)
        self._readers: dict[str, tuple[RingBuffer | RingGroup, RecordLayout]] = {}
        self._last_drain: dict[str, float] = {}
        self._staged_read: set[str] = set()
        self._spec: ObjectSpec | None = None
        #: table -> (its ring, or its rings' group, bytes of one ring record), mapped
        #: at start
        self._rings: dict[str, tuple[RingBuffer | RingGroup, int]] = {}
        #: the rings user space made for groups 1.. (ring_groups), to close
        self._group_fds: list[int] = []
        #: table -> its ring's spool, when the session spools
        self._spools: dict[str, RingSpool] = {}
        self._spare: Any = None  # kernmlops.spool.pacing.Pacer
        #: the rings were emptied into their spools after detach and unmapped
        self._unmapped = False
        #: move the spooled rings into their spools without Python, where they can: one
        #: copier thread per ring group
        self._copiers: list[Copier] = []
        self._copiers_since = 0.0  # when they started (monotonic)
        # (the time just before the last look read them, each copier's CPU s then);
        # the busiest window since
        self._copier_seen: tuple[float, list[float]] = (0.0, [])
        self._copier_peak = 0.0

    @classmethod
    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "rings" in cls.__dict__ and "tables" not in cls.__dict__:
            cls.tables = tuple(cls.rings)
        # A hook that reads its rings its own way (its own poll) keeps them: only
        # rows_from is called on spooled records.
        if ("poll" in cls.__dict__ or "final_rows" in cls.__dict__) and (
            "spoolable" not in cls.__dict__
        ):
            cls.spoolable = False

    def extra_globals(self) -> dict[str, int | bool]:
        """Hook-specific ``const volatile`` settings."""
        return {}

    def extra_max_entries(self) -> dict[str, int]:
        """Sizes of hook-specific maps (map name -> max_entries), set before load."""
        return {}

    def variants(self) -> Sequence[str | None]:
        """Program variants to try, in order (see ``open_and_load``)."""
        return VARIANTS

    def ring_plan(self) -> tuple[int, int]:
        """(rings per table, CPUs per ring) on this machine: ring_groups (or its
        default) as its CPUs split (ring_group_plan)."""
        return ring_group_plan(self.options.groups, cpu_span())

    def notes(self) -> list[str]:
        """ring_groups asking for more rings than this machine's CPUs make: not refused
        (a config moves between machines), said, with what runs instead."""
        asked = self.options.ring_groups
        if asked is None:
            return []
        rings, per = self.ring_plan()
        if rings == asked:
            return []
        cpus = cpu_span()
        return [
            f"hooks.{self.name}.ring_groups is {asked}, but this machine's {cpus} CPU(s) "
            f"make {rings} ring(s) per table ({per} CPU(s) a ring; at most one ring per "
            f"CPU): {rings} run"
        ]

    def start(self, ctx: HookContext) -> None:
        path = object_path(self.object_name, ctx.bpf_dir)
        size = self.options.ring_bytes
        flt = ctx.process_filter
        if not path.exists():
            raise HookUnavailable(
                f"{self.name}: BPF object {path} not found (build it: kernmlops build-bpf)"
            )
        try:
            spec = object_spec(path)
            # the records' layouts are known before anything is spooled: a start that
            # fails past here (a bug in attach) still makes rows of what it spooled
            self._spec = spec
            missing = sorted(set(self.rings.values()) - set(spec.btf.rings()))
            if missing:
                raise HookUnavailable(f"{self.name}: {path.name} declares no ring {missing[0]!r}")
            groups, per = self.ring_plan()
            # each ring's array of group rings: as many slots as groups (1: unused)
            outer = {f"{ring}_groups": groups for ring in self.rings.values() if groups > 1}
            self.obj = open_and_load(
                path,
                globals_={
                    "kmo_self_tgid": ctx.self_tgid,
                    "kmo_filter_on": flt is not None,
                    **self._group_globals(spec, path, groups, per),
                    **self.extra_globals(),
                },
                max_entries={
                    **dict.fromkeys(self.rings.values(), size),
                    **outer,
                    **self.extra_max_entries(),
                },
                reuse_maps={"kmo_tracked": flt.fd} if flt else {},
                variants=self.variants(),
                spec=spec,
            )
            self.status.variant = self.obj.variant
            self.status.programs = [p.section for p in self.obj.programs.values() if p.autoload]
            for table, ring in self.rings.items():
                # One ring record's size (a batch's, for a batched ring): enough to
                # spill before the layouts (numpy dtypes) exist.
                batch = spec.btf.ring_batch(ring)
                record = batch or spec.btf.ring_record(ring)
                reader: RingBuffer | RingGroup = RingBuffer(self.obj.map(ring).fd, size, name=ring)
                if groups > 1:
                    reader = RingGroup([reader, *self._group_rings(ring, groups, size)])
                self._rings[table] = (reader, record.size)
                if ctx.spool_dir is not None and self.spoolable:
                    info = {
                        "hook": self.name,
                        "options": self.options.model_dump(mode="json"),
                        "ring": ring,
                        "object": str(path.resolve()),
                        # recovery decodes only with objects laying records out so
                        "layout": spec.btf.ring_fingerprint(ring),
                    }
                    # A batch's records shuffled at their own size compress better
                    # and faster on disk (kernmlops.spool.frames).
                    shuffle = spec.btf.ring_record(ring).size if batch is not None else 0
                    self._spools[table] = RingSpool(
                        ctx.spool_dir, table, record.size, info,
                        memory=ctx.spool_memory, shuffle=shuffle,
                    )  # fmt: skip
            self._start_copier(ctx)
            self._spare = ctx.spare
            self.attach(self.obj)
        except (KernmlopsError, OSError) as err:
            self.close()
            if isinstance(err, HookUnavailable):
                raise
            raise HookUnavailable(f"{self.name}: {err}") from err
        self._last_drain = dict.fromkeys(self.rings, time.monotonic())
        self.status.rings = groups
        self.status.attached = True

    def _group_globals(
        self, spec: ObjectSpec, path: Any, groups: int, per: int
    ) -> dict[str, int | bool]:
        """The ``const volatile`` settings of ring groups (common.h, KMO_RING_OF);
        none for one group: the object loads as it did before groups."""
        if groups == 1:
            return {}
        if "kmo_ring_groups" not in spec.globals:
            raise HookUnavailable(
                f"{self.name}: {path.name} was built without ring groups (ring_groups "
                f"{groups}): rebuild it (kernmlops build-bpf)"
            )
        shift = per.bit_length() - 1 if per & (per - 1) == 0 else -1
        return {"kmo_ring_groups": groups, "kmo_ring_group_cpus": per,
                "kmo_ring_group_shift": shift}  # fmt: skip

    def _group_rings(self, ring: str, groups: int, size: int) -> list[RingBuffer]:
        """(Loaded, before attach) rings 1.. of ``ring``'s groups, made here and put in
        ``<ring>_groups`` beside ring 0 (the object's own map)."""
        assert self.obj is not None
        outer = self.obj.map(f"{ring}_groups")
        outer.update(0, self.obj.map(ring).fd.to_bytes(4, "little"))
        readers = []
        for group in range(1, groups):
            fd = libbpf.create_ringbuf(f"{ring[:11]}_g{group}", size)
            self._group_fds.append(fd)
            outer.update(group, fd.to_bytes(4, "little"))
            readers.append(RingBuffer(fd, size, name=f"{ring}[{group}]"))
        return readers

    def _start_copier(self, ctx: HookContext) -> None:
        """Hand the spooled rings to the native copier (kernmlops.ebpf.copier): from
        here the poll loop only makes rows; the copy no longer waits for the GIL."""
        if not self._spools:
            return
        if not copier_available():
            self.status.copier = {"native": False}
            return
        memory = next(iter(self._spools.values())).memory
        interval_ms = self.options.batch_ms or ctx.poll_interval_ms
        if not self.wakes_at_fill:  # its programs cannot wake the copier
            interval_ms = min(interval_ms, ctx.poll_max_interval_ms)
        workers = ctx.copier_workers
        if workers is None:
            workers = copier_workers()
        groups = max(len(_ring_list(r)) for r, _ in self._rings.values())
        workers = zstd_workers_per_copier(workers, groups, self.options.ring_bytes)
        quarter = self.options.ring_bytes // 4
        copiers: list[Copier] = []
        try:
            # One copier thread per ring group, each moving its group's ring of every
            # table; a table's rings all write into its one spool.
            for _ in range(groups):
                copiers.append(Copier(
                    interval_ms=interval_ms,
                    budget=memory.budget if memory is not None else None,
                    frame_raw=min(FRAME_RAW_MAX, max(FRAME_RAW, min(quarter, workers << 19))),
                    sync_bytes=SYNC_BYTES,
                    workers=workers,
                    runway_s=ctx.spool_runway_s,
                    keep_free=ctx.spool_keep_free,
                ))  # fmt: skip
            for table, spool in self._spools.items():
                reader, _ = self._rings[table]
                rings = _ring_list(reader)
                copied = [c.add(table, r.fd, r.size, wakes=self.wakes_at_fill,
                                shuffle=spool.shuffle)
                          for c, r in zip(copiers, rings, strict=True)]  # fmt: skip
                spool.attach(copiers[0], copied[0], list(zip(copiers[1:], copied[1:], strict=True)))
        except BaseException:
            for spool in self._spools.values():
                spool.detach()
            for c in copiers:
                c.close()
            raise
        for c in copiers:
            c.start(ctx.copier_priority)
        self._copiers = copiers
        # the first window from the first thread's start: its CPU counts from there
        self._copiers_since = time.monotonic() - max(c.ran_s or 0.0 for c in copiers)
        self._copier_seen = (self._copiers_since, [0.0] * len(copiers))
        copier = copiers[0]
        self.status.copier = {
            "native": True,
            "priority": copier.priority,
            "compressed": copier.compresses,
            **({"error": copier.priority_error} if copier.priority_error else {}),
            **({"nice": copier.nice} if copier.nice is not None else {}),
            **({"copiers": groups} if groups > 1 else {}),
        }

    def _stop_copier(self) -> None:
        """The copier's last copy (every committed record), then the spools go on in
        Python (a CPU's last batch is appended by the poll loop)."""
        if not self._copiers:
            return
        self._watch_copiers()  # the seconds since the loop last looked
        copiers, self._copiers = self._copiers, []
        for copier in copiers:  # every thread stopped before a spool goes on in Python
            copier.stop()
        self.status.copier["zstd_workers"] = sum(c.workers for c in copiers)
        # zstd in memory each copier held from its start (no frame allocates)
        self.status.copier["zstd_static"] = all(c.static_zstd for c in copiers)
        # each copier thread's own CPU (zstd's workers are threads of their own): one
        # busy most of the time is its ring's limit, whatever its size (more groups)
        self.status.copier["cpu_s"] = [round(c.cpu_s, 3) for c in copiers]
        # each over the span its own thread existed (its CPU clock's), not since the
        # copiers were all started: a hook refused at attach runs them for a few ms,
        # mostly the threads' own start, which that shorter span left out (busy 2.5)
        shares = [core_share([0.0], [c.cpu_s], ran) for c in copiers if (ran := c.ran_s)]
        busy = round(max(shares), 3) if shares else None
        self.status.copier["busy"] = busy  # None: no copier thread ran
        self.status.copier["busy_peak"] = (None if busy is None
                                           else round(max(self._copier_peak, busy), 3))  # fmt: skip
        if copiers[0].runway_s:
            self.status.copier["runway"] = _runway_status(copiers)
        # the copier found the budget spent and no standby: it copied nothing meanwhile
        waits = [spool.standby_waits for spool in self._spools.values()]
        self.status.copier["standby_waits"] = sum(n for n, _ in waits)
        self.status.copier["standby_wait_s"] = round(sum(s for _, s in waits), 3)
        stalls = [c.stalls for c in copiers]
        summed = ("slow_writes", "queue_full")
        self.status.copier.update({k: sum(s[k] for s in stalls) if k in summed
                                   else max(s[k] for s in stalls) for k in stalls[0]})  # fmt: skip
        if len(copiers) > 1:
            # what each group's copier moved (bytes): every group's ring was drained
            self.status.copier["copied_bytes"] = [sum(r.copied for r in c.rings)
                                                  for c in copiers]  # fmt: skip
        for spool in self._spools.values():
            spool.detach()
        for copier in copiers:
            copier.close()

    def spill(self) -> None:
        """Move what fills a ring out of it as bytes (no numpy): called while the
        decoding libraries are not imported yet, or while the sink is behind, so the
        rings never overflow. Spooled rings go to their spool, others to memory."""
        if self._spools:
            for table, (reader, _) in self._rings.items():
                self._spools[table].take(reader)
            return
        for reader, itemsize in self._rings.values():
            if reader.pending_bytes() >= reader.size // 4:
                reader.spill(itemsize)

    def spilled_bytes(self) -> int:
        return sum(reader.spilled_bytes for reader, _ in self._rings.values())

    def wake_fds(self) -> Sequence[int] | None:
        if not self.wakes_at_fill:
            return None
        if self._copiers:
            return []  # the copiers are woken, and the loop only makes rows
        return [r.fd for reader, _ in self._rings.values() for r in _ring_list(reader)]

    def readers(self) -> dict[str, tuple[RingBuffer | RingGroup, RecordLayout]]:
        """table -> (ring reader, record layout). The layouts are numpy dtypes, made
        at the first drain: numpy is not imported before every probe is attached."""
        if not self._readers and self._rings and self._spec is not None:
            layouts = self._spec.ring_layouts()
            for table, ring in self.rings.items():
                layout = layouts[ring]
                reader, _ = self._rings[table]
                reader.dtype = layout.batch if layout.batch is not None else layout.dtype
                self._readers[table] = (reader, layout)
        return self._readers

    def _due(self, table: str, reader: RingBuffer | RingGroup, now: float) -> bool:
        """Whether to drain this ring now: detached (the final drain), a quarter
        full, or not drained for ``batch_ms``. Per-batch costs (a frame, a
        write) then stay small at low event rates, and a busy ring is still
        drained every poll."""
        if self._detached or reader.spilled:
            return True
        if reader.pending_bytes() >= reader.size // DRAIN_FRACTION:
            return True
        batch_s = self.options.batch_ms / 1000
        return now - self._last_drain.get(table, 0.0) >= batch_s

    def next_poll(self, now: float) -> float | None:
        """When the first ring falls due (see :meth:`rings_due`)."""
        if type(self).poll is not BpfHook.poll:
            return None  # a poll of its own: every interval (unless it says otherwise)
        return self.rings_due(now)

    def rings_due(self, now: float) -> float | None:
        """When the first ring falls due (see _due): its ``batch_ms``, or sooner
        when the rate it filled at since its last drain makes it a quarter full (a
        ring the loop drains itself, not a native copier); None: at every poll
        interval (the final drain, a spilled ring)."""
        if self._detached or not self._rings:
            return None
        spooling = self._spools and self._spare is not None and self.spooled_bytes()
        if spooling and self._spare.ask():
            return None  # rows wait in the spool and the CPU is spare: keep making them
        batch_s = self.options.batch_ms / 1000
        due = math.inf
        for table, (reader, _) in self._rings.items():
            if reader.spilled:
                return None
            last = self._last_drain.get(table, now)
            due = min(due, last + batch_s)
            if self._copiers:
                # Its copier drains it, woken by the ring: the loop's "drain" only looks
                # at what the copier did, and the ring's fill since that look is no reason
                # to look again (it woke the loop every 10 ms until the copier's next
                # quarter: 30 wake-ups a second under a storm, for nothing).
                continue
            pending = reader.pending_bytes()
            if pending and now > last:
                rate = pending / (now - last)
                due = min(due, now + max(0.0, reader.size // DRAIN_FRACTION - pending) / rate)
        return due

    def drain_due(self) -> Iterator[tuple[str, np.ndarray, RecordLayout]]:
        """(table, records, layout) of each ring that is due (see _due) and not
        empty; every record counts as one event."""
        now = time.monotonic()
        for table, (reader, layout) in self.readers().items():
            if not self._due(table, reader, now):
                continue
            self._last_drain[table] = now
            records = reader.drain()
            if layout.batch is not None:
                records = unbatch(records, layout)
                if self._detached and table not in self._staged_read:
                    # what each CPU still held when the programs stopped
                    self._staged_read.add(table)
                    stage = self.obj.map(self.rings[table] + "_stage")  # type: ignore[union-attr]
                    held = unbatch(stage.lookup_percpu(0, dtype=layout.batch), layout)
                    records = np.concatenate([records, held])
            if len(records):
                self.status.events += len(records)
                yield table, records, layout

    def poll(self) -> Iterator[tuple[str, Rows]]:
        if self._spools:
            yield from self._poll_spooled()
            return
        for key, records, layout in self.drain_due():
            yield from self.rows_from(key, records, layout)

    def rows_from(
        self, key: str, records: np.ndarray, layout: RecordLayout
    ) -> Iterator[tuple[str, Rows]]:
        """(table, rows) of ring ``key``'s records (unbatched). Override to split or
        derive; keep it pure (no state from start): a recovery calls it on a hook
        that never started."""
        yield key, self.to_frame(key, records, layout)

    def _poll_spooled(self) -> Iterator[tuple[str, Rows]]:
        """Copy due rings into their spools; make rows from the spools when the
        machine has CPU to spare, and all of them once detached."""
        now = time.monotonic()
        self._watch_copiers()
        readers = self.readers()
        if self._detached:
            self._settle_spools()
        else:
            for key, (reader, _) in readers.items():
                if self._due(key, reader, now):
                    self._last_drain[key] = now
                    self._spools[key].take(reader)
            if self._spare is not None and not self._spare.ask():
                return  # the workload has the CPU: the rows wait in the spool
        more = None
        if not self._detached and self._spare is not None:
            # Rows for at most ROWS_BUDGET_S a poll: the rings are copied again soon
            # (a window of idle CPU may end within the poll).
            until, pacer = now + ROWS_BUDGET_S, self._spare

            def more() -> bool:
                return time.monotonic() < until and pacer.ask()

        for key, (_, layout) in readers.items():
            spool = self._spools[key]
            for records in spool.records(layout.batch or layout.dtype, more=more):
                if layout.batch is not None:
                    records = unbatch(records, layout)
                if not len(records):
                    continue
                self.status.events += len(records)
                spool.count_records(len(records))
                for table, rows in self.rows_from(key, records, layout):
                    spool.count(table, rows.num_rows if hasattr(rows, "num_rows") else len(rows))
                    yield table, rows

    def _watch_copiers(self, clock: Callable[[], float] = time.monotonic) -> None:
        """The busiest copier's share of a core over windows of COPIER_WINDOW_S or
        more (as often as the loop polls): a storm's seconds, which the run's
        average hides. Each thread's CPU clock is read between two readings of
        ``clock``: a window runs from the reading before the last look's CPU to the
        one after this look's, so it holds all the CPU counted in it."""
        at, cpu = self._copier_seen
        before = clock()
        if not self._copiers or before - at < COPIER_WINDOW_S:
            return
        spent = [c.cpu_s for c in self._copiers]
        after = clock()
        self._copier_peak = max(self._copier_peak, core_share(cpu, spent, after - at))
        self._copier_seen = (before, spent)

    def _settle_spools(self) -> None:
        """(Detached) everything the rings and the CPUs' batches still hold moved into
        the spools, and the rings unmapped: from now on only the spools hold records."""
        self._stop_copier()
        if self._unmapped:
            return
        readers = self.readers()
        for key, (reader, layout) in readers.items():
            self._spools[key].take(reader)
            if layout.batch is not None and key not in self._staged_read:
                # what each CPU still held when the programs stopped
                self._staged_read.add(key)
                stage = self.obj.map(self.rings[key] + "_stage")  # type: ignore[union-attr]
                self._spools[key].append(stage.lookup_percpu(0, dtype=layout.batch))
        # Every record is in the spool now: unmap the rings before the rows are made
        # (a ring's pages count in RSS: 8 MiB per 4 CPUs by default).
        self._unmapped = True
        for reader, _ in readers.values():
            reader.close()

    def spool_work(self) -> list[SpoolWork]:
        """(Detached) what each spool holds that has no rows yet, once every record is
        in it: for rows made on other cores (kernmlops.collect.rowmaking), which then
        report them with :meth:`spool_made`. Nothing is marked read here: rows not
        reported are made by the final drain as usual."""
        if not self._spools or not self._detached or self.obj is None:
            return []  # a closed hook (one refused at its start): its spool too (EBADF)
        self._settle_spools()
        work = []
        for spool in self._spools.values():
            pieces = spool.unread()
            if pieces:
                work.append(SpoolWork(spool.folder, spool.key, pieces))
        return work

    def spool_made(self, key: str, rows: dict[str, int], events: int) -> None:
        """The rows of every record :meth:`spool_work` gave for ``key`` are in finished
        parts: its spool is read to its end."""
        self._spools[key].read_to_end(rows, events)
        self.status.events += events

    def spooled_bytes(self) -> int:
        return sum(spool.pending for spool in self._spools.values())

    def checkpoint_spool(self, finished: dict[str, int]) -> None:
        for spool in self._spools.values():
            spool.checkpoint(finished)

    def to_frame(self, table: str, records: np.ndarray, layout: RecordLayout) -> Rows:
        """Override to derive columns; the default keeps the record's fields (Arrow:
        no DataFrame library in a collection that does not transform rows)."""
        return records_to_table(records, layout)

    def drop_slots(self) -> range:
        """The slots of the object's ``drops`` map this hook counts into: one per
        ring (KMO_RESERVE's slot); a map-based hook names its own."""
        return range(len(self.rings))

    def drops(self) -> int:
        if self.obj is None or "drops" not in self.obj.maps:
            return 0
        drops = self.obj.map("drops")
        return sum(drops.percpu_total(slot) for slot in self.drop_slots())

    def drops_by_cpu(self) -> list[int]:
        """Records lost per CPU (all of the hook's drop slots), [] where none were."""
        slots = self.drop_slots()
        if self.obj is None or "drops" not in self.obj.maps or not slots or not self.drops():
            return []
        drops = self.obj.map("drops")
        per_cpu = sum(drops.lookup_percpu(slot) for slot in slots)
        return [int(n) for n in per_cpu]

    def close(self) -> None:
        self._stop_copier()
        for spool in self._spools.values():
            spool.close()  # the files stay: the session deletes them once rows are safe
        for reader, _ in self._rings.values():
            reader.close()
        self._rings.clear()
        self._readers.clear()
        super().close()
        fds, self._group_fds = self._group_fds, []
        for fd in fds:  # after the object: its array of rings let go of them too
            os.close(fd)
