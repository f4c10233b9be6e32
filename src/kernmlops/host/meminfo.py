"""/proc/meminfo as {column: value}: snake_case names, kB fields in bytes."""

from __future__ import annotations

import functools
import re

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
