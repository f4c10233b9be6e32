"""CpuHotplugWatch against the kernel: a CPU taken offline and brought back is
in the watch's next look, though /sys's online list shows nothing changed."""

from __future__ import annotations

import pytest

from kernmlops.host.cpus import CpuHotplugWatch, online_cpus
from tests.conftest import HOTPLUG_CPU, cpu_offline

pytestmark = pytest.mark.bpf  # root: CPU hot-plug


def test_a_cpu_gone_and_back_between_two_looks_is_seen() -> None:
    watch = CpuHotplugWatch()
    try:
        if not watch.available:
            pytest.fail("no uevent socket on this machine (a network namespace of its own?)")
        assert watch.take() == (set(), set(), False)
        before = online_cpus()
        with cpu_offline():
            pass
        assert online_cpus() == before  # the online list cannot tell
        assert watch.take() == ({HOTPLUG_CPU}, {HOTPLUG_CPU}, False)
        assert watch.take() == (set(), set(), False)  # each event once
    finally:
        watch.close()
    assert not watch.available and watch.take() == (set(), set(), False)
