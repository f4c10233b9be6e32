"""The Pacer: rows are made from the spool only while CPU is spare and the sink keeps up."""

from __future__ import annotations

from kernmlops.spool.pacing import Pacer


class _Spare:
    def __init__(self, spare: bool) -> None:
        self.spare = spare
        self.asked = 0

    def ask(self) -> bool:
        self.asked += 1
        return self.spare


def test_rows_are_made_only_with_spare_cpu_and_a_sink_that_keeps_up() -> None:
    for spare, behind, want in ((True, False, True), (False, False, False), (True, True, False)):
        assert Pacer(_Spare(spare), lambda b=behind: b).ask() is want
    # a sink behind answers first: the CPU's window is not spent on a no
    cpu = _Spare(True)
    Pacer(cpu, lambda: True).ask()
    assert cpu.asked == 0
