"""When rows are made from the spool during a run: while the machine has CPU to spare
and the sink keeps up. Under a storm that keeps every CPU busy the collector only
copies rings (a few percent of a core) and makes the rows later, the way ``perf
record`` writes first and ``perf report`` decodes later; on a machine with idle CPU
the spool is read back within a poll."""

from __future__ import annotations

from collections.abc import Callable

from kernmlops.host.cpus import SpareCpu


class Pacer:
    """When a spooling hook may make rows during the run: the machine has CPU to spare
    and the sink is not behind (a write would wait for its writer, and the rings
    would not be copied meanwhile)."""

    def __init__(self, spare: SpareCpu, behind: Callable[[], bool]) -> None:
        self.spare = spare
        self.behind = behind

    def ask(self) -> bool:
        """Whether rows may be made now."""
        return not self.behind() and self.spare.ask()
