"""The kernel lab: a command in another kernel (the test run's one lab boot,
tests/lab.py), apart from test_qemu.py's tests, which need no lab and run beside the
main lane (tests/lanes.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernmlops.vm.qemu import default_kernel
from tests.lab import LabRun, Part


def _guest_command(folder: Path) -> list[str]:
    script = (
        f"uname -r > {folder}/release; cat /sys/devices/system/node/online > {folder}/nodes; "
        f"grep -c ' can_migrate_task$' /proc/kallsyms > {folder}/probe; exit 7"
    )
    return ["sh", "-c", script]


#: this module's share of the test run's one lab boot (tests/lab.py): last, so that its
#: exit code is the guest's, and so kernmlops vm's
LAB_PART = Part("qemu", _guest_command, timeout_s=120, order=9)


@pytest.mark.bpf
def test_a_command_runs_inside_another_kernel(lab: LabRun) -> None:
    """Boot Debian's kernel with 2 NUMA nodes; the guest writes a file we read
    back, and its exit code is the command's."""
    part = lab.parts["qemu"].check()
    assert part.exit_code == 7, part.output[-2000:]
    assert lab.exit_code == 7, lab.output[-2000:]
    release = (part.folder / "release").read_text().strip()
    assert release != os.uname().release
    assert default_kernel().name == f"vmlinuz-{release}"
    assert (part.folder / "nodes").read_text().strip() == "0-1"
    assert int((part.folder / "probe").read_text()) == 1  # kprobe-able there, unlike here
