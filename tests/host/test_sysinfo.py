"""system_info() against independent sources: lscpu, psutil, libc, the os module."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from kernmlops.host import sysinfo
from kernmlops.host.cpus import format_cpu_list, online_cpu_count, parse_cpu_list
from kernmlops.host.sysinfo import column_types, system_info, system_info_frame


@pytest.fixture(scope="module")
def info() -> dict[str, Any]:
    return system_info()


def _lscpu(*args: str) -> Any:
    assert shutil.which("lscpu"), "lscpu (util-linux, always on Debian/Ubuntu) is missing"
    out = subprocess.run(["lscpu", "-J", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def lscpu() -> dict[str, str]:
    rows = _lscpu("-B")["lscpu"]
    return {row["field"].rstrip(":"): row["data"] for row in rows}


def test_every_schema_field_present(info: dict[str, Any]) -> None:
    assert list(info) == list(column_types())


def test_identity_matches_os(info: dict[str, Any]) -> None:
    uname = os.uname()
    assert info["hostname"] == socket.gethostname()
    assert info["kernel_release"] == uname.release == platform.release()
    assert info["kernel_version"] == uname.version
    assert info["arch"] == uname.machine


def test_os_name_matches_os_release(info: dict[str, Any]) -> None:
    try:
        expected = platform.freedesktop_os_release().get("PRETTY_NAME")
    except OSError:
        expected = None
    assert info["os_name"] == expected


def test_cpu_counts_match_os_and_lscpu(info: dict[str, Any], lscpu: dict[str, str]) -> None:
    assert info["logical_cpus"] == os.cpu_count() == int(lscpu["CPU(s)"])
    assert info["online_cpus"] == parse_cpu_list(lscpu["On-line CPU(s) list"])
    assert len(info["online_cpus"]) == online_cpu_count()
    sockets = int(lscpu["Socket(s)"])
    assert info["sockets"] == sockets
    assert info["cores"] == int(lscpu["Core(s) per socket"]) * sockets
    assert info["cores"] == psutil.cpu_count(logical=False)
    assert info["threads_per_core"] == int(lscpu["Thread(s) per core"])
    assert info["cores"] * info["threads_per_core"] == len(info["online_cpus"])


def test_cpu_model_and_vendor_match_lscpu(info: dict[str, Any], lscpu: dict[str, str]) -> None:
    if "Model name" in lscpu:
        assert info["cpu_model"] == lscpu["Model name"]
    if "Vendor ID" in lscpu and platform.machine() in ("x86_64", "i686"):
        assert info["cpu_vendor"] == lscpu["Vendor ID"]


def test_numa_nodes_match_lscpu(info: dict[str, Any], lscpu: dict[str, str]) -> None:
    if "NUMA node(s)" in lscpu:
        assert info["numa_nodes"] == int(lscpu["NUMA node(s)"])
    else:  # lscpu leaves the line out on some machines: count the kernel's nodes
        nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
        assert info["numa_nodes"] == max(1, len(nodes))


def test_caches_match_lscpu(info: dict[str, Any]) -> None:
    caches = _lscpu("-C", "-B").get("caches", [])
    seen = {c["name"].lower(): int(c["one-size"]) for c in caches}
    for name in ("l1d", "l1i", "l2", "l3"):
        assert info[f"{name}_cache_bytes"] == seen.get(name), name


def test_memory_matches_psutil(info: dict[str, Any]) -> None:
    assert info["memory_bytes"] == psutil.virtual_memory().total
    assert info["swap_bytes"] == psutil.swap_memory().total


def test_boot_time_matches_psutil_and_boottime_clock(info: dict[str, Any]) -> None:
    assert abs(info["boot_time_unix"] - psutil.boot_time()) <= 2
    # Independent of /proc/stat: now minus the time since boot.
    # The two clocks read together, a third read bounding the moment between them
    # (a starved test may lose its CPU there for seconds).
    before = time.time()
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    after = time.time()
    assert before - since_boot - 2 <= info["boot_time_unix"] <= after - since_boot + 2
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", info["boot_time"])


def test_libc_values(info: dict[str, Any]) -> None:
    import mmap
    import resource

    assert info["page_size_bytes"] == mmap.PAGESIZE == resource.getpagesize()
    if shutil.which("getconf"):
        ticks = subprocess.run(["getconf", "CLK_TCK"], capture_output=True, text=True, check=True)
        assert info["clock_ticks"] == int(ticks.stdout)


def test_thp_words(info: dict[str, Any]) -> None:
    thp = Path("/sys/kernel/mm/transparent_hugepage")
    if not thp.exists():
        assert info["thp_enabled"] is None
        return
    # The selected word is the one the kernel brackets.
    assert f"[{info['thp_enabled']}]" in thp.joinpath("enabled").read_text().split()
    assert f"[{info['thp_defrag']}]" in thp.joinpath("defrag").read_text().split()


def test_hugepages(info: dict[str, Any]) -> None:
    size = Path("/sys/kernel/mm/hugepages")
    if size.exists():
        # Default huge page size is one of the sizes the kernel offers.
        offered = {int(p.name.split("-")[1].removesuffix("kB")) * 1024 for p in size.iterdir()}
        assert info["hugepage_size_bytes"] in offered
    assert isinstance(info["hugepages_total"], int)


def test_vm_detection_matches_lscpu(info: dict[str, Any], lscpu: dict[str, str]) -> None:
    flags = lscpu.get("Flags", "").split()
    if "hypervisor" in flags or "Hypervisor vendor" in lscpu:
        assert info["is_vm"] is True
    if "Hypervisor vendor" in lscpu and info["hypervisor"] is not None:
        assert info["hypervisor"] == lscpu["Hypervisor vendor"]


def test_frame_is_one_row_with_lists_as_strings(info: dict[str, Any]) -> None:
    frame = system_info_frame(info)
    assert frame.height == 1
    assert frame.columns == list(info)
    row = frame.row(0, named=True)
    assert row["online_cpus"] == format_cpu_list(info["online_cpus"])
    assert row["memory_bytes"] == info["memory_bytes"]
    assert frame.schema["is_vm"].is_(column_types()["is_vm"])


def test_frame_keeps_none_with_types() -> None:
    info = dict.fromkeys(column_types())
    frame = system_info_frame(info)
    assert frame.height == 1
    assert all(frame.schema[k] == v for k, v in column_types().items())


def test_missing_files_give_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PROC", "SYS_CPU", "SYS_NODE", "SYS_THP", "SYS_DMI", "SYS_HYPERVISOR"):
        monkeypatch.setattr(sysinfo, name, tmp_path / name.lower())
    monkeypatch.setattr(sysinfo, "CLOCKSOURCE", tmp_path / "clocksource")
    monkeypatch.setattr(sysinfo, "OS_RELEASE", (tmp_path / "os-release",))
    info = system_info()
    assert list(info) == list(column_types())
    for key in ("cpu_model", "sockets", "cores", "l1d_cache_bytes", "thp_enabled", "boot_time"):
        assert info[key] is None, key
    assert info["os_name"] is None
    assert info["hostname"] == os.uname().nodename  # falls back to uname
    assert info["online_cpus"] is None
    assert system_info_frame(info).height == 1


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", [0]), ("0-3", [0, 1, 2, 3]), ("0-1,4,6-7", [0, 1, 4, 6, 7]), ("", [])],
)
def test_cpu_list_round_trip(text: str, cpus: list[int]) -> None:
    assert parse_cpu_list(text) == cpus
    assert format_cpu_list(cpus) == text


def test_bad_cpu_list_is_none() -> None:
    assert parse_cpu_list("x-y") is None
    assert parse_cpu_list(None) is None
