"""The kernel lab: command lines (pure), a SIGTERM's stop and the hint where it is not
set up; its command in another kernel is test_qemu_lab.py's (the main lane's)."""

from __future__ import annotations

import os
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


def test_a_sigterm_stops_the_vm_too(tmp_path: Path) -> None:
    """QEMU runs in a session of its own: a `kernmlops vm` that a SIGTERM ends (`timeout`,
    a job scheduler) must take it down, not leave it running at a full CPU. A shell
    stands in for QEMU (the process group the VM's command runs in)."""
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "guest.pid"
    script = (
        "import sys; from pathlib import Path; import kernmlops.vm.qemu as q\n"
        "q.vm_command = lambda *a, **k: ['sh', '-c', "
        f"'sleep 60 & echo $! > {pid_file}; wait']\n"
        "q.shutil.which = lambda name: '/bin/' + name\n"
        f"q.run_in_vm(['x'], kernel=Path('/bin/sh'), outdir=Path({str(tmp_path)!r}))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    guest = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "stopped by SIGTERM" in err, err
    deadline = time.monotonic() + 5
    while Path(f"/proc/{guest}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # killed; reaped by init
    assert (
        not Path(f"/proc/{guest}").exists()
        or "Z" in Path(f"/proc/{guest}/stat").read_text().split()[2]
    )


def test_a_lab_not_set_up_is_told_commands_an_installed_wheel_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue: the hint began "make lab", a target of the source checkout's Makefile
    # that a user of the installed wheel does not have.
    import shutil
    import subprocess

    from kernmlops.vm.qemu import run_in_vm

    kernel = tmp_path / "vmlinuz-9.9.9"
    kernel.write_bytes(b"")
    monkeypatch.setenv("PATH", str(tmp_path))  # no qemu there
    with pytest.raises(LabError) as err:
        run_in_vm(["true"], kernel=kernel, outdir=tmp_path / "out")
    said = str(err.value)
    assert said.startswith("qemu-system-x86_64 not found; set up the kernel lab: apt-get install ")
    assert "in kernmlops' source checkout: make lab" in said
    packages = said.split("apt-get install ", 1)[1].split(";", 1)[0].split()
    assert "qemu-system-x86" in packages
    monkeypatch.undo()
    if shutil.which("apt-cache"):  # Debian knows each package the hint names
        out = subprocess.run(["apt-cache", "show", "--no-all-versions", *packages],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert out.returncode == 0, out.stderr
        names = {x.split(": ", 1)[1] for x in out.stdout.splitlines() if x.startswith("Package: ")}
        assert names == set(packages)


def test_vm_idle_runs_qemu_at_the_idle_policy_in_a_nice_19_session(tmp_path: Path) -> None:
    """`kernmlops vm --idle`: QEMU's process, read
    while it runs, has SCHED_IDLE and its session's autogroup nice 19. A shell stands
    in for QEMU (the process `kernmlops vm` starts, in its own session)."""
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "guest.pid"
    script = (
        "import kernmlops.vm.qemu as q\n"
        "from kernmlops.vm.cli import vm_command\n"
        "q.vm_command = lambda *a, **k: ['sh', '-c', "
        f"'sleep 60 & echo $$ > {pid_file}; wait']\n"
        "q.shutil.which = lambda name: '/bin/' + name\n"
        f"vm_command(['--idle', '--kernel', '/bin/sh', '-o', {str(tmp_path)!r}, '--', 'x'])\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        guest = int(pid_file.read_text())
        # field 41 of /proc/<pid>/stat (after the command's parenthesised name)
        stat = Path(f"/proc/{guest}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[41 - 3]) == os.SCHED_IDLE == os.sched_getscheduler(guest)
        assert os.getsid(guest) == guest != os.getsid(0)  # a session of its own
        group = Path(f"/proc/{guest}/autogroup")
        if group.exists():  # a kernel with autogroups
            assert group.read_text().split()[-2:] == ["nice", "19"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
