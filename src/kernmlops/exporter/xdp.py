"""``SEC("xdp/<interface>")`` programs: ebpf_exporter's way of naming the
network interface an XDP program runs on (its xdp example counts what arrives
on ``lo``).

libbpf has no such section (plain ``xdp`` only, and no interface), so the
object would not load: we register ``xdp/`` as an XDP program, as
ebpf_exporter does, and attach it to the interface the section names
(generic XDP where the driver has none, e.g. ``lo``).
"""

from __future__ import annotations

import errno
import socket

from kernmlops.ebpf.libbpf import LibbpfError, register_prog_handler
from kernmlops.ebpf.objects import Link, Program

PREFIX = "xdp/"
BPF_PROG_TYPE_XDP = 6
BPF_XDP = 37  # enum bpf_attach_type
#: libbpf's own xdp/ sections (map programs), left to libbpf
_LIBBPF_OWN = ("xdp/devmap", "xdp/cpumap")


def register_section_handler() -> None:
    """Teach libbpf (once per process) that ``xdp/<interface>`` sections are
    XDP programs; without it, loading such an object fails."""
    register_prog_handler(PREFIX, BPF_PROG_TYPE_XDP, BPF_XDP)


def is_xdp_interface(section: str) -> bool:
    return (
        section.startswith(PREFIX)
        and len(section) > len(PREFIX)
        and not section.startswith(_LIBBPF_OWN)
    )


def attach_xdp(prog: Program) -> Link:
    """Attach ``prog`` to the interface its section names; one line if there is
    no such interface."""
    device = prog.section.removeprefix(PREFIX)
    try:
        ifindex = socket.if_nametoindex(device)
    except OSError:
        raise LibbpfError(
            f"attach {prog.name} ({prog.section}): no network interface {device!r}"
        ) from None
    try:
        return prog.attach_xdp(ifindex)
    except LibbpfError as err:
        if err.errno != errno.EBUSY:
            raise
        # an interface runs one XDP program: another (another exporter's?) holds it
        raise LibbpfError(
            f"attach {prog.name} ({prog.section}): {device} already runs an XDP "
            f"program (see ip link show {device})",
            err.errno,
        ) from None
