"""A collection: the benchmark, the hooks, the poll loop, the sinks, the manifest.

Before anything starts, the output folder is proven writable and roomy enough, and the
manifest is written (``state: running``). Every ``collector.flush_interval_s`` the open
Parquet parts are finished and the manifest is rewritten, so a collector killed at any
instant (SIGKILL, the OOM killer) leaves a readable collection that lost at most one
interval; the benchmark, in a cgroup of its own, dies with it. Whatever else ends it (the
benchmark exits, the duration passes, Ctrl+C, SIGTERM, a failing benchmark, an error in a
hook, a full disk), every program is detached, every collected row that fits on the disk
is flushed, and the manifest is finalised with how it ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import platform
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from kernmlops.benchmarks import get_benchmark
from kernmlops.benchmarks.base import Benchmark, BenchmarkRun
from kernmlops.collect.disk import free_bytes, human_bytes, is_disk_full
from kernmlops.collect.filter import ProcessFilter
from kernmlops.collect.gated import GatedProcess, exit_status
from kernmlops.collect.manifest import (
    BenchmarkRecord,
    HookRecord,
    Manifest,
    manifest_text,
    write_manifest,
)
from kernmlops.collect.output import filesystem, prepare_output, release_reserve
from kernmlops.collect.parquet import ParquetSink
from kernmlops.collect.participants import Participant, configured
from kernmlops.collect.sinks import ThreadedSink
from kernmlops.collect.spool import (
    SPOOL_DIR,
    Pacer,
    leftover_memory,
    pending_spools,
    remove_spool,
    spool_memory,
)
from kernmlops.config import Config
from kernmlops.ebpf.copier import priority_notes
from kernmlops.ebpf.spool import SpoolMemory
from kernmlops.errors import (
    CollectionError,
    ConfigError,
    HookUnavailable,
    KernmlopsError,
    OutputError,
)
from kernmlops.hooks import get_hook
from kernmlops.hooks.base import Hook, HookContext, HookStatus
from kernmlops.host.cgroup import set_oom_score_adj
from kernmlops.host.cpus import SpareCpu, autogroup_nice, set_autogroup_nice
from kernmlops.host.environment import Environment
from kernmlops.host.invoker import Invoker, created_by_mkdir, hand_over, invoker
from kernmlops.host.sysinfo import system_info
from kernmlops.lazy import preload
from kernmlops.tables import Rows, Sink

RESULT_TABLE = "benchmark_result"
#: imported in the background once the probes are attached (see kernmlops.lazy), with
#: each hook's own ``libraries``: rows are Arrow tables, polars only where a hook builds
#: them with it. Also what their first use imports on its own, which would otherwise
#: fall into the first flush under the storm being recorded (tests/test_lazy.py):
#: numpy 2's first ``np.unique`` imports numpy.ma (15 ms on an idle CPU), pyarrow's
#: first array from Python objects (memory_usage's rows) dateutil.relativedelta (26 ms,
#: with locale and calendar)
DECODING_LIBRARIES = (
    "numpy",
    "numpy.ma",
    "pyarrow",
    "pyarrow.parquet",
    "dateutil.relativedelta",
)
#: what ``pyarrow.parquet`` loads through ``pyarrow.fs`` and a collection never uses:
#: the S3, GCS, Azure and HDFS filesystems (libarrow_s3 and the AWS SDK's start-up:
#: 3.5-7 MiB of the collector's RSS, `python -m bench startup`). ``kernmlops collect`` keeps
#: them out of its process (kernmlops.lazy.keep_out); pyarrow.fs then reports them as
#: not built in. pandas too, where it is installed: pyarrow's first array from Python
#: objects would import it (with dateutil's parser and numpy.random) under the storm.
UNUSED_LIBRARIES = (
    "pyarrow._s3fs", "pyarrow._gcsfs", "pyarrow._azurefs", "pyarrow._hdfs", "pandas",
)  # fmt: skip
#: ring records held in memory while the sink is behind; past it the loop blocks on the
#: sink again and a long stall overflows the rings (counted as drops)
MAX_SPILLED_BYTES = 256 << 20
#: the sink's queue when the rings go through a spool: their rows are made only while
#: the sink is not behind (half of this), so the queue has only to keep the writer busy,
#: and the spool is the buffer (a 32 MiB queue filled as a storm ended and the rows
#: came at full speed: 23 MiB of the collector's peak RSS)
SPOOLED_QUEUE_BYTES = 8 << 20
#: the sink's queue once the programs are detached: no ring needs the loop any more
DRAIN_QUEUE_BYTES = 4 << 20
#: the collector's OOM score adjustment while a benchmark runs: the kernel's OOM killer
#: takes the benchmark (adjustment 0) long before the collector that records it
COLLECTOR_OOM_SCORE_ADJ = -900
#: how often, while the benchmark runs, a thread of its own looks at the free space of
#: the collection's filesystem and of the spool's tmpfs (a statvfs each, microseconds),
#: and the poll loop asks the spools and the sink for a failed write: a filling disk
#: stops the benchmark well within 2 s, not at its end
SPACE_CHECK_S = 0.25
#: SIGTERM's grace for a benchmark stopped because the space ran out (5 s otherwise):
#: its rows can no longer be kept
SPACE_STOP_GRACE_S = 1.0


class StrictError(KernmlopsError):
    """--strict and a hook could not attach."""


class OutOfSpace(OutputError):
    """The collection's filesystem, or the spool's tmpfs, filled during the run: the
    message names it, its free space, and the recover command."""


@dataclass
class Progress:
    """What the session reports while it runs (the CLI draws it)."""

    elapsed_s: float
    events: dict[str, int]
    drops: dict[str, int]
    rows: dict[str, int]
    benchmark: str
    #: bytes of records waiting in each hook's spool (rows made later)
    spooled: dict[str, int] = field(default_factory=dict)


@dataclass
class CollectionResult:
    collection_id: str
    path: Path
    benchmark: str
    #: how it ended: completed, failed, duration, interrupted (SIGINT/SIGTERM),
    #: disk_full, error (the manifest's final ``state``)
    ended_by: str
    exit_code: int
    benchmark_exit: int | None
    started_at: datetime
    stopped_at: datetime
    attach_s: float
    hooks: dict[str, HookStatus] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return (self.stopped_at - self.started_at).total_seconds()


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    from kernmlops import __version__
    from kernmlops.ebpf import libbpf

    out = {
        "kernmlops": __version__,
        "python": platform.python_version(),
        "libbpf": libbpf.version(),
    }
    for pkg in ("numpy", "polars", "pyarrow", "pydantic"):
        out[pkg] = version(pkg)
    return out


class Session:
    """Run one collection. ``run()`` returns a result whose ``exit_code`` the CLI exits with."""

    def __init__(
        self,
        config: Config,
        *,
        on_progress: Callable[[Progress], None] | None = None,
        on_attached: Callable[[dict[str, HookStatus]], None] | None = None,
        on_message: Callable[[str], None] | None = None,
        sink: Sink | None = None,
        bpf_dir: Path | None = None,
        hooks: Sequence[Hook] = (),
        participants: Sequence[Participant] = (),
    ) -> None:
        """``hooks``: hook instances run after the configured ones, like them (a
        caller may start them first: attached ones are not started again).
        ``participants``: what else runs beside the hooks and adds to the manifest
        (see kernmlops.collect.participants); the configured ones (the exporter of
        ``collector.export``) come first. Both lists may be extended before run()."""
        self.config = config
        self.on_progress = on_progress
        self.on_attached = on_attached
        #: warnings for the user (low disk space ...)
        self.on_message = on_message
        self.bpf_dir = bpf_dir
        name = config.benchmark.name
        self.benchmark: Benchmark = get_benchmark(name)(config.benchmark_options(name))
        self.collection_id = str(uuid.uuid4())
        self.path = (
            Path(config.collector.output_dir)
            / "curated"
            / f"benchmark={name}"
            / f"collection_id={self.collection_id}"
        )
        self._sink = sink
        self._stop_signal: int | None = None
        #: while the poll loop runs, an eventfd the stop signals' handler writes: its
        #: sleep ends at once
        self._interrupt: int | None = None
        self.extra_hooks: list[Hook] = list(hooks)
        self.participants: list[Participant] = [
            *configured(config.collector, bpf_dir, on_message),
            *participants,
        ]
        #: the manifest as last written (None with a caller's sink: nothing on disk)
        self.manifest: Manifest | None = None
        self._parquet: ParquetSink | None = None
        self._disk_full = False
        self._spool_dir: Path | None = None
        #: the tmpfs folder of the spool's first MiB, while the run uses one
        self._memory: SpoolMemory | None = None
        self._manifests: _Background | None = None
        self._compaction: dict[str, str] = {}
        #: benchmark.cpus / transparent_hugepages / drop_page_cache, applied in run()
        self.environment = Environment()
        #: under sudo, the user the collection's files are given to (run)
        self.invoker: Invoker | None = None
        #: the folders of the output path this run created (given to the invoker too)
        self._created: list[Path] = []
        #: (st_dev, st_ino) of the files the benchmark's output is captured in
        self._captured: dict[str, tuple[int, int]] = {}

    # -- public -------------------------------------------------------------
    def run(self) -> CollectionResult:
        cfg = self.config.collector
        _return_large_frees()
        self.benchmark.check()  # before anything is started or attached
        self.invoker = who = invoker()
        as_user = self.config.benchmark.as_user
        if as_user and who is None and os.geteuid() == 0:
            raise ConfigError(
                "benchmark.as_user (--as-user): no user to run the benchmark as "
                "(SUDO_UID is not set): run kernmlops through sudo, or leave it off"
            )
        self.environment = env = Environment.from_options(self.config.benchmark)
        started_at = datetime.now(UTC)
        if self._sink is None:
            # Pre-flight: a folder that cannot take the collection fails here, before
            # the benchmark runs; the manifest exists from now on.
            self._created = created_by_mkdir(self.path)
            try:
                check = prepare_output(
                    self.path, min_free_mb=cfg.min_free_mb, warn_free_mb=cfg.warn_free_mb
                )
            except OutputError:
                self._hand_over()
                raise
            if check.warning and self.on_message:
                self.on_message(check.warning)
            self.manifest = Manifest(
                collection_id=self.collection_id,
                state="running",
                benchmark=BenchmarkRecord(name=self.config.benchmark.name),
                started_at=started_at.isoformat(),
                output={"path": str(self.path), "free_bytes_at_start": check.free_bytes},
                filter={"mode": cfg.filter, "tgid": cfg.tgid},
                collector_pid=os.getpid(),
                config=self.config.model_dump(mode="json"),
            )
            self._save_manifest()
        own_nice = os.getpriority(os.PRIO_PROCESS, 0)
        own_group = autogroup_nice() if cfg.nice is not None else None
        if cfg.nice is not None:
            # Before any thread starts: on Linux the nice value is per thread. With
            # autogroups the benchmark (a session of its own) is weighed against the
            # collector's session by the sessions' nice: set that too (restored).
            try:
                os.setpriority(os.PRIO_PROCESS, 0, cfg.nice)
                if own_group is not None:
                    set_autogroup_nice(cfg.nice)
            except PermissionError:
                with contextlib.suppress(PermissionError):
                    os.setpriority(os.PRIO_PROCESS, 0, own_nice)
                raise CollectionError(
                    f"collector.nice {cfg.nice} needs root or CAP_SYS_NICE"
                ) from None
        t0 = time.monotonic()
        hooks: list[Hook] = []
        proc: GatedProcess | None = None
        flt: ProcessFilter | None = None
        parquet = (
            None
            if self._sink
            else ParquetSink(
                self.path,
                self.collection_id,
                row_group_rows=cfg.row_group_rows,
                # compaction at stop encodes compactly: the run's parts are written plain
                fast_parts=cfg.compact,
            )
        )
        self._parquet = parquet
        sink: Sink = self._sink or ThreadedSink(
            parquet,  # type: ignore[arg-type]
            max_queued_bytes=SPOOLED_QUEUE_BYTES if cfg.spool else 32 << 20,
        )
        own_oom = _read_oom_score_adj()
        mode = cfg.filter
        ended_by, bench_exit, attach_s = "error", None, 0.0
        errors: list[BaseException] = []
        self.results_error: str | None = None
        workdir = Path(tempfile.mkdtemp(prefix="kernmlops-bench-"))
        outputs: list[IO[bytes]] = []
        old_handlers = self._install_signals()
        try:
            env.apply()  # THP and the page cache; restored in _finish
            self.benchmark.environment = env
            self.benchmark.setup(workdir)
            runs_as = who if as_user else None
            launch = self.benchmark.launch()
            if mode == "auto":
                mode = self.benchmark.default_filter
            if mode == "tree" and launch is None:
                mode = "system"  # nothing to follow: a faux run traces the system
            if launch is not None:
                if launch.capture_output:
                    outputs = [(workdir / n).open("wb") for n in ("stdout.txt", "stderr.txt")]
                    self._captured = {
                        Path(out.name).name: _identity(os.fstat(out.fileno())) for out in outputs
                    }
                # the benchmark's own folder (what setup() made in it too) is its user's
                hand_over(workdir, runs_as)
                proc = GatedProcess(launch, *outputs, user=runs_as)
                env.limit(proc.pid, proc.containment.path)  # held at the gate
                if cfg.nice is not None:  # held at the gate: its children inherit this
                    os.setpriority(os.PRIO_PROCESS, proc.pid, own_nice)
            if own_oom is not None:
                # After the benchmark was forked: it keeps the usual score.
                set_oom_score_adj("self", min(own_oom, COLLECTOR_OOM_SCORE_ADJ))
            if mode in ("tgid", "tree"):
                flt = ProcessFilter(follow_children=mode == "tree", bpf_dir=self.bpf_dir)
                seed = cfg.tgid if mode == "tgid" else proc.pid if proc else None
                if seed:
                    flt.add(seed)
                if mode == "tree":
                    # e.g. a server the benchmark started in setup(): traced with its client
                    for pid in self.benchmark.tracked_pids():
                        flt.add(pid)
            spool_dir = self.path / SPOOL_DIR if parquet is not None and cfg.spool else None
            self._spool_dir = spool_dir
            if spool_dir is not None and cfg.spool_memory > 0 and self.on_message:
                for left in leftover_memory():  # never deleted here: only recover frees them
                    self.on_message(f"warning: {left.describe()}")
            ctx = HookContext(
                self.collection_id,
                flt,
                os.getpid(),
                self.bpf_dir,
                spool_dir=spool_dir,
                copier_priority=cfg.copier_priority,
                copier_workers=cfg.copier_workers,
                poll_interval_ms=cfg.poll_interval_ms,
                poll_max_interval_ms=cfg.poll_max_interval_ms,
                spool_memory=(
                    spool_memory(spool_dir, self.collection_id, cfg.spool_memory)
                    if spool_dir is not None
                    else None
                ),
                spare=(
                    Pacer(
                        SpareCpu(need=cfg.spool_spare_cpus),
                        lambda: isinstance(sink, ThreadedSink) and sink.behind,
                    )
                    if spool_dir is not None
                    else None
                ),
            )
            configured_hooks = [get_hook(n)(self.config.hook_options(n)) for n in cfg.hooks]
            for hook in [*configured_hooks, *self.extra_hooks]:
                hooks.append(hook)
                if hook.status.attached:  # started by the caller
                    continue
                try:
                    hook.start(ctx)
                except HookUnavailable as err:
                    hook.status.reason = str(err).removeprefix(f"{hook.name}: ")
                    if cfg.strict:
                        raise StrictError(f"--strict: hook {err}") from err
            self._memory = ctx.spool_memory
            for participant in self.participants:
                participant.start(ctx)  # e.g. the exporter: the same processes as the hooks
            attach_s = time.monotonic() - t0
            if self.on_message:
                for line in priority_notes([h.status.copier for h in hooks]):
                    self.on_message(line)
            if self.on_attached:
                self.on_attached({h.name: h.status for h in hooks})
            if self.manifest is not None:
                self.manifest.attach_s = round(attach_s, 6)
                self.manifest.filter = {"mode": mode, "tgid": cfg.tgid}
                self.manifest.benchmark = self._benchmark_record(proc)
                self.manifest.system = system_info()
                self.manifest.versions = _versions()
                self._checkpoint(hooks)
            if proc:
                proc.release()
            # The libraries that decode and write rows come in the background from here
            # on (not sooner: their import would hold up the lines above); until they
            # are in, the loop only keeps the rings from filling.
            libraries = preload(
                *DECODING_LIBRARIES, *sorted({lib for hook in hooks for lib in hook.libraries})
            )
            ended_by, bench_exit = self._loop(hooks, sink, proc, libraries)
        except BaseException as err:  # always flush and detach below
            # a spool's write that failed outside _spool_call (a spill, a hook's poll)
            full = isinstance(err, OSError) and is_disk_full(err)
            errors.append(self._spool_error(err) if full else err)  # type: ignore[arg-type]
            ended_by = "interrupted" if isinstance(err, KeyboardInterrupt) else "error"
        finally:
            bench_exit = self._finish(hooks, sink, proc, flt, outputs, workdir, bench_exit, errors)
            if self._manifests is not None:  # detached: now its last write may take its time
                failed = self._manifests.close()
                if failed is not None:
                    errors.append(failed)
            rows = self._close_sink(sink, errors)
            self._remove_spool(parquet, errors)
            self._restore_signals(old_handlers)
            if parquet is not None and cfg.compact and not self._disk_full:
                self._compact(parquet, errors)
            if cfg.nice is not None:
                with contextlib.suppress(PermissionError):
                    os.setpriority(os.PRIO_PROCESS, 0, own_nice)
                if own_group is not None:
                    with contextlib.suppress(OSError):
                        set_autogroup_nice(own_group)
            if own_oom is not None:
                set_oom_score_adj("self", own_oom)
            self._close_participants(errors)
        stopped_at = datetime.now(UTC)
        for hook in hooks:
            hook.status.rows = {t: rows.get(t, 0) for t in hook.tables}
        error = next((e for e in errors if not isinstance(e, KeyboardInterrupt)), None)
        failure = parquet.failure if parquet is not None else None
        if self._disk_full or failure is not None:
            full = self._disk_full or (failure is not None and is_disk_full(failure))
            ended_by = "disk_full" if full else "error"
            error = next((e for e in errors if isinstance(e, OutputError)), error)
            if full and not isinstance(error, OutOfSpace):
                # the sink's own line (whichever thread saw the full disk first) says
                # less: which filesystem, that the spool is kept, how to recover
                error = self._space_error() or error
        elif ended_by not in ("error", "interrupted") and errors:
            ended_by = "error"
        result = CollectionResult(
            collection_id=self.collection_id,
            path=self.path,
            benchmark=self.config.benchmark.name,
            ended_by=ended_by,
            exit_code=self._exit_code(ended_by, bench_exit, error),
            benchmark_exit=bench_exit,
            started_at=started_at,
            stopped_at=stopped_at,
            attach_s=attach_s,
            hooks={h.name: h.status for h in hooks},
            rows=rows,
        )
        if self.manifest is not None:
            try:
                self._finalise_manifest(result, proc, error)
            except OutputError as err:
                error = error or err
        self._hand_over()  # after root's last write
        if error is not None:
            raise error
        return result

    def _hand_over(self) -> None:
        """Under sudo, the collection and the folders this run created are the user's."""
        if self._sink is None:
            hand_over(self.path, self.invoker, self._created)

    def _finish(
        self,
        hooks: list[Hook],
        sink: Sink,
        proc: GatedProcess | None,
        flt: ProcessFilter | None,
        outputs: list[IO[bytes]],
        workdir: Path,
        bench_exit: int | None,
        errors: list[BaseException],
    ) -> int | None:
        """Stop the benchmark, drain and detach every hook, keep the results,
        tear down. Each step runs even if an earlier one failed (errors are
        collected): one broken hook must not lose the others' rows."""

        def step(fn: Callable[[], object]) -> None:
            try:
                fn()
            except Exception as err:  # collected, reported after cleanup
                errors.append(err)

        full = self._out_of_space()
        if proc is not None:
            if proc.poll() is None:
                step(lambda: proc.stop(SPACE_STOP_GRACE_S if full else 5.0))
            step(proc.reap_group)
            if bench_exit is None and proc.returncode is not None:
                bench_exit = exit_status(proc.returncode)
        for out in outputs:
            step(out.close)
        for hook in hooks:
            # every program stops before any final drain: a ring still being filled
            # while the others' rows are made would overflow
            step(hook.detach)
        if isinstance(sink, ThreadedSink):
            sink.max_queued_bytes = min(sink.max_queued_bytes, DRAIN_QUEUE_BYTES)
        _trim_as_usual()  # no ring to keep up with: heaps trimmed again in the drain
        # Out of space, spooled records stay in the spool for `kernmlops recover`: their
        # rows would take the room the disk no longer has.
        parked = [h for h in hooks if full and _spooling(h)]
        spooled = sum(_spooled_bytes(h) for h in hooks if h not in parked)
        if spooled >= 64 << 20 and self.on_message:
            self.on_message(f"making rows from {human_bytes(spooled)} of spooled records")
        for hook in hooks:
            if hook in parked:
                step(lambda hook=hook: self._spool_call(lambda: _park(hook)))
            else:
                step(lambda hook=hook: self._drain(hook, sink, final=True))
            step(hook.close)  # idempotent: detaches even if the final drain failed
        step(lambda: self._results(sink, proc, workdir, bench_exit))
        try:
            self.benchmark.teardown()
        except Exception as err:  # reported; never loses the collection
            self.results_error = f"teardown failed: {err}"
        step(self.benchmark.stop_services)  # servers of setup() and all they started
        shutil.rmtree(workdir, ignore_errors=True)
        if flt is not None:
            step(flt.close)
        step(self.environment.restore)  # THP as it was, even after Ctrl+C or a failure
        return bench_exit

    def _remove_spool(self, parquet: ParquetSink | None, errors: list[BaseException]) -> None:
        """Once every spooled row is in finished parts, the spool goes; otherwise it
        stays for ``kernmlops recover``."""
        spool = self._spool_dir
        if spool is None or not spool.exists() or parquet is None or parquet.failure:
            return
        failed = any(not isinstance(e, KeyboardInterrupt) for e in errors)
        if failed and any(seg.stat().st_size for seg in pending_spools(self.path)):
            return  # records a recovery can still turn into rows
        remove_spool(spool)

    def _close_participants(self, errors: list[BaseException]) -> None:
        """Last, once the collection is written: the exporter serves the job's final
        values until a scrape took them (or collector.export_grace_s passed)."""
        for participant in self.participants:
            try:
                participant.close()
            except Exception as err:  # reported; the collection is already written
                errors.append(err)

    @staticmethod
    def _close_sink(sink: Sink, errors: list[BaseException]) -> dict[str, int]:
        try:
            return sink.close()
        except Exception as err:  # the manifest still says what happened
            errors.append(err)
            return {}

    def _compact(self, parquet: ParquetSink, errors: list[BaseException]) -> None:
        """One file per table instead of one per flush (see ParquetSink.compact)."""
        parts = sum(len(f) for f in parquet.files_written().values())
        if parts >= 100 and self.on_message:
            self.on_message(f"compacting {parts} flushed parts into one file per table")
        _release_free_memory()
        try:
            self._compaction = parquet.compact()
        except KeyboardInterrupt as err:  # a second Ctrl+C: the parts stay as they were
            errors.append(err)

    # -- internals ----------------------------------------------------------
    def _loop(
        self,
        hooks: list[Hook],
        sink: Sink,
        proc: GatedProcess | None,
        libraries: threading.Event | None = None,
    ) -> tuple[str, int | None]:
        cfg = self.config.collector
        period = cfg.poll_interval_ms / 1000
        limit = self.config.benchmark.duration_s
        start = time.monotonic()
        next_flush = start + cfg.flush_interval_s
        next_progress = start
        next_check = start
        # The loop sleeps until a hook is due (next_poll), and whatever cannot wait
        # wakes it: the benchmark's exit (a pidfd), a stop signal (an eventfd the
        # handler writes), a ring passing a quarter full (its map fd, see
        # common.h). Only hooks whose buffers cannot tell cap the sleep.
        # The running manifest is written (and synced) by a thread: behind a storm's
        # writeback an fsync waited seconds, and the rings overflowed meanwhile. It is
        # joined once the hooks are detached (run), before the final manifest.
        manifests = self._manifests = _Background("kernmlops-manifest")
        exited: int | None = None
        waker: select.epoll | None = None
        watch: _SpaceWatch | None = None
        try:
            exited = _pidfd(proc.pid) if proc is not None else None
            self._interrupt = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            waker, capped = _waker(hooks, exited, self._interrupt)
            longest = max(period, cfg.poll_max_interval_ms / 1000) if capped else math.inf
            if self._parquet is not None:
                watch = _SpaceWatch(self._space_error, self._wake, proc)
            while True:
                tick = time.monotonic()
                if watch is not None and watch.error is not None:
                    raise watch.error  # the benchmark is stopped already
                loading = libraries is not None and not libraries.is_set()
                behind = isinstance(sink, ThreadedSink) and sink.behind
                spilled = sum(h.spilled_bytes() for h in hooks)
                if (loading or behind) and spilled < MAX_SPILLED_BYTES:
                    # Rows cannot be built (libraries loading) or handed over (the sink's
                    # queue is full) without stalling: keep the rings from overflowing.
                    for hook in hooks:
                        hook.spill()
                else:
                    for hook in hooks:
                        self._drain(hook, sink)
                if tick >= next_flush:
                    for hook in hooks:  # what hooks hold back goes into this flush
                        self._spool_call(lambda h=hook: _write_all(sink, h.flushing()))
                    # Finish the open parts in the writer thread; the manifest says how far
                    # the collection got (parts finished by the previous flush).
                    if isinstance(sink, ThreadedSink):
                        sink.flush(durable=True, wait=False)
                    else:
                        sink.flush(durable=True)
                    self._checkpoint(hooks, writer=manifests)
                    if self._parquet is not None:
                        finished = self._parquet.checkpoint()[1]
                        for hook in hooks:
                            self._spool_call(lambda h=hook, f=finished: h.checkpoint_spool(f))
                    next_flush = tick + cfg.flush_interval_s
                if tick >= next_check:
                    self._spool_call(lambda: _check_writes(hooks, sink))
                    next_check = tick + SPACE_CHECK_S
                if self.on_progress and tick >= next_progress:
                    self.on_progress(self._progress(hooks, tick - start))
                    next_progress = tick + 0.25
                if proc is not None and proc.poll() is not None:
                    if watch is not None and watch.error is not None:
                        raise watch.error  # it was stopped for that
                    code = exit_status(proc.returncode or 0)
                    return ("completed" if code == 0 else "failed"), code
                if self._stop_signal is not None:
                    return "interrupted", None
                if limit is not None and tick - start >= limit:
                    return "duration", None
                now = time.monotonic()
                wake = self._next_wake(hooks, now, tick + period, now + longest)
                wake = min(wake, next_flush, start + limit if limit is not None else wake)
                if self.on_progress:
                    wake = min(wake, next_progress)
                self._sleep(max(tick + period, wake) - now, waker)
        finally:
            if watch is not None:
                watch.close()  # before the eventfd it writes is closed
            if waker is not None:
                waker.close()
            interrupt, self._interrupt = self._interrupt, None
            if interrupt is not None:
                os.close(interrupt)
            if exited is not None:
                os.close(exited)

    def _next_wake(self, hooks: list[Hook], now: float, soonest: float, latest: float) -> float:
        """When the next poll is due: the earliest time a hook asks for, between
        ``soonest`` (a hook that polls every interval) and ``latest``."""
        wake = latest
        for hook in hooks:
            due = hook.next_poll(now)
            if due is None:
                return soonest
            wake = min(wake, due)
        return wake

    @staticmethod
    def _sleep(seconds: float, waker: select.epoll) -> None:
        if seconds > 0:
            waker.poll(seconds)

    def _results(
        self, sink: Sink, proc: GatedProcess | None, workdir: Path, exit_code: int | None
    ) -> None:
        """Keep the benchmark's captured output and its parsed results; a
        benchmark whose output does not parse loses nothing else."""
        kept = self.path / "benchmark_output"
        for name in ("stdout.txt", "stderr.txt"):
            if (workdir / name).exists() and self._sink is None:
                kept.mkdir(parents=True, exist_ok=True)
                self._keep_output(workdir / name, kept / name)
        run = BenchmarkRun(
            workdir=workdir,
            exit_code=exit_code,
            stdout_path=workdir / "stdout.txt" if (workdir / "stdout.txt").exists() else None,
            stderr_path=workdir / "stderr.txt" if (workdir / "stderr.txt").exists() else None,
            started_us=proc.started_ns // 1000 if proc and proc.started_ns else None,
            ended_us=proc.ended_ns // 1000 if proc and proc.ended_ns else None,
        )
        try:
            frame = self.benchmark.results(run)
        except Exception as err:  # a parser bug must not lose the collection
            self.results_error = f"{self.benchmark.name} results: {err}"
            return
        if frame is not None and frame.height:
            sink.write(RESULT_TABLE, frame)

    def _keep_output(self, source: Path, target: Path) -> None:
        """Copy a captured output file, only if it is still the file it was opened as:
        a benchmark run as the user owns its folder, and could put a link to a file
        only root may read in its place."""
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as err:
            self.results_error = f"{source.name} not kept: {err.strerror or err}"
            return
        with os.fdopen(fd, "rb") as src:
            if _identity(os.fstat(fd)) != self._captured.get(source.name):
                self.results_error = f"{source.name} not kept: replaced while the benchmark ran"
                return
            with target.open("wb") as dst:
                shutil.copyfileobj(src, dst)

    def _drain(self, hook: Hook, sink: Sink, final: bool = False) -> None:
        self._spool_call(lambda: _write_all(sink, hook.stop() if final else hook.poll()))

    def _spool_call(self, fn: Callable[[], object]) -> None:
        """Run ``fn``; a spool that cannot be written is the output's error (one line,
        a full disk ends the collection as disk_full). Sink errors are already so."""
        try:
            fn()
        except OutputError:
            raise
        except OSError as err:
            raise self._spool_error(err) from None

    def _spool_error(self, err: OSError) -> OutputError:
        """A spool's failed write as the user's one line; a full disk ends the
        collection as disk_full."""
        full = is_disk_full(err)
        self._disk_full = self._disk_full or full
        # The filesystem that failed: the collection's, or the tmpfs of the spool's
        # first MiB. A segment's path says which; a bare write's error (no path) is
        # the fuller of the two's.
        if err.filename:
            where = Path(err.filename).parent
        else:
            folders = [self.path, *([self._memory.folder] if self._memory else [])]
            where = min(folders, key=lambda f: _free_or_inf(f))
        what = "the disk is full" if full else f"a write failed ({err.strerror or err})"
        return (OutOfSpace if full else OutputError)(
            f"cannot write the spool in {where}: {what}; "
            f"{human_bytes(free_bytes(where))} free on {filesystem(where)}. {self._kept()}"
        )

    def _kept(self) -> str:
        """What a collection stopped by its output says it kept, and how to get it."""
        return (
            "The benchmark was stopped; finished parts and the spool are kept "
            f"(kernmlops recover {self.path}, once there is room)."
        )

    def _out_of_space(self) -> bool:
        """Whether the run ends because the collection's disk or the spool's tmpfs
        filled (or fell below collector.min_free_mb)."""
        failure = self._parquet.failure if self._parquet is not None else None
        return self._disk_full or (failure is not None and is_disk_full(failure))

    def _wake(self) -> None:
        """End the poll loop's sleep (as a stop signal does)."""
        if self._interrupt is not None:
            with contextlib.suppress(OSError):
                os.eventfd_write(self._interrupt, 1)

    def _space_error(self) -> OutOfSpace | None:
        """Why the collection must stop for want of space, or None: the collection's
        filesystem has less than collector.min_free_mb free (or none), or the spool's
        tmpfs less than that and than what the spool may still put there, or the sink
        failed on a full disk. (The space watch's thread: it only reads.)"""
        least = self.config.collector.min_free_mb * 2**20
        free = free_bytes(self.path)
        if free is not None and (free < least or free == 0):
            self._disk_full = True
            fs = f"{filesystem(self.path)}, the filesystem of {self.path}"
            why = (
                f"the disk is full: 0 B free on {fs}"
                if free == 0
                else f"only {human_bytes(free)} free on {fs}: below collector.min_free_mb "
                f"({self.config.collector.min_free_mb:g} MiB)"
            )
            return OutOfSpace(f"{why}. {self._kept()}")
        memory = self._memory
        left = memory.limit - memory.used if memory is not None else 0
        if memory is not None and left > 0:
            # Taken by a neighbour: the spool itself keeps within its budget (and, that
            # spent, writes on the disk: the tmpfs may fill then).
            free = free_bytes(memory.folder)
            if free is not None and free < min(max(least, 1), left):
                self._disk_full = True
                return OutOfSpace(
                    f"only {human_bytes(free)} free on {filesystem(memory.folder)}, the "
                    f"filesystem of the spool's memory {memory.folder}: less than "
                    f"collector.min_free_mb and the {human_bytes(left)} the spool may "
                    f"still put there. {self._kept()}"
                )
        failure = self._parquet.failure if self._parquet is not None else None
        if failure is not None and is_disk_full(failure):
            where = self.path
            return OutOfSpace(
                f"cannot write to {where}: the disk is full; {human_bytes(free_bytes(where))} "
                f"free on {filesystem(where)}. {self._kept()}"
            )
        return None

    def _progress(self, hooks: list[Hook], elapsed: float) -> Progress:
        events: dict[str, int] = {}
        drops: dict[str, int] = {}
        for h in hooks:
            events[h.name] = h.status.events
            drops_fn = getattr(h, "drops", None)
            drops[h.name] = drops_fn() if drops_fn else 0
        spooled = {h.name: _spooled_bytes(h) for h in hooks}  # errors: _check_writes
        return Progress(elapsed, events, drops, {}, self.benchmark.describe(), spooled)

    def _exit_code(
        self, ended_by: str, bench_exit: int | None, error: BaseException | None = None
    ) -> int:
        if ended_by == "failed" and bench_exit is not None:
            return bench_exit
        if ended_by == "interrupted":
            return 128 + (self._stop_signal or signal.SIGINT)
        if ended_by in ("error", "disk_full"):
            # The process exits with the error's own code: the manifest must agree.
            return error.exit_code if isinstance(error, KernmlopsError) else 1
        return 0

    def _install_signals(self) -> dict[int, Any]:
        def handler(signum: int, _frame: object) -> None:
            self._stop_signal = signum
            if self._interrupt is not None:
                with contextlib.suppress(OSError):
                    os.eventfd_write(self._interrupt, 1)  # wakes the poll loop's sleep

        old = {}
        if sys.platform != "win32" and _is_main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old[sig] = signal.signal(sig, handler)
        return old

    @staticmethod
    def _restore_signals(old: dict[int, Any]) -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    def _benchmark_record(self, proc: GatedProcess | None) -> BenchmarkRecord:
        return BenchmarkRecord(
            name=self.config.benchmark.name,
            description=self.benchmark.describe(),
            pid=proc.pid if proc else None,
            exit_code=exit_status(proc.returncode)
            if proc and proc.returncode is not None
            else None,
            # CLOCK_MONOTONIC µs, the clock of every table's ts_uptime_us
            started_uptime_us=proc.started_ns // 1000 if proc and proc.started_ns else None,
            stopped_uptime_us=proc.ended_ns // 1000 if proc and proc.ended_ns else None,
            cgroup=proc.containment.cgroup if proc else None,
            environment=dict(self.environment.record) or None,
        )

    def _checkpoint(self, hooks: list[Hook], writer: _Background | None = None) -> None:
        """Rewrite the running manifest: what attached, events and drops so far, and the
        rows in finished parts (by ``writer``'s thread if given)."""
        if self.manifest is None or self._parquet is None:
            return
        m, parquet = self.manifest, self._parquet
        for h in hooks:
            drops_fn = getattr(h, "drops", None)
            if drops_fn is not None and h.status.attached:
                with contextlib.suppress(Exception):  # a closed map: keep the last count
                    h.status.drops = drops_fn()
            m.hooks[h.name] = HookRecord.model_validate(h.status.as_dict())
        files, rows = parquet.checkpoint()
        m.tables = {
            t: {"rows": n, "files": files.get(t, [])}  # type: ignore[misc]
            for t, n in rows.items()
        }
        m.flushes = parquet.durable_flushes
        if parquet.last_durable_flush is not None:
            m.last_flush_at = datetime.fromtimestamp(parquet.last_durable_flush, UTC).isoformat()
        m.updated_at = datetime.now(UTC).isoformat()
        if writer is None:
            self._save_manifest()
        else:
            body = manifest_text(m)  # as it is now: the loop goes on changing it
            writer.submit(lambda: self._save_manifest(text=body))

    def _save_manifest(self, *, final: bool = False, text: str | None = None) -> None:
        """Write the manifest. The final write first gives back the room reserved at the
        start: by then the benchmark is stopped, so nothing else can take it. A full disk
        before that ends the collection (the reserve keeps the final manifest's room)."""
        assert self.manifest is not None
        if final:
            release_reserve(self.path)
        try:
            write_manifest(self.path, text if text is not None else self.manifest)
        except OSError as err:
            if is_disk_full(err):
                self._disk_full = True
                raise OutputError(
                    f"cannot write to {self.path}: the disk is full "
                    f"({human_bytes(free_bytes(self.path))} free). Finished parts are kept."
                ) from None
            raise OutputError(
                f"cannot write the manifest in {self.path}: {err.strerror or err}"
            ) from None

    def _finalise_manifest(
        self, result: CollectionResult, proc: GatedProcess | None, error: BaseException | None
    ) -> None:
        assert self.manifest is not None and self._parquet is not None
        m = self.manifest
        m.state = result.ended_by  # type: ignore[assignment]
        m.benchmark = self._benchmark_record(proc)
        m.benchmark.exit_code = result.benchmark_exit
        m.stopped_at = result.stopped_at.isoformat()
        m.updated_at = m.stopped_at
        m.duration_s = round(result.duration_s, 6)
        m.attach_s = round(result.attach_s, 6)
        m.exit_code = result.exit_code
        m.error = str(error) if error is not None else None
        m.results_error = self.results_error
        if m.system is None:  # it ended before attaching
            m.system = system_info()
            m.versions = _versions()
        m.hooks = {n: HookRecord.model_validate(st.as_dict()) for n, st in result.hooks.items()}
        files = self._parquet.files_written()
        m.tables = {
            t: {  # type: ignore[misc]
                "rows": n,
                "files": files.get(t, []),
                "compaction": self._compaction.get(t),
            }
            for t, n in result.rows.items()
        }
        m.flushes = self._parquet.durable_flushes
        if self._parquet.lost_rows:
            m.lost_rows = dict(self._parquet.lost_rows)  # type: ignore[attr-defined]
        m.output = {**(m.output or {}), "free_bytes_at_stop": free_bytes(self.path)}
        failed: Exception | None = None
        for participant in self.participants:
            try:
                participant.contribute(m, self.path)
            except Exception as err:  # the manifest is still written; raised after it
                failed = failed or err
                m.error = m.error or f"{type(participant).__name__}: {err}"
        self._save_manifest(final=True)
        if failed is not None:
            raise failed


#: glibc's mmap threshold, fixed (M_MMAP_THRESHOLD). By default it rises to the
#: largest block freed so far (up to 32 MiB): after the first few-MiB block of a storm
#: (a late ring copy, a writer's batch) every block up to that size comes from the
#: threads' heaps, which keep what is freed: a 300-s storm's heap grew 62 -> 84 MiB.
#: Fixed at 4 MiB it stayed at 54-58 MiB; at 256 KiB at 43-53 MiB, but every ring copy
#: was then mapped and faulted in anew (+0.1 s of CPU per 5 s of storm; `python -m bench memory`).
MMAP_THRESHOLD = 4 << 20
M_MMAP_THRESHOLD = -3
#: free bytes a heap keeps at its top before giving them back (M_TRIM_THRESHOLD; fixing
#: the mmap threshold leaves it at 128 KiB). At 128 KiB the poll loop grew and trimmed
#: its heap around every ring copy, 21 brk calls a second under a storm, each a change
#: of the address space that took the GIL into the kernel with it, where one waited
#: 1.5 s for a VMA's lock (`python -m bench memory`). Kept, not new: the peak stays the peak.
TRIM_THRESHOLD = 16 << 20
DEFAULT_TRIM_THRESHOLD = 128 << 10
M_TRIM_THRESHOLD = -1


def _return_large_frees() -> None:
    """Have large blocks mapped on their own, and so returned to the system when freed,
    and the heaps keep what the next ring copies will take again (glibc; elsewhere
    nothing changes)."""
    _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    _mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def _trim_as_usual() -> None:
    """glibc's trim threshold back to its default once the programs are detached: the
    drain makes rows at full speed, and a heap that keeps 16 MiB at its top after each
    batch raised the peak of a 300-s storm's drain to 139 MiB (133-136 before)."""
    _mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)


def _mallopt(param: int, value: int) -> None:
    """glibc's mallopt; elsewhere (musl, no libc symbol) nothing changes."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).mallopt(param, value)


def _release_free_memory() -> None:
    """Give memory freed during the run back to the system before compaction allocates
    its own: the writer thread's malloc arena and Arrow's pool keep freed pages, and
    compaction (on this thread) would add to them, not reuse them."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).malloc_trim(0)
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        with contextlib.suppress(Exception):
            pa.default_memory_pool().release_unused()


def _read_oom_score_adj() -> int | None:
    """The collector's OOM score adjustment, where it may lower it (root), else None."""
    if os.geteuid() != 0:
        return None
    try:
        return int(Path("/proc/self/oom_score_adj").read_text())
    except (OSError, ValueError):
        return None


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _free_or_inf(path: Path) -> float:
    free = free_bytes(path)
    return math.inf if free is None else free


def _check_writes(hooks: Sequence[Hook], sink: Sink) -> None:
    """Raise a spool's failed write (the ring copier's, as an OSError) and the sink
    writer's error now, not when the run ends or rows are next written."""
    for hook in hooks:
        hook.spooled_bytes()
    if isinstance(sink, ThreadedSink):
        sink.check()


def _spooled_bytes(hook: Hook) -> int:
    """A hook's spooled bytes; 0 where its spool failed (the error was reported)."""
    try:
        return hook.spooled_bytes()
    except OSError:
        return 0


def _spooling(hook: Hook) -> bool:
    """Whether ``hook`` holds records in a spool (a failed spool counts: what it
    wrote stays)."""
    try:
        return hook.spooled_bytes() > 0
    except OSError:
        return True


def _park(hook: Hook) -> None:
    """Stop a spooling hook without making rows from its spool: they stay for
    ``kernmlops recover``. The final drain's first step moves what the rings and the
    CPUs' batches still hold into the spool; the rows it then yields are dropped (they
    are in the spool too), and closing it closes the hook."""
    final = iter(hook.stop())
    try:
        next(final, None)
    finally:
        close = getattr(final, "close", None)
        if close is not None:
            close()


def _write_all(sink: Sink, rows: Iterable[tuple[str, Rows]]) -> None:
    for table, frame in rows:
        sink.write(table, frame)


def _waker(hooks: Sequence[Hook], *fds: int | None) -> tuple[select.epoll, bool]:
    """An epoll of what ends the poll loop's sleep: ``fds`` when readable, and each
    hook's wake fds (edge-triggered: a ring that holds records is readable until it
    is drained, but only a program's wake-up is news); whether some hook cannot
    tell (None), so the sleep must be capped."""
    waker = select.epoll()
    capped = False
    try:
        for fd in fds:
            if fd is not None:
                waker.register(fd, select.EPOLLIN)
        for hook in hooks:
            wake = hook.wake_fds()
            if wake is None:
                capped = True
                continue
            for fd in wake:
                with contextlib.suppress(FileExistsError):  # a map two hooks share
                    waker.register(fd, select.EPOLLIN | select.EPOLLET)
    except BaseException:
        waker.close()
        raise
    return waker, capped


def _pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when ``pid`` exits (Linux 5.3+)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None  # then the loop notices the exit at its next poll


class _SpaceWatch:
    """While the benchmark runs, a thread that asks ``check`` every SPACE_CHECK_S
    whether the collection must stop for want of space, apart from the poll loop: a
    hook's work can hold the loop for seconds (a library's first import under a storm
    took 7 s). Once it must, the thread keeps the reason (``error``), wakes the loop
    (``wake``) and stops the benchmark itself."""

    def __init__(
        self,
        check: Callable[[], OutOfSpace | None],
        wake: Callable[[], None],
        proc: GatedProcess | None,
    ) -> None:
        self.error: OutOfSpace | None = None
        self._check = check
        self._wake = wake
        self._proc = proc
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kernmlops-space", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(SPACE_CHECK_S):
            error = self._check()
            if error is None:
                continue
            self.error = error
            self._wake()
            if self._proc is not None and self._proc.poll() is None:
                with contextlib.suppress(Exception):  # the session's stop says what failed
                    self._proc.stop(SPACE_STOP_GRACE_S)
            return

    def close(self) -> None:
        self._done.set()
        self._thread.join()


class _Background:
    """One thread for writes the poll loop must not wait for. Only the latest job
    counts (a newer manifest makes an unwritten older one moot); a job's error is
    raised by the next :meth:`submit`, or returned by :meth:`close`."""

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._job: Callable[[], object] | None = None
        self._error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._closing:
                    self._cond.wait()
                job, self._job = self._job, None
                if job is None:
                    return
            try:
                job()
            except BaseException as err:  # handed to the loop
                with self._cond:
                    self._error = self._error or err

    def submit(self, job: Callable[[], object]) -> None:
        with self._cond:
            if self._error is not None:
                err, self._error = self._error, None
                raise err
            self._job = job
            self._cond.notify()

    def close(self) -> BaseException | None:
        """Finish the pending job; the first error of any job, if one failed."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        return self._error
