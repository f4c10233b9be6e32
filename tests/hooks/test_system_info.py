"""SystemInfoHook yields the machine's one row once."""

from __future__ import annotations

import os

from kernmlops.hooks.base import HookContext
from kernmlops.hooks.system_info import SystemInfoHook
from kernmlops.host.sysinfo import column_types
from tests.rows import polled


def test_yields_one_row_once() -> None:
    hook = SystemInfoHook()
    assert hook.name == "system_info"
    assert hook.tables == ("system_info",)
    assert list(polled(hook.poll())) == []  # nothing before start
    hook.start(HookContext(collection_id="c1", process_filter=None, self_tgid=os.getpid()))
    assert hook.status.attached
    out = list(polled(hook.poll()))
    assert len(out) == 1
    table, frame = out[0]
    assert table == "system_info"
    assert frame.height == 1
    assert frame.columns == list(column_types())
    assert frame["logical_cpus"][0] == os.cpu_count()
    assert frame["kernel_release"][0] == os.uname().release
    assert list(polled(hook.poll())) == []
    assert list(polled(hook.stop())) == []
    assert list(polled(hook.stop())) == []  # safe twice
