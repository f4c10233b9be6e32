"""/proc/kallsyms: the kernel's functions by address.

One reader, one rule, for stack frames (cpu_profile) and labels (the exporter's
``ksym`` decoder): both resolve code addresses, so only text symbols count
(``t``/``T``, weak ``w``/``W``); a data symbol between two functions would
otherwise claim the end of the first. Where several names share an address the
first listed wins (``_stext`` before ``_text``). Zero addresses are the kernel
hiding them (kptr_restrict, not root) and are skipped.
"""

from __future__ import annotations

import bisect
import re
from pathlib import Path

KALLSYMS = Path("/proc/kallsyms")

#: address, a text type, name, and the module (tab, then ``[module]``) if any
_TEXT_LINE = re.compile(r"^([0-9a-f]+) [tTwW] (\S+)(?:\t\[(\S+)\])?$", re.M)


class KernelSymbols:
    """Text symbols sorted by address: ``addrs``, ``names``, ``modules`` (None for
    the kernel's own), side by side."""

    def __init__(self, text: str) -> None:
        first: dict[int, tuple[str, str | None]] = {}
        for hexaddr, name, module in _TEXT_LINE.findall(text):
            addr = int(hexaddr, 16)
            if addr and addr not in first:
                first[addr] = (name, module or None)
        self.addrs: list[int] = sorted(first)
        self.names: list[str] = [first[a][0] for a in self.addrs]
        self.modules: list[str | None] = [first[a][1] for a in self.addrs]

    @classmethod
    def load(cls, path: Path = KALLSYMS) -> KernelSymbols:
        return cls(path.read_text())

    def __len__(self) -> int:
        return len(self.addrs)

    def index(self, addr: int) -> int:
        """Index of the symbol that contains ``addr`` (the last at or below it), -1
        below the first."""
        return bisect.bisect_right(self.addrs, addr) - 1

    def name(self, addr: int) -> str | None:
        """The function that contains ``addr``, None where no symbol precedes it."""
        i = self.index(addr)
        return self.names[i] if addr and i >= 0 else None
