"""The benchmarks' shared helpers: sizes, mounts, device use, ports, stopping a group."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kernmlops.benchmarks import _tools
from kernmlops.benchmarks._tools import (
    device_in_use,
    filesystem_type,
    free_tcp_port,
    mounts,
    parse_size,
    require_tool,
    stop_process_group,
)
from kernmlops.errors import BenchmarkError

#: a stop within 3 s
pytestmark = pytest.mark.quiet

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 27 0:26 / /dev/shm rw - tmpfs tmpfs rw
31 27 0:27 / /mnt/my\\040disk rw - ext4 /dev/sdb1 rw
32 27 0:28 / /mnt/img rw - ext4 /dev/loop3 rw
"""


@pytest.fixture
def mountinfo(tmp_path: Path) -> Path:
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (4096, 4096),
        ("4096", 4096),
        ("4k", 4096),
        ("4K", 4096),
        ("64M", 64 << 20),
        ("64MiB", 64 << 20),
        ("1g", 1 << 30),
        (" 2 kb ", 2048),
        ("0", 0),
    ],
)
def test_parse_size(text: int | str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "4x", "1.5M", "-1", "M", -5])
def test_parse_size_rejects(bad: int | str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


def test_mounts_and_filesystem_type(mountinfo: Path) -> None:
    found = mounts(mountinfo)
    assert ("/mnt/my disk", "ext4", os.makedev(0, 27), "/dev/sdb1") in found
    assert filesystem_type("/dev/shm/x", mountinfo) == "tmpfs"
    assert filesystem_type("/dev/shm", mountinfo) == "tmpfs"
    assert filesystem_type("/dev/shmem", mountinfo) == "ext4"  # a prefix is not a parent
    assert filesystem_type("/mnt/my disk/f", mountinfo) == "ext4"
    assert filesystem_type("/proc/1", mountinfo) == "proc"


def test_filesystem_type_of_this_machine() -> None:
    assert filesystem_type("/proc/self") == "proc"


def _fake_block(root: Path, major: int, minor: int, parts: dict[str, str], holders=()) -> Path:
    node = root / f"{major}:{minor}"
    node.mkdir(parents=True)
    for name, dev in parts.items():
        (node / name).mkdir()
        (node / name / "dev").write_text(dev + "\n")
    (node / "holders").mkdir()
    for h in holders:
        (node / "holders" / h).mkdir()
    return node


def test_device_in_use(tmp_path: Path, mountinfo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sysblk = tmp_path / "block"
    monkeypatch.setattr(_tools, "SWAPS", tmp_path / "swaps")
    (tmp_path / "swaps").write_text("Filename Type Size Used Priority\n/dev/sdd partition 1 0 -2\n")
    # mounted itself (device number of the mount)
    _fake_block(sysblk, 254, 0, {})
    assert device_in_use("/dev/vda", os.makedev(254, 0), mountinfo, sysblk) == "mounted on /"
    # a whole disk whose partition is mounted (by number)
    _fake_block(sysblk, 8, 0, {"sda1": "0:26"})
    assert device_in_use("/dev/sda", os.makedev(8, 0), mountinfo, sysblk) == "mounted on /dev/shm"
    # mounted, found by the mount's source path
    _fake_block(sysblk, 7, 3, {})
    assert device_in_use("/dev/loop3", os.makedev(7, 3), mountinfo, sysblk) == "mounted on /mnt/img"
    # swap, and held by a device mapper
    _fake_block(sysblk, 8, 48, {})
    assert device_in_use("/dev/sdd", os.makedev(8, 48), mountinfo, sysblk) == "used as swap"
    _fake_block(sysblk, 8, 32, {}, holders=["dm-0"])
    assert device_in_use("/dev/sdc", os.makedev(8, 32), mountinfo, sysblk) == "held by dm-0"
    # free
    _fake_block(sysblk, 7, 5, {})
    assert device_in_use("/dev/loop5", os.makedev(7, 5), mountinfo, sysblk) is None


def test_require_tool() -> None:
    assert require_tool("x", "sh", "apt-get install dash") == shutil.which("sh")
    with pytest.raises(
        BenchmarkError, match=r"^demo: the no-such-tool-kml program is not installed; install it: "
    ):
        require_tool("demo", "no-such-tool-kml", "apt-get install kml")


def test_free_tcp_port_is_bindable() -> None:
    port = free_tcp_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_stop_process_group_ends_leader_and_children() -> None:
    # A leader that ignores SIGTERM, with a child: both must be gone.
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    t0 = time.monotonic()
    stop_process_group(proc, grace_s=0.3)
    assert time.monotonic() - t0 < 3
    assert proc.returncode == -9  # SIGTERM ignored, SIGKILL did it
    deadline = time.monotonic() + 2
    while psutil.pid_exists(child) and time.monotonic() < deadline:
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
