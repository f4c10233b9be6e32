"""CPU lists in the kernel's notation ("0-3,8"), and the CPUs online now."""

from __future__ import annotations

import os
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def parse_cpu_list(text: str | None) -> list[int] | None:
    """Kernel CPU list ("0-3,8,10-11") → [0, 1, 2, 3, 8, 10, 11]; None if unreadable
    (also a descending range: "3-1")."""
    if text is None:
        return None
    cpus: list[int] = []
    try:
        for part in text.strip().split(","):
            if not part:
                continue
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
            if first < 0 or last < first:
                return None
            cpus.extend(range(first, last + 1))
    except ValueError:
        return None
    return cpus


def format_cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] → "0-3,8", the kernel's own notation."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def online_cpu_count() -> int:
    """CPUs online now (what a workload can be spread over)."""
    online = parse_cpu_list(_read(SYS_CPU / "online"))
    if online:
        return len(online)
    return os.cpu_count() or 1


def read_cpu_list(path: Path) -> list[int]:
    """The CPU list in a sysfs file (``cpulist``, ``online``); [] if unreadable."""
    return parse_cpu_list(_read(path)) or []


def online_cpus() -> list[int]:
    """CPU numbers online now; every CPU Python counts if sysfs cannot say."""
    return read_cpu_list(SYS_CPU / "online") or list(range(os.cpu_count() or 1))
