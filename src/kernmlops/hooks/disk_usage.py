"""disk_usage: how full each filesystem is, sampled (statvfs, as df computes it).

KernMLOps records its disks in the system information of a collection; this
hook follows their space over the run. One row per filesystem per sample in
``disk_usage``: ``mount_point``, ``device`` (the mount's source: ``/dev/vda``,
``tmpfs``, ``server:/export``), ``fs_type``, ``total_bytes``, ``used_bytes``
(total - free, df's "Used"), ``free_bytes``, ``available_bytes`` (what an
unprivileged user may still write, df's "Avail"), ``inodes_total``,
``inodes_free``.

By default every mounted filesystem backed by a block device (/dev/...) is
followed, each device once. ``paths`` names the paths to follow instead, on any
filesystem (tmpfs, NFS, overlay too): each is followed on the mount that holds
it, found as df finds it, by the path's device number (``st_dev``) among the
mounts of /proc/self/mountinfo. Paths on one filesystem give it one row per
sample, under the mount point of the first of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from kernmlops.errors import HookUnavailable
from kernmlops.hooks.base import HookContext, HookOptions, SampledHook, SampledHookOptions
from kernmlops.lazy import lazy_import
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    import pyarrow as pa

    from kernmlops.tables import Rows
else:
    pa = lazy_import("pyarrow")

TABLE = "disk_usage"
MOUNTINFO = Path("/proc/self/mountinfo")


def _unescape(field: str) -> str:
    """/proc/self/mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo."""

    point: str
    dev: int  # the st_dev of every file on it (major:minor)
    source: str
    fs_type: str


def parse_mountinfo(text: str) -> list[Mount]:
    """Every mount of /proc/self/mountinfo text, in its order (a mount made over
    another comes after it)."""
    out: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        major, _, minor = fields[2].partition(":")
        out.append(
            Mount(_unescape(fields[4]), os.makedev(int(major), int(minor)),
                  _unescape(tail[1]), tail[0])
        )  # fmt: skip
    return out


def block_mounts(mounts: list[Mount]) -> list[Mount]:
    """Each block-device filesystem once: its first mount (bind mounts repeat it)."""
    seen: set[int] = set()
    out: list[Mount] = []
    for m in mounts:
        if m.source.startswith("/dev/") and m.dev not in seen:
            seen.add(m.dev)
            out.append(m)
    return out


def _under(path: str, point: str) -> bool:
    return path == point or path.startswith(point.rstrip("/") + "/")


def mount_of(path: str, mounts: list[Mount], dev: int | None = None) -> Mount | None:
    """The mount holding ``path``: among the mounts of its filesystem (``dev``, its
    st_dev: stat'd when None) the one with the longest mount point above it.

    The device number, not the path alone: a mount hidden under another at the
    same point (/dev/shm mounted twice) or a bind mount of a subdirectory would
    match by prefix and be the wrong filesystem. With no mount of that number
    (a btrfs subvolume has its own), the longest mount point above the path,
    the last made when two are at the same point."""
    real = os.path.realpath(path)
    if dev is None:
        dev = os.stat(real).st_dev
    for pool in ([m for m in mounts if m.dev == dev], mounts):
        best: Mount | None = None
        for m in pool:
            if _under(real, m.point) and (best is None or len(m.point) >= len(best.point)):
                best = m
        if best is not None:
            return best
        if pool:  # its filesystem, mounted only outside this path's tree (a bind mount)
            return pool[-1]
    return None


class DiskUsageOptions(SampledHookOptions):
    poll_hz: float = Field(1, gt=0, le=1000, description="samples per second")
    paths: list[str] = Field(
        default_factory=list,
        description=(
            "paths whose filesystems to follow (each once, any type); empty: every"
            " filesystem on a block device"
        ),
    )


class DiskUsageHook(SampledHook[DiskUsageOptions]):
    """Space and inodes of each filesystem, sampled with statvfs."""

    name: ClassVar[str] = "disk_usage"
    tables: ClassVar[tuple[str, ...]] = (TABLE,)
    needs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: DiskUsageOptions | HookOptions | None = None) -> None:
        super().__init__(options)
        #: (path statvfs reads, its mount) per filesystem followed
        self.filesystems: list[tuple[str, Mount]] = []

    def start(self, ctx: HookContext | None = None) -> None:
        try:
            mounts = parse_mountinfo(MOUNTINFO.read_text())
        except OSError as e:
            raise HookUnavailable(f"{self.name}: cannot read {MOUNTINFO}: {e.strerror}") from e
        if self.options.paths:
            self.filesystems = self._resolve(self.options.paths, mounts)
        else:
            self.filesystems = [(m.point, m) for m in block_mounts(mounts)]
        if not self.filesystems:
            raise HookUnavailable(f"{self.name}: no filesystem on a block device is mounted")
        self.status.attached = True
        self.status.variant = "statvfs"
        self.status.programs = [m.point for _, m in self.filesystems]
        self._start_sampling()

    def _resolve(self, paths: list[str], mounts: list[Mount]) -> list[tuple[str, Mount]]:
        """Each named filesystem once, read through the first path on it (the path
        itself: its mount point may be hidden under a later mount)."""
        by_dev: dict[int, tuple[str, Mount]] = {}
        for path in paths:
            try:
                dev = os.stat(path).st_dev
            except OSError as e:
                raise HookUnavailable(f"{self.name}: no such path: {path} ({e.strerror})") from e
            mount = mount_of(path, mounts, dev)
            if mount is None:  # not in this namespace's mountinfo: named by the path
                mount = Mount(os.path.realpath(path), dev, "", "")
            by_dev.setdefault(dev, (path, mount))
        return list(by_dev.values())

    def _sample(self, now_ns: int) -> None:
        ts = now_ns // 1000
        for path, m in self.filesystems:
            try:
                st = os.statvfs(path)
            except OSError:
                continue  # unmounted during the run: a gap in its rows
            self._rows.append(
                (ts, m.point, m.source, m.fs_type, st.f_blocks * st.f_frsize,
                 (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bfree * st.f_frsize,
                 st.f_bavail * st.f_frsize, st.f_files, st.f_ffree)
            )  # fmt: skip
            self.status.events += 1

    _SCHEMA: ClassVar[list[tuple[str, str]]] = [
        (UPTIME_TIMESTAMP, "int64"), ("mount_point", "string"), ("device", "string"),
        ("fs_type", "string"), ("total_bytes", "int64"), ("used_bytes", "int64"),
        ("free_bytes", "int64"), ("available_bytes", "int64"), ("inodes_total", "int64"),
        ("inodes_free", "int64"),
    ]  # fmt: skip

    def _frames(self, taken: list[tuple]) -> Iterator[tuple[str, Rows]]:
        if taken:
            columns = list(zip(*taken, strict=True))
            yield (
                TABLE,
                pa.table(
                    {
                        name: pa.array(col, type=kind)
                        for (name, kind), col in zip(self._SCHEMA, columns, strict=True)
                    }
                ),
            )
