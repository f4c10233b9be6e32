"""The machine's facts as a one-row table, so each collection carries them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import polars as pl

from kernmlops.collect.sysinfo import system_info, system_info_frame
from kernmlops.hooks.base import Hook, HookContext, HookOptions

TABLE = "system_info"


class SystemInfoHook(Hook):
    """Reads system info once at start and yields it as one row on the next poll."""

    name: ClassVar[str] = "system_info"
    tables: ClassVar[tuple[str, ...]] = (TABLE,)

    def __init__(self, options: HookOptions | None = None) -> None:
        super().__init__(options if options is not None else self.Options())
        self._pending: pl.DataFrame | None = None

    def start(self, ctx: HookContext | None = None) -> None:
        # Read at start, not at the end: the facts describe the machine as the
        # collection began (THP mode, online CPUs, ... can change during it).
        self._pending = system_info_frame(system_info())
        self.status.attached = True
        self.status.variant = "procfs"

    def poll(self) -> Iterator[tuple[str, pl.DataFrame]]:
        if self._pending is not None:
            frame, self._pending = self._pending, None
            self.status.events += 1
            yield TABLE, frame
