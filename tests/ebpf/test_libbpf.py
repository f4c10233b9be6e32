"""The libbpf binding's own structures, checked against the running kernel's BTF."""

from __future__ import annotations

from pathlib import Path

from kernmlops.ebpf.btf import Btf, Kind
from kernmlops.ebpf.libbpf import BpfProgInfo, strerror, version

VMLINUX = Path("/sys/kernel/btf/vmlinux")


def test_prog_info_layout_matches_the_kernel() -> None:
    """Every field we read from struct bpf_prog_info sits where the kernel says."""
    btf = Btf.parse(VMLINUX.read_bytes())
    kernel = {
        name: bit_off // 8
        for name, _t, bit_off, _bf in btf.find(Kind.STRUCT, "bpf_prog_info").members
    }
    for name, _ctype in BpfProgInfo._fields_:
        if name == "gpl_compatible":  # a bitfield word in the kernel's struct
            continue
        assert getattr(BpfProgInfo, name).offset == kernel[name], name


def test_strerror_knows_libbpf_codes() -> None:
    assert strerror(4003) != "Unknown error 4003"  # LIBBPF_ERRNO__FORMAT
    assert strerror(2) == "No such file or directory"


def test_version_is_at_least_one() -> None:
    major, minor = (int(x) for x in version().split("."))
    assert (major, minor) >= (1, 0)
