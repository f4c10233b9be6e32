"""Drop capabilities once the programs are attached (``--capabilities.keep``).

Attaching needs CAP_BPF and CAP_PERFMON (or root); serving does not: reading
maps through fds already open, and the program facts, need no capability on
kernels since 6.5 (older ones check CAP_BPF on every bpf() call unless
unprivileged BPF is allowed). ``ksym``/``kstack`` read /proc/kallsyms once,
before the drop. What is kept is given as ebpf_exporter takes it: ``all`` (the
default: nothing is dropped), ``none``, or names such as
``cap_syslog,cap_bpf``.

capset(2) changes the calling thread only: the drop is made before the server
starts its threads (they inherit it), and afterwards every thread of the
process is checked in /proc; one still holding a capability is an error.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from kernmlops.errors import KernmlopsError

#: include/uapi/linux/capability.h
CAPABILITIES = (
    "cap_chown", "cap_dac_override", "cap_dac_read_search", "cap_fowner", "cap_fsetid",
    "cap_kill", "cap_setgid", "cap_setuid", "cap_setpcap", "cap_linux_immutable",
    "cap_net_bind_service", "cap_net_broadcast", "cap_net_admin", "cap_net_raw",
    "cap_ipc_lock", "cap_ipc_owner", "cap_sys_module", "cap_sys_rawio", "cap_sys_chroot",
    "cap_sys_ptrace", "cap_sys_pacct", "cap_sys_admin", "cap_sys_boot", "cap_sys_nice",
    "cap_sys_resource", "cap_sys_time", "cap_sys_tty_config", "cap_mknod", "cap_lease",
    "cap_audit_write", "cap_audit_control", "cap_setfcap", "cap_mac_override",
    "cap_mac_admin", "cap_syslog", "cap_wake_alarm", "cap_block_suspend", "cap_audit_read",
    "cap_perfmon", "cap_bpf", "cap_checkpoint_restore",
)  # fmt: skip
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
#: thread pools that libraries start at import (OpenBLAS under numpy): one
#: thread each, so that no thread but ours holds capabilities
POOL_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


class CapabilityError(KernmlopsError):
    """--capabilities.keep names an unknown capability, or the drop failed."""


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def parse_keep(text: str) -> frozenset[int] | None:
    """``all`` -> None (keep everything); ``none`` -> nothing; else the named ones."""
    text = text.strip().lower()
    if text == "all":
        return None
    if text in ("none", ""):
        return frozenset()
    out = set()
    for name in (n.strip() for n in text.split(",")):
        key = name if name.startswith("cap_") else f"cap_{name}"
        if key not in CAPABILITIES:
            raise CapabilityError(
                f"--capabilities.keep: unknown capability {name!r} (e.g. cap_bpf, cap_perfmon, "
                "cap_syslog; or all, none)"
            )
        out.add(CAPABILITIES.index(key))
    return frozenset(out)


def names(mask: int) -> list[str]:
    return [name for i, name in enumerate(CAPABILITIES) if mask >> i & 1]


def thread_masks(field: str = "CapEff", pid: str = "self") -> dict[int, int]:
    """Each thread's capability mask (``CapEff``, ``CapPrm``...) from /proc."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:
            continue  # ended meanwhile
        for line in text.splitlines():
            if line.startswith(field + ":"):
                out[int(task.name)] = int(line.split()[1], 16)
    return out


def drop_capabilities(keep: frozenset[int]) -> int:
    """Keep only ``keep`` in the effective and permitted sets (inheritable
    cleared); returns the mask kept. Raises if a thread still holds more."""
    mask = 0
    for cap in keep:
        mask |= 1 << cap
    mask &= thread_masks("CapPrm").get(threading.get_native_id(), mask)  # what we have
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    for i in range(2):
        part = (mask >> (32 * i)) & 0xFFFFFFFF
        data[i].effective = data[i].permitted = part
        data[i].inheritable = 0
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise CapabilityError(f"cannot drop capabilities: {os.strerror(err)}")
    holding = {tid: m for tid, m in thread_masks().items() if m & ~mask}
    if holding:
        tid, extra = next(iter(holding.items()))
        raise CapabilityError(
            f"capabilities dropped in this thread, but {len(holding)} other thread(s) still "
            f"hold some (thread {tid}: {', '.join(names(extra & ~mask))}); refusing to serve"
        )
    return mask
