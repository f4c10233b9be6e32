"""process_metadata: snapshots of every task, from a BPF task iterator, and a row
for each task forked or exec'd in between.

One snapshot at start, one at the end, every ``interval_s`` if set, and one
whenever :meth:`ProcessMetadataHook.snapshot` is called. Between them, each task
of the collection's scope that is forked (``fork``: as its parent made it, with
the parent's comm) or exec'd (``exec``: with its new program's comm) gets a row
of its own, from the sched_process_fork and sched_process_exec tracepoints: a
process that starts and ends between two snapshots (a benchmark's children,
whatever ``interval_s``) is recorded all the same, each exec of a pid (``sh -c
'exec prog'`` execs one pid twice) with a row of its own. The programs write
those records into a ring buffer, which user space reads by mapping it, as every
ring of kernmlops (no system call per row); a record that found it full is
counted as a drop. With a benchmark
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
  (the arguments joined by spaces, as ``/proc/<tgid>/cmdline`` gives them; null
  where there are none — kernel threads, zombies — or they could not be read).
  Snapshot rows read ``/proc/<tgid>/cmdline`` when the snapshot is taken. Fork
  and exec rows carry what the BPF program read at the event, from the task's
  memory (``mm->arg_start`` to ``arg_end``), so a process gone before the poll
  has its command line too: an exec row the new program's, a fork row the one
  the child had when forked (its parent's, until it execs). The program reads
  at most 512 bytes of it (:func:`args_limit`); a longer one is completed from
  ``/proc/<tgid>/cmdline`` at the poll when the process still has it (it starts
  with the bytes read), else it stays cut there (counted in the manifest as
  ``cmdline_cut``). Where the program could not read it (a page not in memory,
  which a tracepoint cannot fault in), the poll's ``/proc/<tgid>/cmdline`` is
  taken, if any (``cmdline_unread`` counts those left null). /proc is read only
  while the pid is still the record's task (its start time, /proc/<pid>/stat's
  field 22), for a snapshot's rows as for these: a pid reused since is another
  process, whose command line is never taken;
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
from kernmlops.ebpf.objects import BpfObject, Link
from kernmlops.ebpf.spec import object_spec
from kernmlops.errors import HookUnavailable, KernmlopsError
from kernmlops.hooks.base import HookContext
from kernmlops.hooks.bpf import BpfHook, BpfHookOptions
from kernmlops.lazy import lazy_import
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
    import pyarrow as pa
else:
    np = lazy_import("numpy")
    pl = lazy_import("polars")
    pa = lazy_import("pyarrow")


TABLE = "process_metadata"
RECORD = "process_metadata_record"
PROGRAM = "process_metadata"
#: the ring of fork and exec records (struct process_metadata_event_record: the
#: task's record as ``task``, the event, the argument block read at the event)
RING = "process_metadata_rb"
#: the ring record's member that holds the first bytes of a task's argument block
ARGS = "args"
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


def proc_cmdline(tgid: int) -> bytes | None:
    """``/proc/<tgid>/cmdline`` as the kernel gives it (NUL-separated), None if it
    cannot be read."""
    try:
        return Path(f"/proc/{tgid}/cmdline").read_bytes()
    except OSError:
        return None


#: nanoseconds per clock tick of /proc/<pid>/stat's times (USER_HZ)
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def task_cmdline(tgid: int, pid: int, start_boottime_ns: int) -> bytes | None:
    """``/proc/<tgid>/cmdline`` as :func:`proc_cmdline` gives it, only while task
    ``pid`` of it is still the one that started at ``start_boottime_ns``
    (``task->start_boottime``, which /proc/<pid>/stat's field 22 says in clock
    ticks): a pid reused by another process since gives None, never its command line.
    The task's folder is held open for both reads: a task that exits in between
    leaves the folder dead, never another's."""
    try:
        fd = os.open(f"/proc/{tgid}/task/{pid}", _DIR_FLAGS)
    except OSError:
        return None
    try:
        stat = _read_at(fd, "stat")
        fields = stat.rsplit(b")", 1)[-1].split()  # the comm may hold anything
        if len(fields) < 20 or int(fields[19]) != start_boottime_ns // _TICK_NS:
            return None  # field 22 (the 20th after the comm): another process
        return _read_at(fd, "cmdline")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def snapshot_cmdlines(tasks: np.ndarray) -> pl.Series:
    """The command lines of a snapshot's task records (their ``tgid``, ``pid`` and
    ``start_boottime_ns``): ``/proc/<tgid>/cmdline`` read now, once a process, and
    only while it is still the one the iterator saw (:func:`task_cmdline`, with its
    main thread's record where it has one: another may have ended since); null for
    a process gone or whose pid was reused since the snapshot."""
    seen: dict[int, tuple[int, int]] = {}  # tgid -> (pid, start) of the task checked
    for tgid, pid, start in zip(
        tasks["tgid"].tolist(),
        tasks["pid"].tolist(),
        tasks["start_boottime_ns"].tolist(),
        strict=True,
    ):
        if tgid not in seen or pid == tgid:
            seen[tgid] = (pid, start)
    lines = {tgid: join_args(task_cmdline(tgid, *task)) for tgid, task in seen.items()}
    return pl.Series("cmdline", [lines[t] for t in tasks["tgid"].tolist()], pl.String)


def _read_at(folder: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=folder)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def join_args(raw: bytes | None) -> str | None:
    """NUL-separated arguments joined by spaces; None for none (empty, unreadable)."""
    if raw is None:
        return None
    text = b" ".join(raw.rstrip(b"\0").split(b"\0")).decode(errors="replace")
    return text or None


def read_cmdline(tgid: int) -> str | None:
    """Arguments joined by spaces; None for an empty (kernel thread, zombie) or
    unreadable command line."""
    return join_args(proc_cmdline(tgid))


def args_limit(bpf_dir: Path | None = None) -> int:
    """Bytes of a task's argument block a fork or exec record holds (the BPF
    program's PROCESS_METADATA_ARGS), from the built object's BTF."""
    btf = object_spec(object_path(PROGRAM, bpf_dir)).btf
    return record_layout(btf, btf.ring_record(RING)).dtype[ARGS].itemsize


def args_to_cmdlines(blocks: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """Argument blocks as :func:`join_args` joins them, without Python per row:
    ``blocks`` is uint8 (rows, width), of which each row's first ``lengths`` bytes
    are its block (NUL-separated arguments, maybe cut); trailing NULs are dropped,
    the others become spaces; null where nothing is left. Bytes that are not UTF-8
    (an argument cut inside a character) are replaced, as join_args does."""
    n, width = blocks.shape
    col = np.arange(width)
    text = (blocks != 0) & (col < np.minimum(lengths, width)[:, None])
    ends = np.where(text.any(axis=1), width - np.argmax(text[:, ::-1], axis=1), 0)
    keep = col < ends[:, None]
    data = np.where(blocks == 0, np.uint8(0x20), blocks)[keep]  # row after row
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(ends, out=offsets[1:])
    valid = pa.py_buffer(np.packbits(ends > 0, bitorder="little"))
    buffers = [valid, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))]
    if not (data >= 0x80).any():
        return pa.Array.from_buffers(pa.large_string(), n, buffers)
    raw = pa.Array.from_buffers(pa.large_binary(), n, buffers)
    return pa.array(
        [None if b is None else b.decode(errors="replace") for b in raw.to_pylist()],
        pa.large_string(),
    )


def event_dtype(ring: RecordLayout, task: RecordLayout) -> np.dtype:
    """The ring record's dtype with its ``task`` member as one field of the task
    record's dtype (the iterator's), and the rest as they are: a drained batch is
    viewed with it, and its tasks made into rows as a snapshot's are."""
    fields = ring.dtype.fields or {}
    task_fields = task.dtype.fields or {}
    first = next(iter(task_fields))
    base = fields[f"task_{first}"][1] - task_fields[first][1]
    for name, (dt, off, *_) in task_fields.items():
        if fields.get(f"task_{name}", (None, None))[:2] != (dt, base + off):
            raise KernmlopsError(f"{ring.name}.task.{name} is not laid out as {task.name}.{name}")
    rest = [n for n in ring.dtype.names or () if not n.startswith("task_")]
    return np.dtype(
        {
            "names": ["task", *rest],
            "formats": [task.dtype, *(fields[n][0] for n in rest)],
            "offsets": [base, *(fields[n][1] for n in rest)],
            "itemsize": ring.dtype.itemsize,
        }
    )


class ProcessMetadataOptions(BpfHookOptions):
    threads: bool = Field(True, description="a row per thread; false: per process only")
    cmdline: bool = Field(
        True,
        description="a cmdline column: /proc/<pid>/cmdline for snapshots, the argument "
        "block read by the BPF program at each fork and exec (false: null, and nothing "
        "is read)",
    )
    interval_s: float = Field(
        0,
        ge=0,
        le=86400,
        description="also take a snapshot of every task every N seconds (0: never; each "
        "task forked or exec'd in between gets a row of its own whatever this is)",
    )
    # A 616-byte record per fork and exec (512 of them the argument block): 2 MiB hold
    # 3,400, about a second of `stress-ng --fork 2` on 2 vCPUs, drained at a quarter.
    ring_kib: int = Field(
        2048, ge=4, le=1 << 20, description="size of each ring buffer in KiB (a power of two)"
    )


class ProcessMetadataHook(BpfHook[ProcessMetadataOptions]):
    """Snapshots of every task (see the module doc for the columns)."""

    libraries: ClassVar[tuple[str, ...]] = ("polars",)  # rows are built with polars

    name: ClassVar[str] = "process_metadata"
    object_name: ClassVar[str] = "process_metadata"
    rings: ClassVar[dict[str, str]] = {TABLE: RING}
    tables: ClassVar[tuple[str, ...]] = (TABLE,)
    needs: ClassVar[tuple[str, ...]] = ("iter/task", "tp_btf|raw_tp", "ringbuf")

    def __init__(self, options: ProcessMetadataOptions | BpfHookOptions | None = None) -> None:
        super().__init__(options)
        self._layout: RecordLayout | None = None
        self._events: np.dtype | None = None
        self._link: Link | None = None
        self._cgroups = CgroupPaths()
        self._pending: list[pl.DataFrame] = []
        self._seq = 0
        self._next_s = float("inf")
        #: "start" waits for benchmark_started(); "end" is taken once
        self._start_pending = False
        self._ended = False
        #: fork and exec rows whose command line stayed cut (args_limit), and those
        #: whose argument block could not be read nor found in /proc
        self._cut = 0
        self._unread = 0
        # snapshot() may be called from another thread than the poll loop.
        self._lock = threading.Lock()

    def extra_globals(self) -> dict[str, int | bool]:
        return {
            "kmo_leaders_only": not self.options.threads,
            "kmo_capture_args": self.options.cmdline,
        }

    def start(self, ctx: HookContext) -> None:
        super().start(ctx)  # loads the object, maps the ring, attaches (attach below)
        try:
            assert self._spec is not None and self.obj is not None
            btf = self._spec.btf
            self._layout = record_layout(btf, btf.find(Kind.STRUCT, RECORD))
            self.status.variant = f"iter/task, {self.obj.variant}"
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
                prog.attach()  # fork and exec, into the ring

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

    def event_frame(self, records: np.ndarray, ring: RecordLayout) -> pl.DataFrame:
        """The rows of fork and exec records drained from the ring (``ring``'s
        layout), in the order they happened."""
        assert self._layout is not None
        if self._events is None:
            self._events = event_dtype(ring, self._layout)
        events = records.view(self._events)
        labels = pl.Series("snapshot", events["event"]).replace_strict(
            ring.enums["event"], default=None, return_dtype=pl.String
        )
        cmdline = self._event_cmdlines(events) if self.options.cmdline else None
        frame = self._frame(events["task"], self._layout, labels, None, cmdline)
        return frame.sort(UPTIME_TIMESTAMP, maintain_order=True)

    def _event_cmdlines(self, events: np.ndarray) -> pl.Series:
        """The command lines of fork and exec records: their argument blocks, and
        /proc's where a block was cut or not read (see the module doc)."""
        width = events.dtype[ARGS].itemsize
        blocks = np.ascontiguousarray(events[ARGS]).view(np.uint8).reshape(-1, width)
        size, length = events["args_size"], events["args_len"]
        lines = pl.Series("cmdline", args_to_cmdlines(blocks, length), pl.String)
        task = events["task"]
        tgids, pids, starts = task["tgid"], task["pid"], task["start_boottime_ns"]
        procs: dict[tuple[int, int, int], bytes | None] = {}  # a task's records: one read
        whole: dict[int, str | None] = {}
        for i in np.flatnonzero(length < size).tolist():
            got = blocks[i, : length[i]].tobytes()
            key = (int(tgids[i]), int(pids[i]), int(starts[i]))
            if key not in procs:
                procs[key] = task_cmdline(*key)  # still the record's process, or None
            raw = procs[key]
            if raw is not None and len(raw) > len(got) and raw.startswith(got):
                whole[i] = join_args(raw)  # still running what was cut: all of it
            elif got:
                self._cut += 1
            else:
                self._unread += 1
        if whole:
            lines = lines.scatter(list(whole), list(whole.values()))
        return lines

    def counters(self) -> dict[str, int]:
        return {"cmdline_cut": self._cut, "cmdline_unread": self._unread}

    def _frame(
        self,
        records: np.ndarray,
        layout: RecordLayout,
        label: str | pl.Series,
        seq: int | None,
        cmdline: pl.Series | None = None,
    ) -> pl.DataFrame:
        frame = records_to_frame(records, layout)
        if cmdline is None and self.options.cmdline:  # a snapshot's: /proc's now
            cmdline = snapshot_cmdlines(records)
        elif cmdline is None:
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
        seen = [self.event_frame(records, ring) for _, records, ring in self.drain_due()]
        with self._lock:
            pending, self._pending = self._pending, []
        pending += seen
        if pending:
            yield TABLE, pl.concat(pending)

    def next_poll(self, now: float) -> float | None:
        """The ring's time (BpfHook's), or the next interval snapshot's if sooner;
        every poll interval while a snapshot's rows wait."""
        due = self.rings_due(now)
        if due is None or self._pending:
            return None
        return min(due, self._next_s)

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
