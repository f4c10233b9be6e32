"""Facts about the machine a collection ran on, read from /proc, /sys and libc.

Every value is read from the running system; a value that cannot be read is
None rather than a guess, so a manifest never claims something it did not see.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmlops.host.cpus import format_cpu_list, parse_cpu_list
from kernmlops.host.meminfo import parse_meminfo
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa
else:
    pl = lazy_import("polars")
    pa = lazy_import("pyarrow")


PROC = Path("/proc")
SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")
SYS_THP = Path("/sys/kernel/mm/transparent_hugepage")
SYS_DMI = Path("/sys/class/dmi/id")
SYS_HYPERVISOR = Path("/sys/hypervisor")
CLOCKSOURCE = Path("/sys/devices/system/clocksource/clocksource0/available_clocksource")
OS_RELEASE = (Path("/etc/os-release"), Path("/usr/lib/os-release"))


#: The one-row ``system_info`` table's columns and their kinds (lists are stored as text).
COLUMNS: dict[str, str] = {
    "hostname": "text",
    "kernel_release": "text",
    "kernel_version": "text",
    "os_name": "text",
    "arch": "text",
    "cpu_model": "text",
    "cpu_vendor": "text",
    "sockets": "int",
    "cores": "int",
    "threads_per_core": "int",
    "logical_cpus": "int",
    "online_cpus": "text",
    "numa_nodes": "int",
    "l1d_cache_bytes": "int",
    "l1i_cache_bytes": "int",
    "l2_cache_bytes": "int",
    "l3_cache_bytes": "int",
    "memory_bytes": "int",
    "swap_bytes": "int",
    "thp_enabled": "text",
    "thp_defrag": "text",
    "hugepages_total": "int",
    "hugepage_size_bytes": "int",
    "is_vm": "bool",
    "hypervisor": "text",
    "boot_time_unix": "int",
    "boot_time": "text",
    "clock_ticks": "int",
    "page_size_bytes": "int",
}


@cache
def column_types() -> dict[str, pl.DataType]:
    """Column types of the one-row ``system_info`` table, as polars reads them."""
    kinds = {"text": pl.String(), "int": pl.Int64(), "bool": pl.Boolean()}
    return {name: kinds[kind] for name, kind in COLUMNS.items()}


# Substrings of DMI vendor/product strings → hypervisor name (as lscpu names them).
_DMI_HYPERVISORS = (
    ("kvm", "KVM"),
    ("qemu", "QEMU"),
    ("vmware", "VMware"),
    ("virtualbox", "VirtualBox"),
    ("innotek", "VirtualBox"),
    ("xen", "Xen"),
    ("bochs", "Bochs"),
    ("parallels", "Parallels"),
    ("bhyve", "bhyve"),
    ("amazon ec2", "KVM"),  # Nitro
    ("google compute engine", "KVM"),
    ("openstack", "KVM"),
    ("firecracker", "Firecracker"),
)
# Paravirtual clock sources exist only inside a guest of that hypervisor.
_CLOCKSOURCE_HYPERVISORS = (
    ("kvm-clock", "KVM"),
    ("xen", "Xen"),
    ("hyperv_clocksource", "Microsoft"),
)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _size_bytes(text: str | None) -> int | None:
    """Sysfs cache size ("48K", "2048K", "32M") → bytes."""
    if not text:
        return None
    m = re.fullmatch(r"(\d+)\s*([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if not m:
        return None
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
    return int(m.group(1)) * scale


def _cpuinfo_first_block() -> dict[str, str]:
    text = _read(PROC / "cpuinfo") or ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _meminfo() -> dict[str, int]:
    return parse_meminfo(_read(PROC / "meminfo") or "")


def _os_name() -> str | None:
    for path in OS_RELEASE:
        text = _read(path)
        if text is None:
            continue
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "PRETTY_NAME":
                return value.strip().strip("\"'")
    return None


def _topology() -> dict[str, int | None]:
    """Sockets, physical cores and threads per core from per-CPU topology files."""
    packages: set[str] = set()
    cores: set[tuple[str, str]] = set()
    threads = 0
    cpu_dirs = [p for p in SYS_CPU.glob("cpu[0-9]*") if p.name[3:].isdigit()]
    for cpu in cpu_dirs:
        topo = cpu / "topology"
        pkg = _read(topo / "physical_package_id")
        siblings = _read(topo / "thread_siblings_list") or _read(topo / "core_cpus_list")
        if pkg is None or siblings is None:
            continue  # offline CPUs have no topology
        packages.add(pkg)
        # The set of sibling threads names a core uniquely, unlike core_id
        # which repeats across packages (and dies).
        cores.add((pkg, siblings))
        threads = max(threads, len(parse_cpu_list(siblings) or [0]))
    if cores:
        return {"sockets": len(packages), "cores": len(cores), "threads_per_core": threads}
    # Fall back to /proc/cpuinfo (physical id / core id), e.g. without sysfs.
    text = _read(PROC / "cpuinfo") or ""
    pkg_ids: set[str] = set()
    core_ids: set[tuple[str, str]] = set()
    for block in text.split("\n\n"):
        f = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in block.splitlines())}
        if "physical id" in f and "core id" in f:
            pkg_ids.add(f["physical id"])
            core_ids.add((f["physical id"], f["core id"]))
    if not core_ids:
        return {"sockets": None, "cores": None, "threads_per_core": None}
    logical = text.count("processor\t")
    return {
        "sockets": len(pkg_ids),
        "cores": len(core_ids),
        "threads_per_core": max(1, logical // len(core_ids)) if logical else None,
    }


def _caches() -> dict[str, int | None]:
    caches: dict[str, int | None] = {
        "l1d_cache_bytes": None,
        "l1i_cache_bytes": None,
        "l2_cache_bytes": None,
        "l3_cache_bytes": None,
    }
    for index in sorted((SYS_CPU / "cpu0" / "cache").glob("index*")):
        level = _read(index / "level")
        kind = (_read(index / "type") or "").lower()
        size = _size_bytes(_read(index / "size"))
        if level == "1" and kind == "data":
            key = "l1d_cache_bytes"
        elif level == "1" and kind == "instruction":
            key = "l1i_cache_bytes"
        elif level in ("2", "3"):
            key = f"l{level}_cache_bytes"
        else:
            continue
        if caches[key] is None:
            caches[key] = size
    return caches


def _thp_selected(name: str) -> str | None:
    m = re.search(r"\[([^\]]+)\]", _read(SYS_THP / name) or "")
    return m.group(1) if m else None


def _hypervisor(cpu_flags: set[str]) -> tuple[bool, str | None]:
    """Whether this is a guest, and the hypervisor when a source names it."""
    name: str | None = None
    hv_type = _read(SYS_HYPERVISOR / "type")
    if hv_type:
        name = "Xen" if hv_type.lower() == "xen" else hv_type
    if name is None:
        available = (_read(CLOCKSOURCE) or "").split()
        for source in available:
            for prefix, vendor in _CLOCKSOURCE_HYPERVISORS:
                if source.startswith(prefix):
                    name = vendor
                    break
            if name:
                break
    if name is None:
        dmi = " ".join(
            _read(SYS_DMI / f) or ""
            for f in ("sys_vendor", "product_name", "bios_vendor", "board_vendor")
        ).lower()
        for needle, vendor in _DMI_HYPERVISORS:
            if needle in dmi:
                name = vendor
                break
        if name is None and "microsoft" in dmi and "virtual machine" in dmi:
            name = "Microsoft"
    is_vm = (
        "hypervisor" in cpu_flags or name is not None or SYS_HYPERVISOR.joinpath("type").exists()
    )
    return is_vm, name


def _boot_time_unix() -> int | None:
    for line in (_read(PROC / "stat") or "").splitlines():
        if line.startswith("btime "):
            return _int(line.split()[1])
    return None


def _sysconf(name: str) -> int | None:
    try:
        value = os.sysconf(name)
    except (ValueError, OSError):
        return None
    return value if value > 0 else None


def system_info() -> dict[str, Any]:
    """Read the machine's facts; a field that cannot be read is None."""
    uname = os.uname()
    cpuinfo = _cpuinfo_first_block()
    flags = set((cpuinfo.get("flags") or cpuinfo.get("Features") or "").split())
    meminfo = _meminfo()
    online = parse_cpu_list(_read(SYS_CPU / "online"))
    present = parse_cpu_list(_read(SYS_CPU / "present"))
    nodes = [p for p in SYS_NODE.glob("node[0-9]*") if p.name[4:].isdigit()]
    is_vm, hypervisor = _hypervisor(flags)
    btime = _boot_time_unix()
    page_size = _sysconf("SC_PAGE_SIZE")
    memory = meminfo.get("mem_total_bytes")
    if memory is None and page_size is not None:
        phys = _sysconf("SC_PHYS_PAGES")
        memory = phys * page_size if phys else None

    info: dict[str, Any] = {
        # /proc/sys/kernel is the kernel's own answer; uname is the fallback.
        "hostname": _read(PROC / "sys/kernel/hostname") or uname.nodename,
        "kernel_release": _read(PROC / "sys/kernel/osrelease") or uname.release,
        "kernel_version": _read(PROC / "sys/kernel/version") or uname.version,
        "os_name": _os_name(),
        "arch": uname.machine,
        "cpu_model": (
            cpuinfo.get("model name")
            or cpuinfo.get("cpu model")
            or cpuinfo.get("Processor")
            or cpuinfo.get("cpu")
        ),
        "cpu_vendor": cpuinfo.get("vendor_id") or cpuinfo.get("CPU implementer"),
        **_topology(),
        "logical_cpus": len(present) if present else os.cpu_count(),
        "online_cpus": online,
        "numa_nodes": len(nodes) or None,
        **_caches(),
        "memory_bytes": memory,
        "swap_bytes": meminfo.get("swap_total_bytes"),
        "thp_enabled": _thp_selected("enabled"),
        "thp_defrag": _thp_selected("defrag"),
        "hugepages_total": meminfo.get("hugepages_total"),
        "hugepage_size_bytes": meminfo.get("hugepage_size_bytes"),
        "is_vm": is_vm,
        "hypervisor": hypervisor,
        "boot_time_unix": btime,
        "boot_time": (
            datetime.fromtimestamp(btime, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if btime is not None
            else None
        ),
        "clock_ticks": _sysconf("SC_CLK_TCK"),
        "page_size_bytes": page_size,
    }
    return info


def system_info_table(info: dict[str, Any]) -> pa.Table:
    """One row; CPU lists in the kernel's notation, other lists comma-joined."""
    kinds = {"text": pa.large_string(), "int": pa.int64(), "bool": pa.bool_()}
    row: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, list | tuple | set):
            if all(isinstance(v, int) for v in value):
                value = format_cpu_list(list(value))
            else:
                value = ",".join(str(v) for v in value)
        elif key not in COLUMNS and value is not None:
            value = str(value)  # unknown extra fields are kept, as text
        row[key] = value
    schema = pa.schema([(key, kinds[COLUMNS.get(key, "text")]) for key in row])
    return pa.Table.from_pylist([row], schema=schema)


def system_info_frame(info: dict[str, Any]) -> pl.DataFrame:
    """:func:`system_info_table` as a polars DataFrame."""
    return pl.from_arrow(system_info_table(info))  # type: ignore[return-value]
