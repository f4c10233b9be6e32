"""disk_usage: how full each filesystem is, sampled (statvfs, as df computes it).

KernMLOps records its disks in the system information of a collection; this
hook follows their space over the run. One row per filesystem per sample in
``disk_usage``: ``mount_point``, ``device``, ``fs_type``, ``total_bytes``,
``used_bytes`` (total - free, df's "Used"), ``free_bytes``,
``available_bytes`` (what an unprivileged user may still write, df's
"Avail"), ``inodes_total``, ``inodes_free``.

By default every mounted filesystem backed by a block device (/dev/...) is
followed, each device once; ``paths`` names the mount points (or any path on
them) to follow instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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
MOUNTS = Path("/proc/self/mounts")


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def block_mounts(text: str) -> list[tuple[str, str, str]]:
    """(mount point, device, fs type) of each block-device filesystem in /proc/mounts
    text, the first mount of each device (bind mounts repeat it)."""
    seen: set[str] = set()
    out: list[tuple[str, str, str]] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[0].startswith("/dev/"):
            continue
        device, mount, fs_type = _unescape(parts[0]), _unescape(parts[1]), parts[2]
        if device not in seen:
            seen.add(device)
            out.append((mount, device, fs_type))
    return out


def mount_of(path: str, mounts: list[tuple[str, str, str]]) -> tuple[str, str, str]:
    """The mount (point, device, type) holding ``path``: the longest mount point above
    it; a path on no block-device filesystem (tmpfs) is followed as itself."""
    real = os.path.realpath(path)
    best: tuple[str, str, str] | None = None
    for mount, device, fs_type in mounts:
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) > len(best[0])):
            best = (mount, device, fs_type)
    return best or (real, "", "")


class DiskUsageOptions(SampledHookOptions):
    poll_hz: float = Field(1, gt=0, le=1000, description="samples per second")
    paths: list[str] = Field(
        default_factory=list,
        description=(
            "mount points (or paths on them) to follow; empty: every filesystem on a block device"
        ),
    )


class DiskUsageHook(SampledHook[DiskUsageOptions]):
    """Space and inodes of each filesystem, sampled with statvfs."""

    name: ClassVar[str] = "disk_usage"
    tables: ClassVar[tuple[str, ...]] = (TABLE,)
    needs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: DiskUsageOptions | HookOptions | None = None) -> None:
        super().__init__(options)
        self.filesystems: list[tuple[str, str, str]] = []

    def start(self, ctx: HookContext | None = None) -> None:
        try:
            mounts = block_mounts(MOUNTS.read_text())
        except OSError as e:
            raise HookUnavailable(f"{self.name}: cannot read {MOUNTS}: {e.strerror}") from e
        if self.options.paths:
            missing = [p for p in self.options.paths if not os.path.exists(p)]
            if missing:
                raise HookUnavailable(f"{self.name}: no such path: {missing[0]}")
            self.filesystems = [mount_of(p, mounts) for p in self.options.paths]
        else:
            self.filesystems = mounts
        if not self.filesystems:
            raise HookUnavailable(f"{self.name}: no filesystem on a block device is mounted")
        self.status.attached = True
        self.status.variant = "statvfs"
        self.status.programs = [m for m, _, _ in self.filesystems]
        self._start_sampling()

    def _sample(self, now_ns: int) -> None:
        ts = now_ns // 1000
        for mount, device, fs_type in self.filesystems:
            try:
                st = os.statvfs(mount)
            except OSError:
                continue  # unmounted during the run: a gap in its rows
            self._rows.append(
                (ts, mount, device, fs_type, st.f_blocks * st.f_frsize,
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
