"""A collection: the benchmark, the hooks, the poll loop, the sinks, the manifest.

Whatever ends it (the benchmark exits, the duration passes, Ctrl+C, SIGTERM,
a failing benchmark, an error in a hook), every program is detached, every
collected row is flushed, and the manifest is written.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from kernmlops import __version__
from kernmlops.benchmarks import get_benchmark
from kernmlops.benchmarks.base import Benchmark, BenchmarkRun
from kernmlops.collect.filter import ProcessFilter
from kernmlops.collect.manifest import write_manifest
from kernmlops.collect.process import GatedProcess, exit_status
from kernmlops.collect.sinks import ParquetSink, ThreadedSink
from kernmlops.collect.sysinfo import system_info
from kernmlops.config import Config
from kernmlops.errors import CollectionError, HookUnavailable, KernmlopsError
from kernmlops.hooks import get_hook
from kernmlops.hooks.base import Hook, HookContext, HookStatus
from kernmlops.tables import Sink

RESULT_TABLE = "benchmark_result"


class StrictError(KernmlopsError):
    """--strict and a hook could not attach."""


@dataclass
class Progress:
    """What the session reports while it runs (the CLI draws it)."""

    elapsed_s: float
    events: dict[str, int]
    drops: dict[str, int]
    rows: dict[str, int]
    benchmark: str


@dataclass
class CollectionResult:
    collection_id: str
    path: Path
    benchmark: str
    #: how it ended: completed, failed, duration, interrupted (SIGINT/SIGTERM), error
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
        sink: Sink | None = None,
        bpf_dir: Path | None = None,
    ) -> None:
        self.config = config
        self.on_progress = on_progress
        self.on_attached = on_attached
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
        self._exporter: Any = None  # kernmlops.exporter.RunningExporter with collector.export
        #: what collector.export served (for the manifest); None when off
        self.exporter_summary: dict[str, Any] | None = None

    # -- public -------------------------------------------------------------
    def run(self) -> CollectionResult:
        cfg = self.config.collector
        self.benchmark.check()  # before anything is started or attached
        own_nice = os.getpriority(os.PRIO_PROCESS, 0)
        if cfg.nice is not None:
            # Before any thread starts: on Linux the nice value is per thread.
            try:
                os.setpriority(os.PRIO_PROCESS, 0, cfg.nice)
            except PermissionError:
                raise CollectionError(
                    f"collector.nice {cfg.nice} needs root or CAP_SYS_NICE"
                ) from None
        t0 = time.monotonic()
        started_at = datetime.now(UTC)
        hooks: list[Hook] = []
        proc: GatedProcess | None = None
        flt: ProcessFilter | None = None
        parquet = (
            None
            if self._sink
            else ParquetSink(self.path, self.collection_id, row_group_rows=cfg.row_group_rows)
        )
        sink: Sink = self._sink or ThreadedSink(parquet)  # type: ignore[arg-type]
        mode = cfg.filter
        ended_by, bench_exit, attach_s = "error", None, 0.0
        errors: list[BaseException] = []
        self.results_error: str | None = None
        workdir = Path(tempfile.mkdtemp(prefix="kernmlops-bench-"))
        outputs: list[IO[bytes]] = []
        old_handlers = self._install_signals()
        try:
            self.benchmark.setup(workdir)
            launch = self.benchmark.launch()
            if mode == "auto":
                mode = self.benchmark.default_filter
            if mode == "tree" and launch is None:
                mode = "system"  # nothing to follow: a faux run traces the system
            if launch is not None:
                if launch.capture_output:
                    outputs = [(workdir / n).open("wb") for n in ("stdout.txt", "stderr.txt")]
                proc = GatedProcess(launch, *outputs)
                if cfg.nice is not None:  # held at the gate: its children inherit this
                    os.setpriority(os.PRIO_PROCESS, proc.pid, own_nice)
            if mode in ("tgid", "tree"):
                flt = ProcessFilter(follow_children=mode == "tree", bpf_dir=self.bpf_dir)
                seed = cfg.tgid if mode == "tgid" else proc.pid if proc else None
                if seed:
                    flt.add(seed)
                if mode == "tree":
                    # e.g. a server the benchmark started in setup(): traced with its client
                    for pid in self.benchmark.tracked_pids():
                        flt.add(pid)
            ctx = HookContext(self.collection_id, flt, os.getpid(), self.bpf_dir)
            for name in cfg.hooks:
                hook = get_hook(name)(self.config.hook_options(name))
                hooks.append(hook)
                try:
                    hook.start(ctx)
                except HookUnavailable as err:
                    hook.status.reason = str(err).removeprefix(f"{name}: ")
                    if cfg.strict:
                        raise StrictError(f"--strict: hook {err}") from err
            if cfg.export:
                from kernmlops.exporter import start_exporter

                # The metric sets count the same processes as the hooks.
                self._exporter = start_exporter(
                    cfg.export,
                    configs=cfg.export_sets,
                    process_filter_fd=flt.fd if flt is not None else None,
                    self_tgid=os.getpid(),
                    bpf_dir=self.bpf_dir,
                    strict=cfg.strict,
                )
            attach_s = time.monotonic() - t0
            if self.on_attached:
                self.on_attached({h.name: h.status for h in hooks})
            if proc:
                proc.release()
            ended_by, bench_exit = self._loop(hooks, sink, proc)
        except BaseException as err:  # always flush and detach below
            errors.append(err)
            ended_by = "interrupted" if isinstance(err, KeyboardInterrupt) else "error"
        finally:
            bench_exit = self._finish(hooks, sink, proc, flt, outputs, workdir, bench_exit, errors)
            rows = self._close_sink(sink, errors)
            self._restore_signals(old_handlers)
            if cfg.nice is not None:
                with contextlib.suppress(PermissionError):
                    os.setpriority(os.PRIO_PROCESS, 0, own_nice)
        stopped_at = datetime.now(UTC)
        for hook in hooks:
            hook.status.rows = {t: rows.get(t, 0) for t in hook.tables}
        if ended_by not in ("error", "interrupted") and errors:
            ended_by = "error"
        result = CollectionResult(
            collection_id=self.collection_id,
            path=self.path,
            benchmark=self.config.benchmark.name,
            ended_by=ended_by,
            exit_code=self._exit_code(ended_by, bench_exit),
            benchmark_exit=bench_exit,
            started_at=started_at,
            stopped_at=stopped_at,
            attach_s=attach_s,
            hooks={h.name: h.status for h in hooks},
            rows=rows,
        )
        error = next((e for e in errors if not isinstance(e, KeyboardInterrupt)), None)
        if parquet is not None:
            self._write_manifest(result, parquet, mode, proc, error)
        if error is not None:
            raise error
        return result

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

        if proc is not None:
            if proc.poll() is None:
                step(proc.stop)
            step(proc.reap_group)
            if bench_exit is None and proc.returncode is not None:
                bench_exit = exit_status(proc.returncode)
        for out in outputs:
            step(out.close)
        for hook in hooks:
            step(lambda hook=hook: self._drain(hook, sink, final=True))
            step(hook.close)  # idempotent: detaches even if the final drain failed
        step(lambda: self._results(sink, proc, workdir, bench_exit))
        try:
            self.benchmark.teardown()
        except Exception as err:  # reported; never loses the collection
            self.results_error = f"teardown failed: {err}"
        shutil.rmtree(workdir, ignore_errors=True)
        if self._exporter is not None:
            self.exporter_summary = self._exporter.summary()
            step(self._exporter.close)
        if flt is not None:
            step(flt.close)
        return bench_exit

    @staticmethod
    def _close_sink(sink: Sink, errors: list[BaseException]) -> dict[str, int]:
        try:
            return sink.close()
        except Exception as err:  # the manifest still says what happened
            errors.append(err)
            return {}

    # -- internals ----------------------------------------------------------
    def _loop(
        self, hooks: list[Hook], sink: Sink, proc: GatedProcess | None
    ) -> tuple[str, int | None]:
        cfg = self.config.collector
        period = cfg.poll_interval_ms / 1000
        limit = self.config.benchmark.duration_s
        start = time.monotonic()
        next_flush = start + cfg.flush_interval_s
        next_progress = start
        while True:
            tick = time.monotonic()
            for hook in hooks:
                self._drain(hook, sink)
            if tick >= next_flush:
                sink.flush()
                next_flush = tick + cfg.flush_interval_s
            if self.on_progress and tick >= next_progress:
                self.on_progress(self._progress(hooks, tick - start))
                next_progress = tick + 0.25
            if proc is not None and proc.poll() is not None:
                code = exit_status(proc.returncode or 0)
                return ("completed" if code == 0 else "failed"), code
            if self._stop_signal is not None:
                return "interrupted", None
            if limit is not None and tick - start >= limit:
                return "duration", None
            time.sleep(max(0.0, period - (time.monotonic() - tick)))

    def _results(
        self, sink: Sink, proc: GatedProcess | None, workdir: Path, exit_code: int | None
    ) -> None:
        """Keep the benchmark's captured output and its parsed results; a
        benchmark whose output does not parse loses nothing else."""
        kept = self.path / "benchmark_output"
        for name in ("stdout.txt", "stderr.txt"):
            if (workdir / name).exists() and self._sink is None:
                kept.mkdir(parents=True, exist_ok=True)
                shutil.copy2(workdir / name, kept / name)
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

    @staticmethod
    def _drain(hook: Hook, sink: Sink, final: bool = False) -> None:
        rows = hook.stop() if final else hook.poll()
        for table, frame in rows:
            sink.write(table, frame)

    def _progress(self, hooks: list[Hook], elapsed: float) -> Progress:
        events: dict[str, int] = {}
        drops: dict[str, int] = {}
        for h in hooks:
            events[h.name] = h.status.events
            drops_fn = getattr(h, "drops", None)
            drops[h.name] = drops_fn() if drops_fn else 0
        return Progress(elapsed, events, drops, {}, self.benchmark.describe())

    def _exit_code(self, ended_by: str, bench_exit: int | None) -> int:
        if ended_by == "failed" and bench_exit is not None:
            return bench_exit
        if ended_by == "interrupted":
            return 128 + (self._stop_signal or signal.SIGINT)
        if ended_by == "error":
            return 1
        return 0

    def _install_signals(self) -> dict[int, Any]:
        def handler(signum: int, _frame: object) -> None:
            self._stop_signal = signum

        old = {}
        if sys.platform != "win32" and _is_main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old[sig] = signal.signal(sig, handler)
        return old

    @staticmethod
    def _restore_signals(old: dict[int, Any]) -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    def _write_manifest(
        self,
        result: CollectionResult,
        sink: ParquetSink,
        mode: str,
        proc: GatedProcess | None,
        error: BaseException | None,
    ) -> None:
        manifest = {
            "collection_id": result.collection_id,
            "benchmark": {
                "name": result.benchmark,
                "description": self.benchmark.describe(),
                "pid": proc.pid if proc else None,
                "exit_code": result.benchmark_exit,
                # CLOCK_MONOTONIC µs, the clock of every table's ts_uptime_us
                "started_uptime_us": proc.started_ns // 1000 if proc and proc.started_ns else None,
                "stopped_uptime_us": proc.ended_ns // 1000 if proc and proc.ended_ns else None,
            },
            "started_at": result.started_at.isoformat(),
            "stopped_at": result.stopped_at.isoformat(),
            "duration_s": round(result.duration_s, 6),
            "attach_s": round(result.attach_s, 6),
            "ended_by": result.ended_by,
            "exit_code": result.exit_code,
            "error": str(error) if error and not isinstance(error, KeyboardInterrupt) else None,
            "results_error": self.results_error,
            "filter": {"mode": mode, "tgid": self.config.collector.tgid},
            "collector_pid": os.getpid(),
            "system": system_info(),
            "config": self.config.model_dump(mode="json"),
            "versions": _versions(),
            "hooks": {name: st.as_dict() for name, st in result.hooks.items()},
            "exporter": self.exporter_summary,
            "tables": {
                t: {"rows": n, "files": sink.files_written().get(t, [])}
                for t, n in result.rows.items()
            },
        }
        write_manifest(self.path, manifest)


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
