"""The kernel's own count of the requests each disk completed (/proc/diskstats), and
which disks those requests go through the block layer's request queue for.

Documentation/admin-guide/iostats.rst: a line is ``major minor name`` and then the
counters; fields 4, 8, 15 and 19 (1-based) are the reads, writes, discards and
flushes completed. Kernels before 4.18 have no discard fields and before 5.5 no
flush fields (a line of 14 or 18 fields): what a line lacks counts 0. A partition's
line counts the partition's share of its disk's I/O, which the disk's own line holds
too (a request names its disk, not the partition).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC_DISKSTATS = Path("/proc/diskstats")
SYS_BLOCK = Path("/sys/block")

#: 0-based fields of a line that count completed requests: reads, writes, discards
#: (4.18+), flushes (5.5+)
COMPLETED_FIELDS = (3, 7, 14, 18)
#: fields of a line since 2.6.25 (major, minor, name and 11 counters); shorter lines
#: are 2.6's partitions, whose four counters mean other things
MIN_FIELDS = 14

#: (major, minor)
Device = tuple[int, int]


@dataclass(frozen=True)
class DiskLine:
    """One device's line of /proc/diskstats, as far as completions go."""

    name: str
    #: requests completed since the device appeared: reads + writes + discards + flushes
    completed: int


def parse_diskstats(text: str) -> dict[Device, DiskLine]:
    """(major, minor) -> its line, for every line of /proc/diskstats' ``text`` that
    has the counters (a malformed line is left out: it counts nothing we can use)."""
    out: dict[Device, DiskLine] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < MIN_FIELDS:
            continue
        try:
            device = int(f[0]), int(f[1])
            completed = sum(int(f[i]) for i in COMPLETED_FIELDS if i < len(f))
        except ValueError:
            continue
        out[device] = DiskLine(f[2], completed)
    return out


def read_diskstats(path: Path = PROC_DISKSTATS) -> dict[Device, DiskLine]:
    """This moment's /proc/diskstats (one read).

    Raises:
        OSError: it cannot be read (no /proc, a container hiding it).
    """
    return parse_diskstats(path.read_text())


def request_disks(sys_block: Path = SYS_BLOCK) -> set[Device]:
    """The whole disks whose I/O goes through requests (blk-mq: the disk has an
    ``mq`` folder), the only ones the block_rq_* tracepoints fire for. /sys/block
    lists no partitions; bio-based devices (zram, device mapper, md) count their I/O
    in /proc/diskstats without ever making a request."""
    out: set[Device] = set()
    try:
        names = os.listdir(sys_block)
    except OSError:
        return out
    for name in names:
        disk = sys_block / name
        try:
            if not (disk / "mq").is_dir():
                continue
            major, minor = (disk / "dev").read_text().split(":")
            out.add((int(major), int(minor)))
        except (OSError, ValueError):
            continue  # removed while we looked
    return out
