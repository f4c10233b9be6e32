"""SpareCpu: the CPU left idle, what the spool's pacing asks for (kernmlops.spool.pacing)."""

from __future__ import annotations

import os

from kernmlops.host.cpus import SpareCpu, default_spare_need, online_cpus
from tests.conftest import skip_here


def test_spare_cpu_asks_for_what_was_unused() -> None:
    import time

    free = SpareCpu(window_s=0.02, need=0.0)
    busy = SpareCpu(window_s=0.02, need=float(os.cpu_count() or 1) + 1)
    time.sleep(0.1)  # a window of /proc/stat ticks
    assert free.ask()
    assert not busy.ask()  # more CPU than the machine has is never spare


def test_our_own_cpu_is_not_spare() -> None:
    # All but half a CPU idle is asked for while this process keeps one CPU busy:
    # never spare (counting our own use as spare made a busy collector keep going).
    import time

    almost_all = SpareCpu(window_s=0.3, need=(os.cpu_count() or 1) - 0.5)
    end = time.monotonic() + 0.4
    while time.monotonic() < end:
        pass
    assert not almost_all.ask()


def test_spare_cpu_counts_only_the_cpus_the_collector_may_use() -> None:
    # Pinned to one CPU that this process keeps busy, the machine's other idle CPUs
    # are not spare (taskset -c 0,1 on a 16-CPU machine: 14 idle CPUs once let the
    # collector make rows on the two the storm had).
    import time

    if len(online_cpus()) < 2:
        skip_here("one CPU: nothing else to be idle")
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        pinned = SpareCpu(window_s=0.3, need=0.5)
        machine = SpareCpu(window_s=0.3, need=0.5, cpus=set(online_cpus()))
        assert pinned._cpus == {f"cpu{cpu}".encode()} and machine._cpus is None
        end = time.monotonic() + 0.4
        while time.monotonic() < end:
            pass
        assert not pinned.ask()  # what the other CPUs had idle does not count
    finally:
        os.sched_setaffinity(0, before)


def test_spare_cpu_by_default_is_a_quarter_of_the_cpus_the_collector_may_use() -> None:
    # Half a CPU up to 2 CPUs (the development VM: as before); 4 idle CPUs of 16, where
    # a switch storm's wake-ups leave up to 2 idle for moments.
    assert default_spare_need(1) == default_spare_need(2) == 0.5
    assert default_spare_need(16) == 4.0 and default_spare_need(192) == 48.0
    assert SpareCpu(cpus=set(range(16))).need == 4.0
    assert SpareCpu(cpus={0, 1}).need == 0.5
    assert SpareCpu().need == max(0.5, len(os.sched_getaffinity(0)) / 4)
    assert SpareCpu(need=0.0, cpus=set(range(16))).need == 0.0  # a setting wins
