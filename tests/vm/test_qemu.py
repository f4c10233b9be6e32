"""The kernel lab: command lines (pure) and one real boot of another kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernmlops.vm.qemu import LabError, default_kernel, numa_args, parse_memory, vm_command


def test_numa_split_is_even() -> None:
    assert numa_args(4, 2, 4096) == ["--numa", "2048M,cpus=0-1", "--numa", "2048M,cpus=2-3"]
    assert numa_args(3, 2, 2048) == ["--numa", "1024M,cpus=0-1", "--numa", "1024M,cpus=2"]
    with pytest.raises(LabError, match="one CPU per NUMA node"):
        numa_args(1, 2, 2048)
    with pytest.raises(LabError, match="split evenly"):
        numa_args(4, 3, 4096)


def test_memory_sizes() -> None:
    assert parse_memory("4G") == 4096
    assert parse_memory("512M") == 512
    assert parse_memory("300") == 300
    with pytest.raises(LabError, match=r"expected e\.g\. 4G"):
        parse_memory("four gigs")


def test_command_line_never_uses_kvm(tmp_path: Path) -> None:
    argv = vm_command(
        ["kernmlops", "doctor"], kernel=Path("/boot/k"), cpus=4, numa=2, memory_mib=4096,
        outdir=tmp_path,
    )  # fmt: skip
    assert "--disable-kvm" in argv
    assert argv[argv.index("--rwdir") + 1] == str(tmp_path)
    assert argv[-1].endswith("kernmlops doctor")
    assert argv.count("--numa") == 2


def test_default_kernel_is_not_the_running_one() -> None:
    kernel = default_kernel()
    assert kernel.exists()
    assert kernel.name != f"vmlinuz-{os.uname().release}"


@pytest.mark.bpf
def test_a_command_runs_inside_another_kernel(tmp_path: Path) -> None:
    """Boot Debian's kernel with 2 NUMA nodes; the guest writes a file we read
    back, and its exit code is the command's."""
    out = tmp_path / "out"
    script = (
        f"uname -r > {out}/release; cat /sys/devices/system/node/online > {out}/nodes; "
        f"grep -c ' can_migrate_task$' /proc/kallsyms > {out}/probe; exit 7"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "kernmlops", "vm", "--cpus", "2", "--numa", "2", "--memory", "2G",
         "-o", str(out), "--timeout", "600", "--", "sh", "-c", script],
        capture_output=True, text=True, timeout=660,
    )  # fmt: skip
    assert proc.returncode == 7, proc.stderr[-2000:]
    release = (out / "release").read_text().strip()
    assert release != os.uname().release
    assert default_kernel().name == f"vmlinuz-{release}"
    assert (out / "nodes").read_text().strip() == "0-1"
    assert int((out / "probe").read_text()) == 1  # kprobe-able there, unlike here
