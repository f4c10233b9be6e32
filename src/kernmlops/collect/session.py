"""A collection: the benchmark, the hooks, the poll loop, the sinks, the manifest.

Before anything starts, the output folder is proven writable and roomy enough, and the
manifest is written (``state: running``). Every ``collector.flush_interval_s`` the open
Parquet parts are finished and the manifest is rewritten, so a collector killed at any
instant (SIGKILL, the OOM killer) leaves a readable collection that lost at most one
interval; the benchmark, in a cgroup of its own, dies with it. Whatever else ends it (the
benchmark exits, the duration passes, Ctrl+C, SIGTERM, a failing benchmark, an error in a
hook's start or stop, a full disk), every program is detached, every collected row that
fits on the disk is flushed, and the manifest is finalised with how it ended. A hook that
fails while the collection runs (a bug in its poll) is detached alone and named: the
benchmark and the other hooks go on, its spooled records still become rows at the stop,
and the exit code is 1 (kernmlops.collect.loop); a hook's bug in the stop itself is
named the same way (kernmlops.collect.attach).

:class:`Session` owns the order of all that and how the collection ended; the parts are
beside it: the benchmark (kernmlops.collect.benchmark), the hooks' start and stop
(attach), the poll loop (loop), the steps of the stop (stopping), the manifest as the
run goes (running), the room left (space), the collector's own process (tuning),
Parquet (parquet, partfiles, parts, compaction).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.benchmarks import get_benchmark
from kernmlops.benchmarks.base import Benchmark
from kernmlops.collect.attach import LeftInSpool, hook_context, spooled_bytes, start_hooks
from kernmlops.collect.benchmark import RunningBenchmark
from kernmlops.collect.disk import is_disk_full
from kernmlops.collect.filter import ProcessFilter
from kernmlops.collect.loop import PollLoop, Progress, StopSignals
from kernmlops.collect.manifest import Manifest
from kernmlops.collect.output import prepare_output
from kernmlops.collect.parquet import ParquetSink
from kernmlops.collect.participants import Participant, configured
from kernmlops.collect.privileges import (
    lesser_ways,
    privileges_record,
    refuse_what_cannot_work,
    without_dac_override,
)
from kernmlops.collect.running import CollectionResult, RunningManifest
from kernmlops.collect.sinks import ThreadedSink
from kernmlops.collect.space import OutOfSpace, SpaceGuard
from kernmlops.collect.stopping import (
    close_participants,
    close_sink,
    compact,
    remove_spent_spool,
    stop_collection,
)
from kernmlops.collect.tuning import DECODING_LIBRARIES, OwnPriority, return_large_frees
from kernmlops.config import Config
from kernmlops.ebpf.copier import priority_notes
from kernmlops.errors import ConfigError, KernmlopsError, OutputError
from kernmlops.hooks import get_hook
from kernmlops.hooks.base import Hook, HookStatus
from kernmlops.host.environment import Environment
from kernmlops.host.invoker import Invoker, hand_over, invoker
from kernmlops.host.pinned import Pinned, pin
from kernmlops.lazy import preload
from kernmlops.spool.collection import SPOOL_DIR
from kernmlops.spool.memory import leftover_memory
from kernmlops.tables import Sink

if TYPE_CHECKING:
    from kernmlops.exporter.webconfig import WebConfig

#: the sink's queue when the rings go through a spool: their rows are made only while
#: the sink is not behind (half of this), so the queue has only to keep the writer busy,
#: and the spool is the buffer (a 32 MiB queue filled as a storm ended and the rows
#: came at full speed: 23 MiB of the collector's peak RSS)
SPOOLED_QUEUE_BYTES = 8 << 20
#: the longest the session waits for the released command's exec (a dynamic binary
#: takes a millisecond or so; a slow disk or a big binary more)
EXEC_WAIT_S = 1.0


class Session:
    """Run one collection. ``run()`` returns a result whose ``exit_code`` the CLI exits with."""

    def __init__(
        self,
        config: Config,
        *,
        on_progress: Callable[[Progress], None] | None = None,
        on_attached: Callable[[dict[str, HookStatus]], None] | None = None,
        on_message: Callable[[str], None] | None = None,
        on_folder: Callable[[Path], None] | None = None,
        sink: Sink | None = None,
        bpf_dir: Path | None = None,
        hooks: Sequence[Hook] = (),
        participants: Sequence[Participant] = (),
        web_config: WebConfig | None = None,
    ) -> None:
        """``hooks``: hook instances run after the configured ones, like them (a
        caller may start them first: attached ones are not started again).
        ``participants``: what else runs beside the hooks and adds to the manifest
        (see kernmlops.collect.participants); the configured ones (the exporter of
        ``collector.export``) come first. Both lists may be extended before run().
        ``web_config``: ``collector.export_web_config`` as the caller loaded and
        checked it, served as it is (None: the exporter loads the file itself)."""
        self.config = config
        self.on_progress = on_progress
        self.on_attached = on_attached
        #: warnings for the user (low disk space ...)
        self.on_message = on_message
        #: the collection's folder, once it is made (the benchmark and the output
        #: checked): a refusal before that names no folder that will not exist
        self.on_folder = on_folder
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
        self._stop = StopSignals()
        self.extra_hooks: list[Hook] = list(hooks)
        self.participants: list[Participant] = [
            *configured(config.collector, bpf_dir, on_message, web_config),
            *participants,
        ]
        #: whether the output has room left, and what it says when it has none
        self.space = SpaceGuard(self.path, config.collector.min_free_mb)
        self._running = RunningManifest(self.path, self.space)
        self._spool_dir: Path | None = None
        #: benchmark.cpus / transparent_hugepages / drop_page_cache, applied in run()
        self.environment = Environment()
        #: under sudo, the user the collection's files are given to (run)
        self.invoker: Invoker | None = None
        #: the collection's folder held open (run): what is written goes through it
        self._pinned: Pinned | None = None

    @property
    def manifest(self) -> Manifest | None:
        """The manifest as last written (None with a caller's sink: nothing on disk)."""
        return self._running.manifest

    # -- public -------------------------------------------------------------
    def run(self) -> CollectionResult:
        cfg = self.config.collector
        return_large_frees()
        self.benchmark.check()  # before anything is started or attached
        self.invoker = who = invoker()
        as_user = self.config.benchmark.as_user
        if as_user and who is None and os.geteuid() == 0:
            raise ConfigError(
                "benchmark.as_user (--as-user): no user to run the benchmark as "
                "(SUDO_UID is not set): run kernmlops through sudo, or leave it off"
            )
        # what needs a capability this process lacks: refused before any folder is made
        refuse_what_cannot_work(who if self._sink is None else None, who if as_user else None)
        priority = OwnPriority(cfg.nice)
        priority.check()
        self.environment = env = Environment.from_options(self.config.benchmark)
        started_at = datetime.now(UTC)
        io = self.path  # where the collection is written: its folder held open, below
        # Ctrl+C from the moment the collection's folder is made stops the collection
        # as it does in the loop: a KeyboardInterrupt before the handlers were in left
        # the folder without a manifest and said only "Aborted!"
        old_handlers = self._stop.install()
        try:
            if self._sink is None:
                # Pre-flight: a folder that cannot take the collection fails here, before
                # the benchmark runs; the manifest exists from now on. The folder is made
                # new and held open: a user who can change a folder above it (their home)
                # cannot swap it for a link while root writes (kernmlops.host.pinned).
                try:
                    self._pinned = pin(
                        self.path, create=True, fresh=True, invoker_uid=who.uid if who else None
                    )
                    self._running.io = io = self._pinned.io
                    check = prepare_output(
                        io,
                        min_free_mb=cfg.min_free_mb,
                        warn_free_mb=cfg.warn_free_mb,
                        shown=self.path,
                    )
                except OutputError as err:
                    self._hand_over()  # what pin made is the user's (none if pin failed)
                    raise without_dac_override(err) from None
                if self.on_folder:
                    self.on_folder(self.path)
                if check.warning and self.on_message:
                    self.on_message(check.warning)
                self._running.begin(self.collection_id, self.config, started_at, check.free_bytes)
            priority.lower()  # before any thread starts: restored at the end
            t0 = time.monotonic()
            hooks: list[Hook] = []
            #: hooks that failed at their start or while the loop ran (a bug): detached
            #: there, left out of the stop but for those with records in their spool
            #: (``spooled``: rows made then)
            broken: list[Hook] = []
            spooled: list[Hook] = []
            flt: ProcessFilter | None = None
            parquet = (
                None
                if self._sink
                else ParquetSink(
                    io,
                    self.collection_id,
                    shown=self.path,
                    row_group_rows=cfg.row_group_rows,
                    # compaction at stop encodes compactly: the run's parts are written cheaply
                    fast_parts=cfg.compact,
                )
            )
            self.space.parquet = self._running.parquet = parquet
            # A caller's sink (tests) goes through the writer thread too: the loop and the
            # stop run as they do over Parquet.
            sink = ThreadedSink(
                self._sink or parquet,  # type: ignore[arg-type]
                max_queued_bytes=SPOOLED_QUEUE_BYTES if cfg.spool else 32 << 20,
            )
            priority.read_oom()
            mode: str = cfg.filter
            ended_by, bench_exit, attach_s = "error", None, 0.0
            setup_s: float = 0.0
            run_s: float | None = None
            errors: list[BaseException] = []
            bench = RunningBenchmark(
                self.benchmark,
                self.config.benchmark.name,
                self._pinned.io if self._pinned else self.path,
                keep_output=self._sink is None,
            )
        except BaseException:
            self._stop.restore(old_handlers)
            raise
        try:
            setting_up = time.monotonic()
            env.apply()  # THP and the page cache; restored in _finish
            launched = bench.launch(env, who if as_user else None)
            # the benchmark's setup (linux-build's make defconfig: 9 s) is not the probes'
            # attach, which attach_s ("probes attached in") says
            setup_s = time.monotonic() - setting_up
            t0 += setup_s
            proc = bench.proc
            if mode == "auto":
                mode = self.benchmark.default_filter
            if mode == "tree" and not launched:
                mode = "system"  # nothing to follow: a faux run traces the system
            if proc is not None:
                priority.give_usual(proc.pid)  # held at the gate: its children inherit it
            priority.shield()
            # collector.hooks empty (--no-hooks): the benchmark is timed untraced, so
            # not even the filter's fork program is loaded (nothing would read its map)
            traced = bool(cfg.hooks or self.extra_hooks or self.participants)
            if not traced:
                mode = "none"
            if mode in ("tgid", "tree"):
                flt = ProcessFilter(follow_children=mode == "tree", bpf_dir=self.bpf_dir)
                seed = cfg.tgid if mode == "tgid" else proc.pid if proc else None
                if seed:
                    flt.add(seed)
                if mode == "tree":
                    # e.g. a server the benchmark started in setup(): traced with its client
                    for pid in self.benchmark.tracked_pids():
                        flt.add(pid)
            spool_dir = io / SPOOL_DIR if parquet is not None and cfg.spool else None
            self._spool_dir = spool_dir
            if spool_dir is not None and cfg.spool_memory > 0 and self.on_message:
                for left in leftover_memory():  # never deleted here: only recover frees them
                    self.on_message(left.describe())
            ctx = hook_context(
                self.collection_id, cfg, flt, self.bpf_dir, spool_dir, sink, os.getpid()
            )
            ctx.benchmark_pid = proc.pid if proc else None
            configured_hooks = [get_hook(n)(self.config.hook_options(n)) for n in cfg.hooks]
            start_hooks(
                hooks,
                [*configured_hooks, *self.extra_hooks],
                ctx,
                strict=cfg.strict,
                failed=broken,
                spooled=spooled,
                on_message=self.on_message,
            )
            self.space.memory = ctx.spool_memory
            for participant in self.participants:
                participant.start(ctx)  # e.g. the exporter: the same processes as the hooks
            attach_s = time.monotonic() - t0
            # each lesser way taken for want of a privilege, said once (and kept)
            copier_notes = priority_notes([h.status.copier for h in hooks])
            lesser = lesser_ways(proc.containment if proc else None, priority.oom_refused)
            if self.on_message:
                for line in [*copier_notes, *lesser]:
                    self.on_message(line)
            if self.on_attached:
                self.on_attached({h.name: h.status for h in hooks})
            if self.manifest is not None:
                filter_record = {"mode": mode, "tgid": cfg.tgid}
                self._running.attached(
                    hooks,
                    attach_s,
                    filter_record,
                    bench.record(env),
                    privileges_record([*lesser, *copier_notes]),
                )
            loop = PollLoop(
                self.config,
                hooks,
                sink,
                proc,
                parquet=parquet,
                space=self.space,
                running=self._running,
                stop=self._stop,
                describe=self.benchmark.describe,
                on_progress=self.on_progress,
                on_message=self.on_message,
                failed=broken,
                spooled=spooled,
            )
            if proc and self._stop.signal is None:  # Ctrl+C before it ran: it never does
                proc.release()
                # hooks that look at the command (process_metadata's start snapshot) are
                # told once it runs, not while the gate shell still stands in its place;
                # without one, the run's start waits for nothing. A bug there detaches
                # that hook alone, as in the loop.
                if any(
                    type(h).benchmark_started is not Hook.benchmark_started for h in loop.active
                ):
                    proc.wait_exec(EXEC_WAIT_S)
                loop.benchmark_started(proc.pid)
            # The libraries that decode and write rows come in the background from here
            # on (not sooner: their import would hold up the lines above); until they
            # are in, the loop only keeps the rings from filling.
            # none without hooks: an import beside the benchmark would be timed with it
            libraries = (
                preload(
                    *DECODING_LIBRARIES, *sorted({lib for hook in hooks for lib in hook.libraries})
                )
                if traced
                else None
            )
            ended_by, bench_exit = loop.run(libraries)
            run_s = time.monotonic() - loop.started
        except BaseException as err:  # always flush and detach below
            # a spool's write that failed outside spool_call (a spill, a hook's poll)
            full = isinstance(err, OSError) and is_disk_full(err)
            errors.append(self.space.spool_error(err) if full else err)  # type: ignore[arg-type]
            ended_by = "interrupted" if isinstance(err, KeyboardInterrupt) else "error"
        finally:
            self._stop.stopping()  # a Ctrl+C from here on: said, then (again) obeyed
            bench_exit = stop_collection(
                [h for h in hooks if h not in broken or h in spooled],
                sink,
                bench,
                flt,
                bench_exit,
                errors,
                space=self.space,
                environment=self.environment,
                on_message=self.on_message,
                row_workers=cfg.spool_row_workers,
                asked=self._stop.asked_in_stop,
            )
            # detached: now the running manifest's last write may take its time
            failed = self._running.stop_background()
            if failed is not None:
                errors.append(failed)
            rows = close_sink(sink, errors)
            remove_spent_spool(self._spool_dir, parquet, errors, hooks)
            waiting = self._left_in_spool(hooks)
            self._stop.restore(old_handlers)
            left = next((e for e in errors if isinstance(e, LeftInSpool)), None)
            if left is not None:
                ended_by = "interrupted"  # the user stopped the rows: the rest waits
            elif parquet is not None and cfg.compact and not self.space.disk_full:
                compact(parquet, self._running, self.on_message, errors)
            priority.restore_nice()
            priority.restore_oom()
            close_participants(self.participants, errors)
        stopped_at = datetime.now(UTC)
        for hook in hooks:
            hook.status.rows = {t: rows.get(t, 0) for t in hook.written_tables()}
            hook.rows_settled(hook.name in waiting)
        error = next((e for e in errors if not isinstance(e, KeyboardInterrupt)), None)
        failure = parquet.failure if parquet is not None else None
        if self.space.disk_full or failure is not None:
            full = self.space.disk_full or (failure is not None and is_disk_full(failure))
            ended_by = "disk_full" if full else "error"
            error = next((e for e in errors if isinstance(e, OutputError)), error)
            if full and not isinstance(error, OutOfSpace):
                # the sink's own line (whichever thread saw the full disk first) says
                # less: which filesystem, that the spool is kept, how to recover
                error = self.space.error() or error
        elif ended_by not in ("error", "interrupted") and errors:
            ended_by = "error"
        result = CollectionResult(
            collection_id=self.collection_id,
            path=self.path,
            benchmark=self.config.benchmark.name,
            ended_by=ended_by,
            exit_code=self._exit_code(
                ended_by, bench_exit, error, hook_failed=any(h.status.failed for h in hooks)
            ),
            benchmark_exit=bench_exit,
            started_at=started_at,
            stopped_at=stopped_at,
            attach_s=attach_s,
            setup_s=setup_s,
            run_s=run_s,
            hooks={h.name: h.status for h in hooks},
            rows=rows,
            waiting=waiting,
            benchmark_stderr=bench.stderr_tail,
        )
        if self.manifest is not None:
            try:
                self._running.finalise(
                    result,
                    bench.record(self.environment),
                    error or left,  # the manifest says where the rest is (not raised)
                    bench.results_error,
                    self.participants,
                )
            except OutputError as err:
                error = error or err
        self._hand_over()  # after root's last write
        if error is not None:
            raise error
        return result

    def _left_in_spool(self, hooks: Sequence[Hook]) -> dict[str, int]:
        """(Once the spool is removed if it could be) per hook, the bytes of records
        its spool still holds: their rows and events wait for ``kernmlops recover``."""
        if self._spool_dir is None or not self._spool_dir.exists():
            return {}
        held = {h.name: spooled_bytes(h) for h in hooks}
        return {name: n for name, n in held.items() if n}

    def _hand_over(self) -> None:
        """Under sudo, the collection and the folders this run created are the user's
        (through the descriptors held since they were made, never their paths); the
        folder is let go."""
        pinned, self._pinned = self._pinned, None
        if pinned is not None:
            try:
                hand_over(pinned.fd, self.invoker, pinned.created)
            finally:
                pinned.close()

    def _exit_code(
        self,
        ended_by: str,
        bench_exit: int | None,
        error: BaseException | None = None,
        *,
        hook_failed: bool = False,
    ) -> int:
        if ended_by == "failed" and bench_exit is not None:
            return bench_exit
        if ended_by == "interrupted":
            return 128 + (self._stop.signal or signal.SIGINT)
        if ended_by in ("error", "disk_full"):
            # The process exits with the error's own code: the manifest must agree.
            return error.exit_code if isinstance(error, KernmlopsError) else 1
        # a hook that failed (and was detached) leaves its table short: not a clean run
        return 1 if hook_failed else 0
