"""ebpf_exporter's ``cgroup_id_map``: the exporter keeps a BPF map filled with
the cgroups whose paths match any of the config's regexps, so its program can
count only those (``bpf_map_lookup_elem(&map, &cgroup_id)``).

- ``type: hash`` (the default; any hash map, LRU too): the key is the cgroup
  id (u64: the inode number of its cgroup v2 directory), the value u64 1; a
  removed cgroup's key is deleted.
- ``type: cgrp_storage`` (BPF_MAP_TYPE_CGRP_STORAGE): the value u64 1 is
  stored on the cgroup itself (keyed by an fd of its directory); the kernel
  drops it with the cgroup.

A path is the cgroup's full path (``/sys/fs/cgroup/system.slice/x.service``:
the mount point of the cgroup v2 hierarchy, then the cgroup), matched as Go's
``MatchString`` matches: anywhere in the path unless anchored.

The map is filled before the set's programs attach, then kept in step by a
thread: woken by fanotify when a cgroup directory is made or removed anywhere
in the hierarchy (kernel 6.6+), where fanotify works, and by a walk every
:data:`RESCAN_S` seconds in any case (every :data:`POLL_S` seconds without
fanotify). Each wake walks the hierarchy and adds and deletes what changed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import sys
import threading
from pathlib import Path

from kernmlops.ebpf.libbpf import LibbpfError
from kernmlops.ebpf.objects import Map
from kernmlops.errors import KernmlopsError

HASH, CGRP_STORAGE = "hash", "cgrp_storage"
TYPES = (HASH, CGRP_STORAGE)
#: key bytes per type: a u64 cgroup id, or a u32 fd of the cgroup's directory
KEY_SIZE = {HASH: 8, CGRP_STORAGE: 4}
#: seconds between walks without fanotify
POLL_S = 1.0
#: seconds between walks with fanotify (a safety net: its queue can overflow)
RESCAN_S = 30.0
_ONE = (1).to_bytes(8, "little")

# include/uapi/linux/fanotify.h
_FAN_CLOEXEC, _FAN_NONBLOCK = 0x1, 0x2
_FAN_REPORT_DFID_NAME = 0x400 | 0x800
_FAN_MARK_ADD, _FAN_MARK_ONLYDIR, _FAN_MARK_FILESYSTEM = 0x1, 0x8, 0x100
_FAN_CREATE, _FAN_DELETE, _FAN_ONDIR = 0x100, 0x200, 0x40000000
_AT_FDCWD = -100


class CgroupIdMapError(KernmlopsError):
    """The cgroup id map does not fit the config, or cannot be kept."""


def walk(root: Path) -> dict[int, str]:
    """Every cgroup below ``root`` (and ``root``): id -> full path."""
    out: dict[int, str] = {}
    stack = [str(root)]
    while stack:
        directory = stack.pop()
        try:
            out[os.stat(directory).st_ino] = directory
            with os.scandir(directory) as it:
                stack.extend(e.path for e in it if e.is_dir(follow_symlinks=False))
        except OSError:
            continue  # removed while we walked
    return out


def _fanotify(root: Path) -> int | None:
    """An fd that becomes readable when a directory is made or removed on the
    file system of ``root``; None where fanotify cannot watch it (before 6.6,
    cgroupfs has no fsid; without CAP_SYS_ADMIN)."""
    libc = ctypes.CDLL(None, use_errno=True)
    init, mark = libc.fanotify_init, libc.fanotify_mark
    init.argtypes, init.restype = [ctypes.c_uint, ctypes.c_uint], ctypes.c_int
    mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
    mark.restype = ctypes.c_int
    fd = init(_FAN_CLOEXEC | _FAN_NONBLOCK | _FAN_REPORT_DFID_NAME, os.O_RDONLY)
    if fd < 0:
        return None
    flags = _FAN_MARK_ADD | _FAN_MARK_ONLYDIR | _FAN_MARK_FILESYSTEM
    if mark(fd, flags, _FAN_CREATE | _FAN_DELETE | _FAN_ONDIR, _AT_FDCWD, str(root).encode()) < 0:
        os.close(fd)
        return None
    return fd


class CgroupIdMap:
    """Keeps ``bpf_map`` holding the cgroups below ``root`` whose full paths
    match one of ``patterns``. Filled when made; :meth:`start` keeps it in step
    from a thread until :meth:`close`."""

    def __init__(
        self,
        bpf_map: Map,
        kind: str,
        patterns: list[re.Pattern[str]],
        root: Path,
        *,
        where: str = "cgroup_id_map",
        watch: bool = True,
    ) -> None:
        if kind not in TYPES:
            raise CgroupIdMapError(f"{where}: type {kind!r} is not one of {', '.join(TYPES)}")
        if bpf_map.key_size != KEY_SIZE[kind]:
            what = "a u64 cgroup id" if kind == HASH else "a u32 cgroup fd"
            raise CgroupIdMapError(
                f"{where}: map {bpf_map.name} has {bpf_map.key_size}-byte keys; type {kind} "
                f"needs {KEY_SIZE[kind]} ({what})"
            )
        if bpf_map.value_size != 8:
            raise CgroupIdMapError(
                f"{where}: map {bpf_map.name} has {bpf_map.value_size}-byte values, not one u64"
            )
        self.map = bpf_map
        self.kind = kind
        self.patterns = patterns
        self.root = root
        self.where = where
        #: id -> path of the matching cgroups put in the map
        self.present: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake = _fanotify(root) if watch else None
        self._stop_r, self._stop_w = os.pipe()
        try:
            self.sync()
        except BaseException:
            self.close()
            raise

    @property
    def watched(self) -> bool:
        """True when fanotify wakes the thread (else it walks every POLL_S)."""
        return self._wake is not None

    def matches(self, path: str) -> bool:
        return any(p.search(path) for p in self.patterns)

    def sync(self) -> None:
        """Walk the hierarchy once: add the matching cgroups not in the map,
        delete those gone."""
        wanted = {cg: path for cg, path in walk(self.root).items() if self.matches(path)}
        for cg_id in [c for c in self.present if c not in wanted]:
            if self.kind == HASH:
                self.map.delete(cg_id)  # absent already (an LRU map evicted it): fine
            del self.present[cg_id]
        for cg_id, path in wanted.items():
            if cg_id not in self.present and self._add(cg_id, path):
                self.present[cg_id] = path

    def _add(self, cg_id: int, path: str) -> bool:
        if self.kind == HASH:
            self.map.update(cg_id, _ONE)
            return True
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return False  # removed since the walk
        try:
            self.map.update(fd.to_bytes(4, "little"), _ONE)
        finally:
            os.close(fd)
        return True

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"cgroup-id-map-{self.map.name}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        wait_s = RESCAN_S if self._wake is not None else POLL_S
        watched = [self._stop_r, *([self._wake] if self._wake is not None else [])]
        while not self._stop.is_set():
            ready, _, _ = select.select(watched, [], [], wait_s)
            if self._stop_r in ready:
                break
            if ready:
                self._drain()
            try:
                self.sync()
            except (OSError, LibbpfError) as err:
                print(f"kernmlops export: {self.where}: {err}", file=sys.stderr)

    def _drain(self) -> None:
        """Read every waiting event: one walk answers them all."""
        assert self._wake is not None
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake, 65536):
                pass

    def close(self) -> None:
        """Stop the thread (idempotent); the map is left as it is."""
        self._stop.set()
        if self._stop_w >= 0:
            os.write(self._stop_w, b"x")  # wakes the thread's select
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._wake is not None:
            os.close(self._wake)
            self._wake = None
        if self._stop_w >= 0:
            os.close(self._stop_r)
            os.close(self._stop_w)
            self._stop_r = self._stop_w = -1
