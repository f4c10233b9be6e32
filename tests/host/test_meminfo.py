"""available_bytes: the kernel's MemAvailable (psutil reads the same line), and a memory
cgroup's limit where the process is in one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from kernmlops.host.meminfo import _cgroup_room, available_bytes
from tests.conftest import skip_here

V1_MEMORY = Path("/sys/fs/cgroup/memory")


def test_available_is_the_kernels_memavailable_or_a_cgroups_room() -> None:
    got, room = available_bytes(), _cgroup_room()
    kernel = psutil.virtual_memory().available  # /proc/meminfo's MemAvailable too
    assert got is not None
    if room is None:
        assert got == pytest.approx(kernel, rel=0.05)
    else:  # this run is itself in a limited cgroup
        assert got <= min(kernel * 1.05, room + (64 << 20))


def test_a_memory_cgroups_limit_lowers_what_is_available(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_here("makes a cgroup: needs root")
    code = "from kernmlops.host.meminfo import available_bytes as a; print(a())"
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.subtree_control").exists() and "memory" in (
        v2 / "cgroup.subtree_control"
    ).read_text():
        parent, limit_file = v2, "memory.max"
    elif (V1_MEMORY / "memory.limit_in_bytes").exists():
        parent, limit_file = V1_MEMORY, "memory.limit_in_bytes"
    else:
        skip_here("no memory cgroup controller to limit a process with")
    group = parent / f"kmo-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / limit_file).write_text(str(512 << 20))
        # the child joins the group before Python starts: all its memory is counted
        argv = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$0" -c "$1"',
                sys.executable, code]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        got = int(done.stdout.strip())
        # the limit less what the interpreter and its imports already took
        assert (512 << 20) - (256 << 20) < got < 512 << 20, got
    finally:
        for _ in range(50):  # the child's exit reaches the cgroup a moment later
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
