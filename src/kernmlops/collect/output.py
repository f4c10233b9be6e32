"""The output folder, checked before anything starts, and the room kept for the manifest.

Before a probe is attached or the benchmark is started, the collection's folder is
created and proven writable (a file is written, synced and removed), and the free space is
checked: below ``collector.warn_free_mb`` a warning, below ``collector.min_free_mb`` a
refusal. A small reserve file keeps room for the final manifest on a disk that fills up
during the run: it is removed just before the manifest is written for the last time.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kernmlops.collect.disk import free_bytes, human_bytes
from kernmlops.errors import OutputError
from kernmlops.errors import why_not_written as _why
from kernmlops.host.pinned import create_new

__all__ = [
    "PSEUDO_FILESYSTEMS",
    "RESERVE_NAME",
    "OutputCheck",
    "filesystem",
    "prepare_output",
    "pseudo_filesystem",
    "release_reserve",
]

RESERVE_NAME = ".manifest.reserve"
RESERVE_BYTES = 1 << 20  # a manifest with a large system section is ~50 KiB


@dataclass
class OutputCheck:
    path: Path
    free_bytes: int | None
    #: a warning for the user (low space), or None
    warning: str | None = None


def _first_file(path: Path) -> Path | None:
    """The first component of ``path`` that exists and is not a folder."""
    for parent in [*reversed(path.parents), path]:
        try:
            if parent.exists() and not parent.is_dir():
                return parent
        except OSError:  # cannot look (no permission): mkdir below says so
            return None
    return None


def prepare_output(
    path: Path, *, min_free_mb: float, warn_free_mb: float, shown: Path | None = None
) -> OutputCheck:
    """Create ``path``, prove it writable, check its free space and reserve the
    manifest's room. ``shown``: the folder as messages name it, where ``path`` is
    the folder held open (kernmlops.host.pinned; already made).

    Raises:
        OutputError: one line saying what is wrong with the folder.
    """
    name = shown or path
    blocker = _first_file(path)
    if blocker is not None:
        raise OutputError(
            f"cannot write the collection to {path}: {blocker} is a file, not a folder"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create the output folder {name}: {_why(err)}") from None
    probe = path / ".write-probe"
    try:
        fd = create_new(probe)
        try:
            os.write(fd, b"kernmlops\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as err:
        with contextlib.suppress(OSError):
            probe.unlink()
        raise OutputError(f"cannot write to the output folder {name}: {_why(err)}") from None
    free = free_bytes(path)
    check = OutputCheck(path=name, free_bytes=free)
    if free is not None and free < min_free_mb * 2**20:
        raise OutputError(
            f"only {human_bytes(free)} free on {name} (the minimum is {min_free_mb:g} MiB, "
            "collector.min_free_mb): free some space or choose another folder with -o"
        )
    if free is not None and free < warn_free_mb * 2**20:
        check.warning = (
            f"only {human_bytes(free)} free on {name}: a long collection may fill it "
            f"(collector.warn_free_mb is {warn_free_mb:g} MiB)"
        )
    reserve = path / RESERVE_NAME
    try:
        fd = create_new(reserve)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
    except OSError as err:
        with contextlib.suppress(OSError):
            reserve.unlink()
        raise OutputError(f"cannot reserve room for the manifest in {name}: {_why(err)}") from None
    return check


def release_reserve(path: Path) -> None:
    """Give the reserved room back (before the final manifest is written)."""
    with contextlib.suppress(OSError):
        (path / RESERVE_NAME).unlink()


def _unescape(field: str) -> str:
    """A mountinfo field as it is: the kernel writes space, tab, newline and
    backslash in octal (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


#: filesystems the kernel makes of its own state (no place for a file of ours): a
#: folder made there fails with a confusing reason, or they say 0 bytes free
PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore",
    "bpf", "configfs", "efivarfs", "devpts", "mqueue", "fusectl", "binfmt_misc", "nsfs",
    "autofs", "rpc_pipefs", "selinuxfs",
})  # fmt: skip


def pseudo_filesystem(path: Path) -> str | None:
    """Where ``path`` (or the folder above it that exists) is on a pseudo filesystem
    (:data:`PSEUDO_FILESYSTEMS`): its mount point and type, e.g. ``/proc (proc)``."""
    mount = _mount_of(path)
    return f"{mount[0]} ({mount[1]})" if mount and mount[1] in PSEUDO_FILESYSTEMS else None


def filesystem(path: Path) -> str:
    """The filesystem that holds ``path``, for a message: its mount point and type,
    e.g. ``/dev/shm (tmpfs)``; the path itself where /proc says nothing."""
    best = _mount_of(path)
    return f"{best[0]} ({best[1]})" if best else str(path)


def _mount_of(path: Path) -> tuple[Path, str] | None:
    """The mount point that holds ``path`` and its filesystem type (None: /proc says
    nothing)."""
    try:
        target = Path(os.path.realpath(path))
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    best: tuple[Path, str] | None = None
    for line in lines:
        # id parent major:minor root mount-point options [optional...] - type source ...
        fields = line.split()
        if "-" not in fields[:-1] or len(fields) < 5:
            continue
        mount = Path(_unescape(fields[4]))
        kind = fields[fields.index("-") + 1]
        # the last mount of the longest mount point above the path is the one in effect
        deeper = best is None or len(mount.parts) >= len(best[0].parts)
        if deeper and target.is_relative_to(mount):
            best = (mount, kind)
    return best
