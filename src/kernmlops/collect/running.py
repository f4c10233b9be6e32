"""The record of a running collection: its manifest from the first instant to the last.

The manifest is written before anything starts (``state: running``), completed once the
probes are attached (system, versions, the benchmark's pid and cgroup), rewritten at
every flush with what attached, the events and drops so far and the rows in the parts
that flush finished (once the sink's writer thread has finished them; written by a
thread of its own while the poll loop runs: :class:`BackgroundWriter`), and
finalised with how the collection ended (:class:`CollectionResult`). A full disk while
writing it is the collection's end (:class:`~kernmlops.collect.space.SpaceGuard`).
"""

from __future__ import annotations

import contextlib
import os
import platform
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmlops.collect.disk import free_bytes, human_bytes, is_disk_full
from kernmlops.collect.manifest import (
    BenchmarkRecord,
    ClockPairRecord,
    ClockRecord,
    HookRecord,
    Manifest,
    manifest_text,
    write_manifest,
)
from kernmlops.collect.output import release_reserve
from kernmlops.errors import OutputError
from kernmlops.host.clock import clock_pair
from kernmlops.host.sysinfo import system_info

if TYPE_CHECKING:
    from kernmlops.collect.parquet import ParquetSink
    from kernmlops.collect.participants import Participant
    from kernmlops.collect.space import SpaceGuard
    from kernmlops.config import Config
    from kernmlops.hooks.base import Hook, HookStatus

__all__ = ["BackgroundWriter", "CollectionResult", "RunningManifest"]


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
    #: the benchmark's setup before the probes attach (linux-build's make defconfig)
    setup_s: float = 0.0
    #: the time the duration limit (-d, benchmark.duration_s) counts: from the
    #: benchmark's start (after setup and attach) to the end of the polling loop;
    #: None when the run did not get that far
    run_s: float | None = None
    hooks: dict[str, HookStatus] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    #: per hook, bytes of records the collection left in its spool (a second Ctrl+C in
    #: the stop, no room left, a hook's bug there): no row made of them yet, and not
    #: counted in its events; ``kernmlops recover`` makes their rows and counts them
    waiting: dict[str, int] = field(default_factory=dict)
    #: the last lines of the benchmark's captured stderr where it failed
    benchmark_stderr: list[str] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        """The whole collection: setup, attach, the run and the stop (the manifest's)."""
        return (self.stopped_at - self.started_at).total_seconds()

    def end_line(self, shown_path: str) -> str:
        """The collection's last line: how it ended after the time the duration limit
        counts (from the benchmark's start), then the benchmark's setup and the probes'
        attach before it, and the whole collection."""
        ran = self.run_s if self.run_s is not None else self.duration_s
        before = []
        if self.setup_s >= 0.05:  # linux-build's make defconfig: seconds before the start
            before.append(f"benchmark setup {self.setup_s:.1f} s")
        # --no-hooks: nothing was attached, the benchmark ran untraced
        before.append(
            f"probes attached in {self.attach_s * 1000:.0f} ms" if self.hooks else "no hooks"
        )
        whole = f"; {self.duration_s:.1f} s in all" if self.run_s is not None else ""
        return f"{self.ended_by} after {ran:.1f} s ({', '.join(before)}{whole}) -> {shown_path}"


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


class RunningManifest:
    """The manifest of the collection in ``path`` as the run goes (``manifest``: None
    until :meth:`begin`, and for good with a caller's sink: nothing on disk).
    ``parquet`` (the run's sink) is set by the session once it exists; ``compaction``
    says per table how compaction went."""

    def __init__(self, path: Path, space: SpaceGuard) -> None:
        self.path = path
        #: where it is written: the collection's folder held open (set by the session)
        self.io = path
        self.space = space
        self.manifest: Manifest | None = None
        self.parquet: ParquetSink | None = None
        self.compaction: dict[str, str] = {}
        self._writer: BackgroundWriter | None = None
        #: the background writer was stopped: only the final manifest is written now
        self._stopped = False
        self._lock = threading.Lock()

    def begin(
        self,
        collection_id: str,
        config: Config,
        started_at: datetime,
        free_bytes_at_start: int | None,
    ) -> None:
        """Write the manifest of a collection that starts now (``state: running``)."""
        cfg = config.collector
        self.manifest = Manifest(
            collection_id=collection_id,
            state="running",
            benchmark=BenchmarkRecord(name=config.benchmark.name),
            started_at=started_at.isoformat(),
            clock=ClockRecord(start=ClockPairRecord(**clock_pair())),
            output={"path": str(self.path), "free_bytes_at_start": free_bytes_at_start},
            filter={"mode": cfg.filter, "tgid": cfg.tgid},
            collector_pid=os.getpid(),
            config=config.model_dump(mode="json"),
        )
        self.save()

    def attached(
        self,
        hooks: Sequence[Hook],
        attach_s: float,
        filter_record: dict[str, object],
        benchmark: BenchmarkRecord,
        privileges: dict[str, Any] | None = None,
    ) -> None:
        """What the attach step settled: the filter, the benchmark's process, the
        system, the versions and the privileges; written at once."""
        assert self.manifest is not None
        self.manifest.attach_s = round(attach_s, 6)
        self.manifest.privileges = privileges
        self.manifest.filter = filter_record
        self.manifest.benchmark = benchmark
        self.manifest.system = system_info()
        self.manifest.versions = _versions()
        self.checkpoint(hooks)

    def write_in_background(self) -> None:
        """From now on checkpoints are written (and synced) by a thread: behind a
        storm's writeback an fsync waited seconds, and the rings overflowed meanwhile."""
        self._writer = BackgroundWriter("kernmlops-manifest")

    def stop_background(self) -> BaseException | None:
        """Join the background writer (its last write may take its time now); the
        error of a write that failed, if one did."""
        writer, self._writer = self._writer, None
        self._stopped = True
        return writer.close() if writer is not None else None

    def checkpoint(self, hooks: Sequence[Hook]) -> None:
        """Rewrite the running manifest now: what attached, events and drops so far, and
        the rows in parts finished by the last durable flush."""
        self.flushed(self.hook_records(hooks))

    def hook_records(self, hooks: Sequence[Hook]) -> dict[str, HookRecord]:
        """Each hook's record as it is now: what attached, events and drops so far (read
        in the poll loop's thread when it asks for a flush; none with nothing on disk)."""
        if self.manifest is None or self.parquet is None:
            return {}
        records = {}
        for h in hooks:
            drops_fn = getattr(h, "drops", None)
            if drops_fn is not None and h.status.attached and not h.status.failed:
                with contextlib.suppress(Exception):  # a closed map: keep the last count
                    h.status.drops = drops_fn()
            records[h.name] = HookRecord.model_validate(h.status.as_dict())
        return records

    def flushed(self, hooks: dict[str, HookRecord]) -> None:
        """Rewrite the running manifest as of the durable flush just done: its finished
        parts' files and rows, ``flushes`` and ``last_flush_at``, with ``hooks`` (their
        records when the flush was asked). The poll loop has the sink's writer thread
        call it once that thread has finished the flush's parts, so the manifest
        written at a flush describes that flush, not the one before. Once the loop
        runs it is written by the background writer, whose error :meth:`check` raises;
        after :meth:`stop_background` a late one is dropped (the final manifest follows)."""
        if self.manifest is None or self.parquet is None:
            return
        parquet = self.parquet
        with self._lock:  # the writer thread's flush and the loop's attach step
            m = self.manifest
            m.hooks.update(hooks)
            files, rows = parquet.checkpoint()
            m.tables = {
                t: {"rows": n, "files": files.get(t, [])}  # type: ignore[misc]
                for t, n in rows.items()
            }
            m.flushes = parquet.durable_flushes
            if parquet.last_durable_flush is not None:
                m.last_flush_at = _wall(parquet.last_durable_flush)
            m.updated_at = datetime.now(UTC).isoformat()
            body = manifest_text(m)  # as it is now: the next flush changes it
        writer = self._writer
        if writer is not None:
            writer.submit(lambda: self.save(text=body))
        elif not self._stopped:
            self.save(text=body)

    def check(self) -> None:
        """Raise the background writer's error now (a full disk), not at the stop."""
        if self._writer is not None:
            self._writer.check()

    def save(self, *, final: bool = False, text: str | None = None) -> None:
        """Write the manifest. The final write first gives back the room reserved at the
        start: by then the benchmark is stopped, so nothing else can take it. A full disk
        before that ends the collection (the reserve keeps the final manifest's room)."""
        assert self.manifest is not None
        if final:
            release_reserve(self.io)
        try:
            write_manifest(self.io, text if text is not None else self.manifest)
        except OSError as err:
            if is_disk_full(err):
                self.space.disk_full = True
                raise OutputError(
                    f"cannot write to {self.path}: the disk is full "
                    f"({human_bytes(free_bytes(self.path))} free). Finished parts are kept."
                ) from None
            raise OutputError(
                f"cannot write the manifest in {self.path}: {err.strerror or err}"
            ) from None

    def finalise(
        self,
        result: CollectionResult,
        benchmark: BenchmarkRecord,
        error: BaseException | None,
        results_error: str | None,
        participants: Sequence[Participant],
    ) -> None:
        """The last write: how the collection ended, per hook and per table; each
        participant adds its part (one that fails is named, and raised after it)."""
        assert self.manifest is not None and self.parquet is not None
        m = self.manifest
        m.state = result.ended_by  # type: ignore[assignment]
        m.benchmark = benchmark
        m.benchmark.exit_code = result.benchmark_exit
        m.stopped_at = result.stopped_at.isoformat()
        m.updated_at = m.stopped_at
        m.clock = ClockRecord(
            start=m.clock.start if m.clock else None, stop=ClockPairRecord(**clock_pair())
        )
        m.duration_s = round(result.duration_s, 6)
        m.attach_s = round(result.attach_s, 6)
        m.exit_code = result.exit_code
        m.error = str(error) if error is not None else None
        m.results_error = results_error
        if m.system is None:  # it ended before attaching
            m.system = system_info()
            m.versions = _versions()
        m.hooks = {n: HookRecord.model_validate(st.as_dict()) for n, st in result.hooks.items()}
        files = self.parquet.files_written()
        m.tables = {
            t: {  # type: ignore[misc]
                "rows": n,
                "files": files.get(t, []),
                "compaction": self.compaction.get(t),
            }
            for t, n in result.rows.items()
        }
        m.flushes = self.parquet.durable_flushes
        if self.parquet.last_durable_flush is not None:  # the close's own flush
            m.last_flush_at = _wall(self.parquet.last_durable_flush)
        if self.parquet.lost_rows:
            m.lost_rows = dict(self.parquet.lost_rows)  # type: ignore[attr-defined]
        m.output = {**(m.output or {}), "free_bytes_at_stop": free_bytes(self.path)}
        failed: Exception | None = None
        for participant in participants:
            try:
                participant.contribute(m, self.io)
            except Exception as err:  # the manifest is still written; raised after it
                failed = failed or err
                m.error = m.error or f"{type(participant).__name__}: {err}"
        self.save(final=True)
        if failed is not None:
            raise failed


def _wall(seconds: float) -> str:
    """A time.time() as the manifest writes times."""
    return datetime.fromtimestamp(seconds, UTC).isoformat()


class BackgroundWriter:
    """One thread for writes the poll loop must not wait for. Only the latest job
    counts (a newer manifest makes an unwritten older one moot); a job's error is
    raised by :meth:`check` (the poll loop's), or returned by :meth:`close`:
    :meth:`submit` never raises, so any thread may hand it a job."""

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
            self._job = job
            self._cond.notify()

    def check(self) -> None:
        """Raise a job's error, once."""
        with self._cond:
            err, self._error = self._error, None
        if err is not None:
            raise err

    def close(self) -> BaseException | None:
        """Finish the pending job; the first error of any job, if one failed."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        return self._error
