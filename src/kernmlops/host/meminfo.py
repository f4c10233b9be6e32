"""/proc/meminfo as {column: value}: snake_case names, kB fields in bytes."""

from __future__ import annotations

import functools
import re
from pathlib import Path

_PAREN = re.compile(r"\((\w+)\)")  # Active(anon) → Active_anon
_LOWER_UPPER = re.compile(r"(?<=[a-z])(?=[A-Z])")  # MemTotal → Mem_Total
_ACRONYM_WORD = re.compile(r"(?<=[A-Z])(?=[A-Z][a-z])")  # KReclaimable → K_Reclaimable
_LETTER_DIGIT = re.compile(r"(?<=[A-Za-z])(?=\d)")  # DirectMap4k → DirectMap_4k


@functools.cache  # the same ~50 keys every sample
def meminfo_column(key: str, unit: str | None) -> str:
    """Column name for one /proc/meminfo key: snake_case, ``_bytes`` when in kB."""
    if key.startswith("HugePages_"):
        # The kernel's own spelling is "hugepages" (sysfs, sysctl), not "huge_pages".
        name = "hugepages_" + key.removeprefix("HugePages_")
    elif key == "Hugepagesize":
        name = "hugepage_size"
    else:
        name = _PAREN.sub(r"_\1", key)
        name = _LOWER_UPPER.sub("_", name)
        name = _ACRONYM_WORD.sub("_", name)
        name = _LETTER_DIGIT.sub("_", name)
    name = re.sub(r"_+", "_", name.lower()).strip("_")
    return f"{name}_bytes" if unit == "kB" else name


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo text → {column: value}; kB fields become bytes, counts stay counts."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        unit = parts[1] if len(parts) > 1 else None
        out[meminfo_column(key.strip(), unit)] = value * 1024 if unit == "kB" else value
    return out


def available_bytes() -> int | None:
    """Memory this process could still take: the kernel's MemAvailable, or less where
    its memory cgroup has a limit (a container, a systemd unit; v2 or v1). None where
    unknown."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            available = parse_meminfo(f.read()).get("mem_available_bytes")
    except OSError:
        available = None
    room = _cgroup_room()
    if room is not None:
        available = room if available is None else min(available, room)
    return available


def _cgroup_room() -> int | None:
    """Limit minus use of this process's memory cgroup, where it has a limit."""
    from kernmlops.host.cgroup import cgroup2_mount, own_cgroup

    candidates = []
    mount, group = cgroup2_mount(), own_cgroup()
    if mount is not None and group is not None:
        candidates.append((mount / group.lstrip("/"), "memory.max", "memory.current"))
    v1 = own_cgroup("memory")  # a hybrid or v1 host's memory hierarchy
    if v1 is not None:
        folder = Path("/sys/fs/cgroup/memory") / v1.lstrip("/")
        candidates.append((folder, "memory.limit_in_bytes", "memory.usage_in_bytes"))
    rooms = []
    for folder, limit_name, use_name in candidates:
        try:
            limit = (folder / limit_name).read_text().strip()
            if limit == "max" or int(limit) >= 1 << 60:  # none (v1 says so with ~2^63)
                continue
            rooms.append(max(0, int(limit) - int((folder / use_name).read_text())))
        except (OSError, ValueError):
            continue
    return min(rooms) if rooms else None
