"""The machine's facts as a one-row table, so each collection carries them."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from kernmlops.hooks.base import Hook, HookContext, HookOptions
from kernmlops.host.sysinfo import system_info, system_info_table

if TYPE_CHECKING:
    from kernmlops.tables import Rows


TABLE = "system_info"


class SystemInfoHook(Hook[HookOptions]):
    """Reads system info once at start and yields it as one row on the next poll."""

    name: ClassVar[str] = "system_info"
    tables: ClassVar[tuple[str, ...]] = (TABLE,)

    def __init__(self, options: HookOptions | None = None) -> None:
        super().__init__(options)
        self._pending: dict[str, Any] | None = None

    def start(self, ctx: HookContext | None = None) -> None:
        # Read at start, not at the end: the facts describe the machine as the
        # collection began (THP mode, online CPUs, ... can change during it).
        self._pending = system_info()  # the table (pyarrow) is built after attach
        self.status.attached = True
        self.status.variant = "procfs"

    def next_poll(self, now: float) -> float | None:
        return now if self._pending is not None else math.inf

    def poll(self) -> Iterator[tuple[str, Rows]]:
        if self._pending is not None:
            info, self._pending = self._pending, None
            self.status.events += 1
            yield TABLE, system_info_table(info)
