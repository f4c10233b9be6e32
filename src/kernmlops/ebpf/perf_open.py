"""perf_event_open(2) through ctypes: software and hardware events, per CPU or task."""

from __future__ import annotations

import ctypes
import errno
import os
import platform

from kernmlops.ebpf.libbpf import LibbpfError

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_HW_CACHE = 3

HW_CPU_CYCLES = 0
HW_INSTRUCTIONS = 1
SW_CPU_CLOCK = 0
SW_TASK_CLOCK = 1

_FLAG_DISABLED = 1 << 0
_FLAG_EXCLUDE_KERNEL = 1 << 5
_FLAG_EXCLUDE_HV = 1 << 6
_FLAG_FREQ = 1 << 10
PERF_FLAG_FD_CLOEXEC = 1 << 3

_SYSCALL = {"x86_64": 298, "aarch64": 241, "riscv64": 241}
_libc = ctypes.CDLL(None, use_errno=True)


class PerfEventAttr(ctypes.Structure):
    """The leading fields of struct perf_event_attr; the rest stays zero."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period_or_freq", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("_rest", ctypes.c_uint8 * 64),
    ]


def perf_event_open(
    type_: int,
    config: int,
    *,
    pid: int = -1,
    cpu: int = 0,
    sample_freq: int | None = None,
    sample_period: int | None = None,
    disabled: bool = False,
    user_only: bool = False,
) -> int:
    """Open one event; returns its fd (close it with os.close). Raises on failure.
    ``user_only``: count user space only, which perf_event_paranoid 2 allows any user
    for their own processes."""
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        raise LibbpfError(f"perf_event_open: unknown syscall number on {platform.machine()}")
    attr = PerfEventAttr()
    attr.type = type_
    attr.size = ctypes.sizeof(PerfEventAttr)
    attr.config = config
    if sample_freq:
        attr.sample_period_or_freq = sample_freq
        attr.flags |= _FLAG_FREQ
    elif sample_period:
        attr.sample_period_or_freq = sample_period
    if disabled:
        attr.flags |= _FLAG_DISABLED
    if user_only:
        attr.flags |= _FLAG_EXCLUDE_KERNEL | _FLAG_EXCLUDE_HV
    fd = _libc.syscall(nr, ctypes.byref(attr), pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise LibbpfError(f"perf_event_open(type={type_}, config={config})", err)
    return fd


def supported(type_: int, config: int) -> tuple[bool, str]:
    """Whether the event opens on CPU 0 (and why not)."""
    try:
        os.close(perf_event_open(type_, config, cpu=0))
    except LibbpfError as err:
        if err.errno in (errno.EACCES, errno.EPERM) and type_ == PERF_TYPE_HARDWARE:
            # refused CPU-wide (perf_event_paranoid), yet whether the PMU counts it at
            # all shows in this process's own user-space count, which any user may open
            try:
                os.close(perf_event_open(type_, config, pid=0, cpu=-1, user_only=True))
            except LibbpfError as own:
                if own.errno in _NO_PMU:
                    return False, _no_pmu(own.errno)
        if err.errno in _NO_PMU and type_ == PERF_TYPE_HARDWARE:
            return False, _no_pmu(err.errno)
        return False, os.strerror(err.errno) if err.errno else str(err)
    return True, ""


#: what perf_event_open answers for a hardware event no PMU of this machine counts
_NO_PMU = (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV)


def _no_pmu(err: int) -> str:
    why = "this machine's PMU does not count it: no hardware counters, e.g. a VM"
    return f"{os.strerror(err)} ({why})"
