"""The capabilities this process holds, for the steps that need more than BPF.

Root is uid 0 with every capability. A collector may run with fewer: uid 0 under a
bounding set of CAP_BPF and CAP_PERFMON (a systemd unit's CapabilityBoundingSet,
``setpriv``, ``capsh``), or another uid given both as ambient capabilities. The kernel
then checks each capability on its own, so uid 0 alone says nothing: what a step needs
is read from the effective set (``CapEff`` in /proc/self/status).
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CAP_BPF",
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_PERFMON",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SYS_ADMIN",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "effective",
    "held",
    "holds",
]

#: include/uapi/linux/capability.h (the ones the collector's steps need)
CAP_CHOWN = 0
CAP_DAC_OVERRIDE = 1
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SYS_ADMIN = 21
CAP_SYS_NICE = 23
CAP_SYS_RESOURCE = 24
CAP_PERFMON = 38
CAP_BPF = 39

_NAMES = {
    CAP_CHOWN: "CAP_CHOWN",
    CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE",
    CAP_SETGID: "CAP_SETGID",
    CAP_SETUID: "CAP_SETUID",
    CAP_SYS_ADMIN: "CAP_SYS_ADMIN",
    CAP_SYS_NICE: "CAP_SYS_NICE",
    CAP_SYS_RESOURCE: "CAP_SYS_RESOURCE",
    CAP_PERFMON: "CAP_PERFMON",
    CAP_BPF: "CAP_BPF",
}


def effective(status: str | None = None) -> int:
    """The effective set as a mask (``status``: the text of /proc/self/status)."""
    if status is None:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return 0
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def holds(cap: int, mask: int | None = None) -> bool:
    """Whether ``cap`` is in ``mask`` (default: this process's effective set)."""
    return bool((effective() if mask is None else mask) >> cap & 1)


def held(mask: int | None = None) -> list[str]:
    """The names of the capabilities above that ``mask`` holds (the manifest's list)."""
    mask = effective() if mask is None else mask
    return [name for cap, name in sorted(_NAMES.items()) if mask >> cap & 1]
