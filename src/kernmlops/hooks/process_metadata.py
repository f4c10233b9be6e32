"""process_metadata: snapshots of every task, from a BPF task iterator, and a row
for each task forked or exec'd in between.

One snapshot at start, one at the end, every ``interval_s`` if set, and one
whenever :meth:`ProcessMetadataHook.snapshot` is called. Between them, each task
of the collection's scope that is forked (``fork``: as its parent made it, with
the parent's comm) or exec'd (``exec``: with its new program's comm) gets a row
of its own, from the sched_process_fork and sched_process_exec tracepoints: a
process that starts and ends between two snapshots (a benchmark's children,
whatever ``interval_s``) is recorded all the same. The kernel keeps those
records in a map that each poll empties; a record that found it full is counted
as a drop. With a benchmark
command, ``start`` is taken once the command has been exec'd (it is held at a
gate, a shell, while hooks attach; after a bounded wait, 1 s, it is taken
anyway), so it holds the command's own comm and cmdline. ``end`` is taken
when the command has exited but before it is reaped, or before a command
still running is stopped: what it left running is there with its cmdline; the
main process, if it exited, is a zombie, whose row has its pid, comm and
cgroup but a null cmdline (the kernel has freed its memory, where the command
line lived). Without a benchmark process both are taken at attach and detach. One row per task
(thread; with ``threads: false`` per process):

* ``snapshot`` (``start``, ``end``, ``interval``, or the caller's label; ``fork``
  or ``exec`` for the rows in between) and ``snapshot_seq`` (0, 1, … in the order
  taken; null for ``fork`` and ``exec`` rows), ``ts_uptime_us`` (when the
  iterator visited the task, or when it was forked or exec'd);
* ``pid``, ``tgid``, ``ppid`` (the real parent's tgid), ``comm``, ``cmdline``
  (``/proc/<tgid>/cmdline``, arguments joined by spaces, read when the row is
  made: for ``fork`` and ``exec`` rows at the poll after the event; null where it
  is empty — kernel threads, zombies — or unreadable, as for a process gone by
  then);
* ``start_uptime_us`` (``task->start_time``: CLOCK_MONOTONIC µs, the clock of
  ``ts_uptime_us``) and ``start_boottime_ns`` (``task->start_boottime``:
  CLOCK_BOOTTIME, what ``/proc/<pid>/stat`` field 22 counts in clock ticks);
* ``nice`` (``static_prio - 120``), ``policy`` (the number) and ``policy_name``;
  ``kernel_thread``;
* ``cgroup_id`` (the task's cgroup v2 cgroup: its kernfs id, which is the
  inode of its directory) and ``cgroup_path`` (resolved by walking the
  cgroup2 mount, as in the ``0::`` line of ``/proc/<pid>/cgroup``; null
  where no cgroup2 file system is mounted, or the cgroup was removed: a
  zombie not yet reaped can be left in one).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from kernmlops.ebpf.btf import Kind, RecordLayout, record_layout
from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.frames import records_to_frame
from kernmlops.ebpf.objects import BpfObject, Link, open_and_load
from kernmlops.ebpf.spec import object_spec
from kernmlops.errors import HookUnavailable, KernmlopsError
from kernmlops.hooks.base import HookContext, HookOptions
from kernmlops.hooks.bpf import BpfObjectHook
from kernmlops.lazy import lazy_import
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
else:
    np = lazy_import("numpy")
    pl = lazy_import("polars")


TABLE = "process_metadata"
RECORD = "process_metadata_record"
PROGRAM = "process_metadata"
#: the map of records of tasks forked or exec'd since the last poll, keyed by
#: (pid, event), and the per-CPU count of records that found it full
SEEN, LOST = "process_metadata_seen", "process_metadata_lost"
#: enum process_metadata_event -> the row's snapshot label
EVENTS = ("fork", "exec")
MOUNTINFO = Path("/proc/self/mountinfo")

#: Column order of the table (every record field plus the derived ones).
COLUMNS = (
    "snapshot", "snapshot_seq", UPTIME_TIMESTAMP, "pid", "tgid", "ppid", "comm", "cmdline",
    "start_uptime_us", "start_boottime_ns", "nice", "policy", "policy_name", "kernel_thread",
    "cgroup_id", "cgroup_path",
)  # fmt: skip


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040)."""
    if "\\" not in field:
        return field
    return field.encode().decode("unicode_escape").encode("latin-1").decode(errors="replace")


def cgroup2_mount(mountinfo: str | None = None) -> tuple[Path, str] | None:
    """(mount point, the hierarchy path mounted there) of the first cgroup2
    mount, from /proc/self/mountinfo; None if there is none."""
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text()
        except OSError:
            return None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            return Path(_unescape(fields[4])), _unescape(fields[3])
    return None


class CgroupPaths:
    """cgroup id -> path in the cgroup v2 hierarchy. On cgroup2 a cgroup's id is
    the inode number of its directory, so one walk of the mount maps them all;
    the walk is redone when an id is not known (a cgroup made since)."""

    def __init__(self, mount: tuple[Path, str] | None = None) -> None:
        self.mount = mount if mount is not None else cgroup2_mount()
        self._paths: dict[int, str] = {}

    def _walk(self) -> None:
        if self.mount is None:
            return
        root, prefix = self.mount
        paths: dict[int, str] = {}
        for dirpath, _dirs, _files in os.walk(root):
            try:
                ino = os.stat(dirpath).st_ino
            except OSError:  # removed while walking
                continue
            rel = os.path.relpath(dirpath, root)
            paths[ino] = (
                prefix if rel == "." else os.path.join(prefix, rel) if prefix != "/" else "/" + rel
            )
        self._paths = paths

    def resolve(self, ids: np.ndarray) -> list[str | None]:
        unique = set(np.unique(ids).tolist())
        if unique - self._paths.keys():
            self._walk()
        return [self._paths.get(i) for i in ids.tolist()]


def read_cmdline(tgid: int) -> str | None:
    """Arguments joined by spaces; None for an empty (kernel thread, zombie) or
    unreadable command line."""
    try:
        raw = Path(f"/proc/{tgid}/cmdline").read_bytes()
    except OSError:
        return None
    args = raw.rstrip(b"\0").split(b"\0")
    text = b" ".join(args).decode(errors="replace")
    return text or None


class ProcessMetadataOptions(HookOptions):
    threads: bool = Field(True, description="a row per thread; false: per process only")
    cmdline: bool = Field(True, description="read each process's /proc/<pid>/cmdline")
    interval_s: float = Field(
        0,
        ge=0,
        le=86400,
        description="also take a snapshot of every task every N seconds (0: never; each "
        "task forked or exec'd in between gets a row of its own whatever this is)",
    )


class ProcessMetadataHook(BpfObjectHook[ProcessMetadataOptions]):
    """Snapshots of every task (see the module doc for the columns)."""

    libraries: ClassVar[tuple[str, ...]] = ("polars",)  # rows are built with polars

    name: ClassVar[str] = "process_metadata"
    object_name: ClassVar[str] = "process_metadata"
    tables: ClassVar[tuple[str, ...]] = (TABLE,)
    needs: ClassVar[tuple[str, ...]] = ("iter/task", "tp_btf|raw_tp")

    def __init__(self, options: ProcessMetadataOptions | HookOptions | None = None) -> None:
        super().__init__(options)
        self._layout: RecordLayout | None = None
        self._link: Link | None = None
        self._cgroups = CgroupPaths()
        self._pending: list[pl.DataFrame] = []
        self._seq = 0
        self._next_s = float("inf")
        #: "start" waits for benchmark_started(); "end" is taken once
        self._start_pending = False
        self._ended = False
        # snapshot() may be called from another thread than the poll loop.
        self._lock = threading.Lock()

    def start(self, ctx: HookContext) -> None:
        path = object_path(self.object_name, ctx.bpf_dir)
        if not path.exists():
            raise HookUnavailable(
                f"{self.name}: BPF object {path} not found (build it: kernmlops build-bpf)"
            )
        flt = ctx.process_filter
        try:
            btf = object_spec(path).btf
            self._layout = record_layout(btf, btf.find(Kind.STRUCT, RECORD))
            self.obj = open_and_load(
                path,
                globals_={
                    "kmo_self_tgid": ctx.self_tgid,
                    "kmo_filter_on": flt is not None,
                    "kmo_leaders_only": not self.options.threads,
                },
                reuse_maps={"kmo_tracked": flt.fd} if flt else {},
            )
            self.attach(self.obj)
            self.status.variant = f"iter/task, {self.obj.variant}"
            self.status.programs = [p.section for p in self.obj.programs.values() if p.autoload]
            self.status.attached = True
            if ctx.benchmark_pid is None:
                self.snapshot("start")
            else:
                self._start_pending = True  # the gate shell stands in for the command
        except (KernmlopsError, OSError) as err:
            self.close()
            raise HookUnavailable(f"{self.name}: {err}") from err
        if self.options.interval_s:
            self._next_s = time.monotonic() + self.options.interval_s

    def attach(self, obj: BpfObject) -> None:
        # An iterator link runs nothing by itself: each read of a new iterator
        # fd made from it walks every task once.
        self._link = obj.programs[PROGRAM].attach_iter()
        for prog in obj.programs.values():
            if prog.autoload and prog.name != PROGRAM:
                prog.attach()  # fork and exec, into the map of tasks seen

    def read_records(self) -> np.ndarray:
        """One iterator pass: a record per wanted task, decoded in one call."""
        if self._link is None or self._layout is None:
            raise HookUnavailable(f"{self.name}: not started")
        data = self._link.read_iter()
        item = self._layout.itemsize
        if len(data) % item:
            raise KernmlopsError(
                f"{self.name}: iterator returned {len(data)} bytes, not whole {item}-byte records"
            )
        return np.frombuffer(data, self._layout.dtype)

    def snapshot(self, label: str = "on_demand") -> pl.DataFrame:
        """Take a snapshot now; its rows are returned and also written to the
        table at the next poll."""
        with self._lock:
            records = self.read_records()
            assert self._layout is not None
            frame = self._frame(records, self._layout, label, self._seq)
            self._seq += 1
            self.status.events += len(records)
            self._pending.append(frame)
        return frame

    def take_seen(self) -> pl.DataFrame | None:
        """The rows of the tasks forked or exec'd since the last call, taken out of the
        kernel's map (in the order they happened); None when there are none."""
        if self.obj is None or self._layout is None:
            return None
        seen = self.obj.map(SEEN)
        raw: list[bytes] = []
        events: list[str] = []
        for key in list(seen.keys()):  # a key taken out ends the kernel's walk: listed first
            value = seen.pop(key)
            if value is not None:
                raw.append(value)
                events.append(EVENTS[int.from_bytes(key[4:8], "little")])
        if not raw:
            return None
        records = np.frombuffer(b"".join(raw), self._layout.dtype)
        labels = pl.Series("snapshot", events, pl.String)
        frame = self._frame(records, self._layout, labels, None)
        self.status.events += len(records)
        return frame.sort(UPTIME_TIMESTAMP, maintain_order=True)

    def drops(self) -> int:
        """Fork and exec records that found the kernel's map full."""
        if self.obj is None or LOST not in self.obj.maps:
            return 0
        return self.obj.map(LOST).percpu_total(0)

    def _frame(
        self,
        records: np.ndarray,
        layout: RecordLayout,
        label: str | pl.Series,
        seq: int | None,
    ) -> pl.DataFrame:
        frame = records_to_frame(records, layout)
        tgids = records["tgid"]
        if self.options.cmdline:
            uniq = np.unique(tgids)
            lines = {int(t): read_cmdline(int(t)) for t in uniq.tolist()}
            cmdline = pl.Series("cmdline", [lines[t] for t in tgids.tolist()], pl.String)
        else:
            cmdline = pl.Series("cmdline", [None] * len(records), pl.String)
        cgroup = pl.Series("cgroup_path", self._cgroups.resolve(records["cgroup_id"]), pl.String)
        return frame.with_columns(
            label if isinstance(label, pl.Series) else pl.lit(label, pl.String).alias("snapshot"),
            pl.lit(seq, pl.UInt32).alias("snapshot_seq"),
            cmdline,
            cgroup,
        ).select(COLUMNS)

    def poll(self) -> Iterator[tuple[str, pl.DataFrame]]:
        if self._link is not None and time.monotonic() >= self._next_s:
            self._next_s = time.monotonic() + self.options.interval_s
            self.snapshot("interval")
        seen = self.take_seen()
        with self._lock:
            pending, self._pending = self._pending, []
        if seen is not None:
            pending.append(seen)
        if pending:
            yield TABLE, pl.concat(pending)

    def benchmark_started(self, pid: int) -> None:
        if self._start_pending and self._link is not None:
            self._start_pending = False
            self.snapshot("start")

    def benchmark_ending(self) -> None:
        if self._link is not None and not self._ended:
            self.benchmark_started(0)  # never released (it died at the gate): still a start
            self._ended = True
            self.snapshot("end")

    def detach(self) -> None:
        # The end snapshot needs the iterator's link: taken just before it goes.
        if self._link is not None:
            self.benchmark_ending()
            self._link = None
        super().detach()

    def close(self) -> None:
        self._link = None  # destroyed with the object's links
        super().close()
