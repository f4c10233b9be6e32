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


def test_a_load_errors_reason_is_one_line_with_the_cause_from_the_log() -> None:
    """The log of a real refusal (a map the 5.10 kernel lab would not create, and a
    program the verifier refused): the cause, not only the errno."""
    from kernmlops.ebpf.libbpf import LibbpfError

    refused = (
        "libbpf: prog 'a': BPF program load failed: Permission denied\n"
        "libbpf: prog 'a': -- BEGIN PROG LOAD LOG --\n"
        "0: R1=ctx() R10=fp0\n"
        "0: (79) r0 = *(u64 *)(r1 +512)\n"
        "invalid bpf_context access off=512 size=8\n"
        "processed 1 insns (limit 1000000) max_states_per_insn 0 total_states 0\n"
        "-- END PROG LOAD LOG --\n"
        "libbpf: prog 'a': failed to load: -13\n"
    )
    err = LibbpfError("load a.bpf.o", 13, refused)
    assert err.reason() == (
        "load a.bpf.o: Permission denied (errno 13) "
        "(the verifier: invalid bpf_context access off=512 size=8)"
    )
    no_map = "libbpf: map 'quanta_task_cpu': failed to create: Invalid argument(-22)\n"
    assert LibbpfError("load q.bpf.o", 22, no_map).reason() == (
        "load q.bpf.o: Invalid argument (errno 22) "
        "(map 'quanta_task_cpu': failed to create: Invalid argument(-22))"
    )
    assert (
        LibbpfError("open x.bpf.o", 2).reason()
        == "open x.bpf.o: No such file or directory (errno 2)"
    )
