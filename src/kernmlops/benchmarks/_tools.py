"""Small helpers the benchmarks share: tool checks, sizes, filesystems, ports,
and stopping a helper process whole. Not a benchmark (discovery skips ``_`` modules)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from kernmlops.errors import BenchmarkError

#: Filesystems kept in memory: direct I/O there measures RAM, not a disk.
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})
MOUNTINFO = Path("/proc/self/mountinfo")
SWAPS = Path("/proc/swaps")
SYS_DEV_BLOCK = Path("/sys/dev/block")
_SIZE = re.compile(r"\s*(\d+)\s*([kmgtp]?)(i?b?)\s*", re.IGNORECASE)


def require_tool(benchmark: str, program: str, install: str) -> str:
    """The path of ``program``; BenchmarkError saying how to install it if absent."""
    path = shutil.which(program)
    if path is None:
        raise BenchmarkError(
            f"{benchmark}: the {program} program is not installed; install it: {install}"
        )
    return path


def parse_size(value: int | str) -> int:
    """Bytes from ``4096``, ``"4k"``, ``"64M"``, ``"1GiB"`` (powers of 1024, as fio reads them)."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative (got {value})")
        return value
    m = _SIZE.fullmatch(value)
    if not m:
        raise ValueError(f"expected a size like 4096, 4k, 64M or 1G (got {value!r})")
    power = " kmgtp".index(m.group(2).lower() or " ")
    return int(m.group(1)) << (10 * power)


def _unescape_mount(path: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def mounts(mountinfo: Path | None = None) -> list[tuple[str, str, int, str]]:
    """(mount point, filesystem type, device number, source) of each mount."""
    out: list[tuple[str, str, int, str]] = []
    try:
        text = (mountinfo or MOUNTINFO).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields or len(fields) < 5:
            continue
        sep = fields.index("-")
        major, _, minor = fields[2].partition(":")
        try:
            dev = os.makedev(int(major), int(minor))
        except ValueError:
            continue
        source = _unescape_mount(fields[sep + 2]) if len(fields) > sep + 2 else ""
        out.append((_unescape_mount(fields[4]), fields[sep + 1], dev, source))
    return out


def filesystem_type(path: str | Path, mountinfo: Path | None = None) -> str | None:
    """Type of the filesystem holding ``path`` (the longest mount point above it)."""
    real = os.path.realpath(path)
    best, kind = "", None
    for point, fstype, _, _ in mounts(mountinfo):
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def device_in_use(
    path: str | Path, rdev: int, mountinfo: Path | None = None, sys_block: Path | None = None
) -> str | None:
    """Why the block device ``path`` (number ``rdev``) must not be written, or
    None: it or one of its partitions is mounted, used as swap, or held by
    another device (LVM, RAID, dm-crypt)."""
    sys_block = sys_block or SYS_DEV_BLOCK
    node = sys_block / f"{os.major(rdev)}:{os.minor(rdev)}"
    devs = {rdev}
    for part in node.glob("*/dev"):  # partitions of a whole disk
        major, _, minor = part.read_text().strip().partition(":")
        with contextlib.suppress(ValueError):
            devs.add(os.makedev(int(major), int(minor)))
    real = os.path.realpath(path)
    for point, _, dev, source in mounts(mountinfo):
        if dev in devs or (source.startswith("/") and os.path.realpath(source) == real):
            return f"mounted on {point}"
    with contextlib.suppress(OSError):
        for line in SWAPS.read_text().splitlines()[1:]:
            name = line.split()[0] if line.split() else ""
            if name and os.path.realpath(name) == real:
                return "used as swap"
    holders = [h.name for h in (node / "holders").glob("*")]
    if holders:
        return f"held by {', '.join(sorted(holders))}"
    return None


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stop_process_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the group led by ``proc`` (started with start_new_session), then
    SIGKILL what is left after ``grace_s``; reaps ``proc``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is not None:
            break
    # Children it may have left in its group go too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
