"""What every hook is: options, needs, tables, and a start / poll / stop cycle."""

from __future__ import annotations

import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field

from kernmlops.registry import options_model, options_of

if TYPE_CHECKING:
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.tables import Rows


class HookOptions(BaseModel):
    """Base of each hook's config section; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


#: a hook's options model: ``class MemoryUsageHook(SampledHook[MemoryUsageOptions])``
#: types ``self.options`` and sets ``MemoryUsageHook.Options`` (its config section)
OptionsT = TypeVar("OptionsT", bound=HookOptions)


@dataclass
class HookContext:
    """What a session hands every hook when it starts."""

    collection_id: str
    #: Process filter shared by all BPF hooks (map fd reused by each object).
    process_filter: ProcessFilter | None
    #: The collector's own tgid, ignored in the kernel.
    self_tgid: int
    bpf_dir: Any = None  # pathlib.Path of the built objects
    #: where rings are spooled (kernmlops.spool), None: rows straight from rings
    spool_dir: Any = None
    #: the spools' memory budget on a tmpfs (kernmlops.spool.memory.SpoolMemory), or None
    spool_memory: Any = None
    #: whether rows may be made now (kernmlops.spool.pacing.Pacer: CPU to spare and the sink
    #: keeping up); None: always
    spare: Any = None
    #: SCHED_FIFO priority of the native ring copier's thread (0: normal priority)
    copier_priority: int = 0
    #: zstd worker threads beside each copier (None: from the CPU count)
    copier_workers: int | None = 0
    #: seconds of a spool's disk writes allocated ahead (collector.spool_runway_s), and
    #: the free bytes that allocation leaves on the filesystem at least
    spool_runway_s: float = 0.0
    spool_keep_free: int = 0
    #: the collector's poll_interval_ms and poll_max_interval_ms (the copier's sleeps)
    poll_interval_ms: int = 10
    poll_max_interval_ms: int = 100
    #: the benchmark's process, held at its gate while hooks start (None: no benchmark
    #: process); Hook.benchmark_started follows once its command is exec'd
    benchmark_pid: int | None = None


@dataclass
class HookStatus:
    """Per-hook facts for the summary table and the manifest."""

    name: str
    attached: bool = False
    reason: str | None = None
    variant: str | None = None
    programs: list[str] = field(default_factory=list)
    events: int = 0
    #: records a full ring buffer could not take (counted in the kernel)
    drops: int = 0
    #: program runs the kernel skipped (recursion guard), so events not seen
    missed: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    #: parts the hook asked for that this machine cannot provide (e.g. perf
    #: events), name -> reason: in the manifest, never silently missing
    unsupported: dict[str, str] = field(default_factory=dict)
    #: the hook's own in-kernel counters at stop (e.g. block_io's completions
    #: of requests issued before the start)
    counters: dict[str, int] = field(default_factory=dict)
    #: records lost per CPU (index = CPU), where any were lost
    drops_by_cpu: list[int] = field(default_factory=list)
    #: what the hook saw set against the kernel's own count of it, where it has one
    #: (block_io: each disk's completions against /proc/diskstats), or why not
    reconciliation: dict[str, Any] = field(default_factory=dict)
    #: how the rings reached the spool: native (the C copier) or python, and the
    #: copier thread's real-time priority or why it has none
    copier: dict[str, Any] = field(default_factory=dict)
    #: a sampled hook's files read by the native sampler: its thread's real-time
    #: priority or why it has none (empty: sampled in Python)
    sampler: dict[str, Any] = field(default_factory=dict)
    #: a BPF hook's rings per table that ran (its ring_groups, as this machine's CPUs
    #: split: the config keeps what was asked); None: no rings
    rings: int | None = None
    #: it raised what no hook should (a bug) while the collection ran: detached then,
    #: ``reason`` says what failed; the other hooks went on
    failed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "attached": self.attached,
            "reason": self.reason,
            "variant": self.variant,
            "programs": self.programs,
            "events": self.events,
            "drops": self.drops,
            "missed": self.missed,
            "rows": self.rows,
            "unsupported": self.unsupported,
            "counters": self.counters,
            "drops_by_cpu": self.drops_by_cpu,
            "copier": self.copier,
            **({"sampler": self.sampler} if self.sampler else {}),
            **({"reconciliation": self.reconciliation} if self.reconciliation else {}),
            **({"rings": self.rings} if self.rings is not None else {}),
            **({"failed": True} if self.failed else {}),
        }


class Hook(ABC, Generic[OptionsT]):
    """A source of tables. BPF hooks load an object; pollers read /proc.

    Generic over its options model (``Hook[MyOptions]``): ``self.options`` is a
    ``MyOptions`` and ``Options`` (the hook's config section) is set from it."""

    name: ClassVar[str]
    Options: ClassVar[type[HookOptions]] = HookOptions
    #: Names of tables this hook writes.
    tables: ClassVar[tuple[str, ...]] = ()
    #: Capabilities needed (see kernmlops.ebpf.probe), for doctor.
    needs: ClassVar[tuple[str, ...]] = ()
    #: Libraries the hook builds rows with beyond numpy and pyarrow (e.g. "polars"):
    #: the session imports them in the background once the probes are attached.
    libraries: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        model = options_model(cls, HookOptions)
        if model is not None:
            cls.Options = model

    def __init__(self, options: OptionsT | HookOptions | None = None) -> None:
        #: the hook's own section (defaults for None, validated once from a base section)
        self.options: OptionsT = cast(OptionsT, options_of(self.Options, options))
        self.status = HookStatus(name=self.name)

    def written_tables(self) -> tuple[str, ...]:
        """The tables this hook writes as configured (``tables`` are its defaults' when
        its options choose them, as task_perf's events do)."""
        return self.tables

    def notes(self) -> list[str]:
        """What the hook has to say before it starts, one warning each: a setting this
        machine cannot honour as asked, and what it does instead (none by default)."""
        return []

    @abstractmethod
    def start(self, ctx: HookContext) -> None:
        """Load and attach. Raise HookUnavailable with the reason if the kernel refuses."""

    @abstractmethod
    def poll(self) -> Iterator[tuple[str, Rows]]:
        """Yield (table, rows) collected since the last poll. Called every poll interval."""

    def next_poll(self, now: float) -> float | None:
        """The monotonic time by which this hook needs its next poll; None: every
        poll interval (``collector.poll_interval_ms``). The session sleeps until the
        earliest of its hooks' times, so a quiet collection wakes a few times a
        second instead of a hundred."""
        return None

    def flushing(self) -> Iterator[tuple[str, Rows]]:
        """Rows held back from :meth:`poll` that the session's coming flush must
        include (a sampled hook's samples): called right before each flush, so no
        row waits in memory longer than ``collector.flush_interval_s``."""
        return iter(())

    def wake_fds(self) -> Sequence[int] | None:
        """File descriptors that tell, readable in an edge-triggered epoll, that this
        hook needs a poll sooner than :meth:`next_poll` said (a ring filling faster
        than it did); ``()``: its times are exact. None: nothing tells, so the
        session polls at least every ``collector.poll_max_interval_ms``."""
        return ()

    def spill(self) -> None:
        """Keep kernel buffers from overflowing without building rows: while numpy
        and polars are being imported, or while the sink is behind. Rows come at
        the next poll."""

    def spilled_bytes(self) -> int:
        """Bytes :meth:`spill` holds in memory for the next poll."""
        return 0

    def detach(self) -> None:
        """Stop producing events; what was produced stays readable for :meth:`stop`."""

    def benchmark_started(self, pid: int) -> None:
        """The gate opened and ``pid`` exec'd the benchmark's command (or a bounded
        wait for that exec ran out: see GatedProcess.wait_exec)."""

    def benchmark_ending(self) -> None:
        """The benchmark is over, or about to be stopped: what it started is still
        there, its main process at most a zombie not yet reaped. Called once or
        twice (when the loop sees the exit, and before the stop), before detach()."""

    def spooled_bytes(self) -> int:
        """Bytes of records waiting in this hook's spool for rows to be made."""
        return 0

    def rows_settled(self, waiting: bool) -> None:
        """The collection is over and ``status.rows`` holds the rows its tables got
        (``waiting``: records are left in the spool for ``kernmlops recover``, so more
        may come): a hook that knows how many rows it made checks them here."""

    def checkpoint_spool(self, finished: dict[str, int]) -> None:
        """At a flush: make spooled records durable (see kernmlops.spool);
        ``finished``: rows per table in finished parts."""

    def stop(self) -> Iterator[tuple[str, Rows]]:
        """Final rows, then detach and release every fd. Must be safe to call twice."""
        yield from self.poll()
        self.close()

    def close(self) -> None:
        """Release kernel resources; idempotent."""


class SampledHookOptions(HookOptions):
    """Options every sampling hook has."""

    poll_hz: float = Field(10, gt=0, le=1000, description="samples per second")


SampledOptionsT = TypeVar("SampledOptionsT", bound=SampledHookOptions)


class SampledHook(Hook[SampledOptionsT]):
    """A hook that samples something (/proc files, counters) at a fixed rate.

    Sampling runs in a thread of its own, on a fixed grid of ``1 / poll_hz``, so an
    event storm that keeps the drain loop busy cannot starve it. An interval whose
    sample could not be taken in time (the thread woke a whole period late) is
    counted in ``status.drops``: a gap in the table is never silent. The poll loop
    only collects what the thread sampled.

    A subclass opens its source in :meth:`start` and then calls
    :meth:`_start_sampling`; :meth:`_sample` appends to ``self._rows``,
    :meth:`_frames` turns what was taken into tables, :meth:`_release` closes the
    source.

    A hook whose sample is "read these open files whole" (/proc/meminfo) names them
    in :meth:`native_files`: a native thread then reads them at each tick without the
    GIL, at SCHED_FIFO (kernmlops.ebpf.sampler), and :meth:`_sampled` turns each read
    into what :meth:`_sample` would have appended. Python's thread needs the GIL,
    which a storm of more runnable tasks than CPUs keeps from it for most ticks.
    """

    Options: ClassVar[type[HookOptions]] = SampledHookOptions
    #: take one more sample at stop, whatever the grid says (the last row closes
    #: every delta of cumulative counters at the end of the collection)
    sample_at_stop: ClassVar[bool] = False

    def __init__(self, options: SampledOptionsT | HookOptions | None = None) -> None:
        super().__init__(options)
        self._period_ns = max(1, round(1e9 / self.options.poll_hz))
        self._rows: list[Any] = []
        self._lock = threading.Lock()
        self._stop_sampling = threading.Event()
        self._sampler: threading.Thread | None = None
        self._native: Any = None  # kernmlops.ebpf.sampler.NativeSampler, while it runs
        self._last_ns = 0  # the native sampler's last sample
        self._failed_at: int | None = None  # its last sample, once a read failed
        self._handed_over = 0.0
        #: SCHED_FIFO priority of the native sampler's thread (the ring copier's)
        self._priority = 1

    @abstractmethod
    def _sample(self, now_ns: int) -> None:
        """Take one sample and append it to ``self._rows`` (called with the sampling
        lock held)."""

    def native_files(self) -> list[int] | None:
        """The open files a sample reads whole, for the native sampler; None: samples
        are taken by :meth:`_sample` in Python."""
        return None

    def _sampled(self, now_ns: int, data: list[bytes]) -> None:
        """Append what :meth:`_sample` would have for the native sampler's read of
        :meth:`native_files` (``data``: each file's bytes) at ``now_ns``."""
        raise NotImplementedError

    def _take(self) -> Any:
        """Swap out the rows sampled so far (called with the sampling lock held, so
        it is a swap: the sampler waits for the lock)."""
        rows, self._rows = self._rows, []
        return rows

    def _pull_native(self) -> None:
        """(With the sampling lock held) the native sampler's reads so far into the
        rows, its missed ticks into the drops."""
        native = self._native
        if native is None:
            return
        for now_ns, data in native.take():
            self._sampled(now_ns, data)
            self.status.events += 1
            self._last_ns = now_ns
        self.status.drops += native.missed
        if native.error:  # its thread ended: the ticks from here to the stop are drops
            self._native = None
            native.close()
            self.status.sampler["read_error"] = os.strerror(native.error)
            self._failed_at = self._last_ns  # its last sample: no tick after it had one

    @abstractmethod
    def _frames(self, taken: Any) -> Iterator[tuple[str, Rows]]:
        """The tables of rows :meth:`_take` returned (called without the lock: building
        frames, and the first import of polars, must not make the sampler late)."""

    def _release(self) -> None:
        """Close what :meth:`start` opened; idempotent."""

    def _start_sampling(self, period_ns: int | None = None) -> None:
        """Sample now, then every ``period_ns`` (default: ``1 / poll_hz``) until
        :meth:`_stop_sampler`."""
        period_ns = period_ns or self._period_ns
        if not self._start_native(period_ns):
            self._start_python(period_ns)

    def _start_python(self, period_ns: int) -> None:
        with self._lock:
            self._sample(_monotonic_ns())
        self._stop_sampling.clear()
        self._sampler = threading.Thread(
            target=self._run, args=(period_ns,), name=f"kernmlops-{self.name}", daemon=True
        )
        self._sampler.start()

    def _start_native(self, period_ns: int) -> bool:
        """Sample with the native sampler where the hook names its files and the
        library is there; whether it started."""
        files = self.native_files()
        if not files:
            return False
        from kernmlops.ebpf import sampler

        if not sampler.available():
            return False
        # an hour of samples Python has not taken, at most (the buffer grows as they
        # wait: a storm keeps Python off the CPU for tens of seconds on 2 vCPUs);
        # past that its ticks count as missed
        per_s = sum(_file_size(fd) + sampler.HEAD.size + 8 for fd in files) * 1e9 / period_ns
        size = max(1 << 20, min(256 << 20, int(per_s * 3600)))
        native = sampler.NativeSampler(files, period_ns, size, self.name)
        self._last_ns = _monotonic_ns()
        native.start(self._priority)
        self._native = native
        self.status.sampler = {
            "native": True,
            "priority": native.priority,
            **({"error": native.priority_error} if native.priority_error else {}),
            **({"nice": native.nice} if native.nice is not None else {}),
        }
        return True

    def _run(self, period_ns: int) -> None:
        due = _monotonic_ns() + period_ns
        while not self._stop_sampling.wait(max(0, due - _monotonic_ns()) / 1e9):
            if _monotonic_ns() < due:
                continue  # woke early (timer slack)
            with self._lock:
                now = _monotonic_ns()  # the time the sample is really taken
                self._sample(now)
                # Whole periods slept through (starved, or the lock held) were not sampled.
                late = (now - due) // period_ns
                self.status.drops += late
            due += (late + 1) * period_ns

    def _stop_sampler(self) -> None:
        if self._native is not None:
            self._native.stop()  # what it read stays for the last take
        self._stop_sampling.set()
        if self._sampler is not None:
            self._sampler.join()
            self._sampler = None

    #: hand rows to the sink at most this often: a frame per sample (10 Hz, 100 Hz)
    #: costs the collector more than the sampling itself, and building a table costs
    #: per column, not per row (memory_usage's 55 columns: ~0.3 ms a table, as much
    #: again to size and queue it, ~1.5 ms with the loop's cold caches). A session
    #: takes the samples at each flush (flushing), so this is the pace only between
    #: flushes further apart, or without a session.
    hand_over_s: ClassVar[float] = 5.0

    def next_poll(self, now: float) -> float | None:
        if type(self).poll is not SampledHook.poll:
            return None  # a poll of its own: every interval
        return self._handed_over + self.hand_over_s

    def poll(self) -> Iterator[tuple[str, Rows]]:
        now = time.monotonic()
        if now - self._handed_over < self.hand_over_s:
            return
        self._handed_over = now
        yield from self._take_all()

    def flushing(self) -> Iterator[tuple[str, Rows]]:
        self._handed_over = time.monotonic()
        yield from self._take_all()

    def _take_all(self) -> list[tuple[str, Rows]]:
        with self._lock:
            self._pull_native()
            taken = self._take()
        return list(self._frames(taken))

    def stop(self) -> Iterator[tuple[str, Rows]]:
        running = self._sampler is not None or self._native is not None
        self._stop_sampler()  # no sample may land between the last poll and close
        with self._lock:
            self._pull_native()
            if self._failed_at is not None:  # the ticks after its last sample
                self.status.drops += (_monotonic_ns() - self._failed_at) // self._period_ns
                self._failed_at = None
            if self.sample_at_stop and running:
                self._sample(_monotonic_ns())
            taken = self._take()
        yield from list(self._frames(taken))
        self.close()

    def close(self) -> None:
        self._stop_sampler()
        if self._native is not None:
            self._native.close()
            self._native = None
        self._release()

    def drops(self) -> int:
        return self.status.drops


def _file_size(fd: int) -> int:
    """Bytes a read of ``fd`` gives now (a /proc file says 0 to stat: read it)."""
    return len(os.pread(fd, 1 << 20, 0))


def _monotonic_ns() -> int:
    # The clock of bpf_ktime_get_ns(), so sampled rows join with the BPF tables.
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)
