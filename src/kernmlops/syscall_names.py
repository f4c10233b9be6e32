"""Syscall numbers to names for this architecture, from the installed uapi
header (Debian's linux-libc-dev). A small module of its own: the hooks, the
exporter and the learning code use it without importing each other."""

from __future__ import annotations

import platform
import re
import sysconfig
from functools import cache
from pathlib import Path

_DEFINE = re.compile(r"^#define\s+(__NR\w+)\s+(\w+)", re.MULTILINE)

# Calls added after the headers of a distribution's release (Debian 12 ships
# 6.1's, up to 450). From 424 on, every architecture but alpha numbers its
# calls alike, so one list fills the gap; the header wins where it has a name.
NEWER_CALLS = {
    451: "cachestat",
    452: "fchmodat2",
    453: "map_shadow_stack",
    454: "futex_wake",
    455: "futex_wait",
    456: "futex_requeue",
    457: "statmount",
    458: "listmount",
    459: "lsm_get_self_attr",
    460: "lsm_set_self_attr",
    461: "lsm_list_modules",
    462: "mseal",
    463: "setxattrat",
    464: "getxattrat",
    465: "listxattrat",
    466: "removexattrat",
    467: "open_tree_attr",
    468: "file_getattr",
    469: "file_setattr",
}


def syscall_headers(machine: str | None = None) -> list[Path]:
    """Where linux-libc-dev (Debian) keeps this architecture's syscall numbers."""
    machine = machine or platform.machine()
    triplet = sysconfig.get_config_var("MULTIARCH") or f"{machine}-linux-gnu"
    inc = Path("/usr/include")
    if machine == "x86_64":
        return [inc / triplet / "asm/unistd_64.h", inc / "asm/unistd_64.h"]
    # Newer headers generate unistd_64.h for the generic-table architectures too.
    return [inc / triplet / "asm/unistd_64.h", inc / "asm-generic/unistd.h"]


def parse_unistd(text: str) -> dict[int, str]:
    """``#define __NR_<name> <number or another __NR_ name>`` lines to {number: name}."""
    raw = dict(_DEFINE.findall(text))
    out: dict[int, str] = {}
    for macro, value in raw.items():
        name = macro.removeprefix("__NR_")
        if name == macro or name == "syscalls":  # __NR3264_x, or the table's length
            continue
        for _ in range(4):  # __NR_fcntl -> __NR3264_fcntl -> 25 style aliases
            if value not in raw:
                break
            value = raw[value]
        if value.isdigit():
            out.setdefault(int(value), name)
    return out


@cache
def syscall_table(machine: str | None = None) -> dict[int, str]:
    """Syscall number -> name for this architecture, from the installed uapi
    header (Debian package linux-libc-dev) and the newer calls it may lack;
    empty if there is no header."""
    machine = machine or platform.machine()
    for header in syscall_headers(machine):
        try:
            table = parse_unistd(header.read_text())
        except OSError:
            continue
        if table:
            if machine != "alpha" and max(table) >= 423:
                table = {**NEWER_CALLS, **table}
            return table
    return {}
