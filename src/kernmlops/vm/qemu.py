"""Run a command inside another kernel under QEMU through virtme-ng.

The guest shares the host's files read-only (so the same .venv and BPF
objects run there: CO-RE adapts them to the guest kernel), has an emulated
NUMA topology, and writes into one read-write folder that comes back. The
command's exit code is the guest command's.

KVM is not used: on hosts whose KVM is itself emulated it hangs; TCG is
20-28x slower but always works.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kernmlops.errors import KernmlopsError

#: commands an installed wheel's user has too; the checkout's `make lab` runs the same
SETUP_HINT = (
    "set up the kernel lab: apt-get install qemu-system-x86 linux-image-amd64 "
    "busybox-static; pip install virtme-ng (in kernmlops' source checkout: make lab)"
)


class LabError(KernmlopsError):
    """The kernel lab is not set up or QEMU failed to start."""


@dataclass(frozen=True)
class VmResult:
    exit_code: int
    output: str
    seconds: float
    outdir: Path


def _release_key(path: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", path.name.removeprefix("vmlinuz-")))


def default_kernel() -> Path:
    """The newest Debian kernel image in /boot that is not the running kernel
    (Debian's linux-image-amd64: kprobes, BTF and NUMA emulation on)."""
    running = os.uname().release
    images = [p for p in Path("/boot").glob("vmlinuz-*") if p.name != f"vmlinuz-{running}"]
    if not images:
        raise LabError(f"no kernel image in /boot besides the running one; {SETUP_HINT}")
    return max(images, key=_release_key)


def _vng() -> str:
    # The venv's scripts first: `vng` calls `virtme-run` from PATH.
    here = str(Path(sys.executable).parent)
    found = shutil.which("vng", path=os.pathsep.join([here, os.environ.get("PATH", "")]))
    if not found:
        raise LabError(f"vng (virtme-ng) not found; {SETUP_HINT}")
    return found


def numa_args(cpus: int, nodes: int, memory_mib: int) -> list[str]:
    """``--numa`` arguments splitting CPUs and memory evenly over the nodes."""
    if nodes < 1 or cpus < nodes:
        raise LabError(f"need at least one CPU per NUMA node (cpus={cpus}, numa={nodes})")
    if memory_mib % nodes:
        raise LabError(f"memory {memory_mib} MiB does not split evenly over {nodes} nodes")
    out, first = [], 0
    for node in range(nodes):
        count = cpus // nodes + (1 if node < cpus % nodes else 0)
        last = first + count - 1
        span = f"{first}-{last}" if last > first else f"{first}"
        out += ["--numa", f"{memory_mib // nodes}M,cpus={span}"]
        first = last + 1
    return out


def parse_memory(text: str) -> int:
    """'4G', '512M' or a number of MiB -> MiB."""
    m = re.fullmatch(r"\s*(\d+)\s*([GgMm]?)\s*", text)
    if not m:
        raise LabError(f"memory {text!r}: expected e.g. 4G or 2048M")
    value = int(m.group(1))
    return value * 1024 if m.group(2).lower() == "g" else value


def vm_command(
    command: list[str],
    *,
    kernel: Path,
    cpus: int,
    numa: int,
    memory_mib: int,
    outdir: Path,
) -> list[str]:
    """The vng command line (pure: no side effects)."""
    inner = "cd " + shlex.quote(os.getcwd()) + " && " + shlex.join(command)
    return [
        _vng(),
        "--disable-kvm",
        "--run", str(kernel),
        "--cpus", str(cpus),
        "--memory", f"{memory_mib}M",
        *(numa_args(cpus, numa, memory_mib) if numa > 1 else []),
        "--rwdir", str(outdir),
        # KVM modules would only cost start-up time under TCG.
        "--append", "modprobe.blacklist=kvm,kvm_amd,kvm_intel",
        "--exec", inner,
    ]  # fmt: skip


def _stop_on_signals() -> dict[int, object]:
    """Make SIGTERM and SIGHUP raise LabError here (so the caller's cleanup runs); the
    handlers they had, to put back. Nothing outside the main thread (Python's rule)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum: int, _frame: object) -> None:
        raise LabError(f"stopped by {signal.Signals(signum).name}: the VM was stopped too")

    return {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}


def idle_vm() -> None:
    """In QEMU's process, after its setsid: the SCHED_IDLE policy, and its session's
    autogroup at nice 19. With autogroups (a scheduling group per session) a policy
    only orders tasks inside their group, and a new session's group weighs as much as
    any other at nice 0: the policy alone would still take a CPU from the others.
    (For ``preexec_fn``: nothing that can fail loudly; no autogroups, no file.)"""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    try:
        with open("/proc/self/autogroup", "w") as group:
            group.write("19")
    except OSError:
        pass  # a kernel without autogroups: the policy is all there is


def run_in_vm(
    command: list[str],
    *,
    kernel: Path | None = None,
    cpus: int = 4,
    numa: int = 2,
    memory: str = "4G",
    outdir: Path = Path("vm-out"),
    timeout_s: float | None = None,
    echo: bool = True,
    idle: bool = False,
) -> VmResult:
    """Boot ``kernel`` with ``cpus`` CPUs over ``numa`` nodes and run ``command``.

    ``outdir`` is the guest's writable folder (created; same path inside).
    Output is captured through pipes (QEMU reopens its stdout, so a shared log
    file could be overwritten) and echoed line by line when ``echo``. With ``idle``
    QEMU runs only on CPU time nothing else wants (:func:`idle_vm`).
    """
    if not command:
        raise LabError("no command to run in the VM: kernmlops vm -- CMD ...")
    kernel = kernel or default_kernel()
    if not kernel.exists():
        raise LabError(f"kernel image {kernel} not found; {SETUP_HINT}")
    if not shutil.which("qemu-system-x86_64"):
        raise LabError(f"qemu-system-x86_64 not found; {SETUP_HINT}")
    outdir = outdir.resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    argv = vm_command(
        command,
        kernel=kernel,
        cpus=cpus,
        numa=numa,
        memory_mib=parse_memory(memory),
        outdir=outdir,
    )
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(argv[0]).parent), os.environ["PATH"]])}
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,
        preexec_fn=idle_vm if idle else None,
    )
    lines: list[str] = []
    # QEMU runs in a session of its own (no terminal signal reaches it): a SIGTERM or
    # SIGHUP to this process must stop it too, not leave it running at a full CPU
    stoppers = _stop_on_signals()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if echo:
                sys.stderr.write(line)
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise LabError(f"the VM ran past {timeout_s:.0f} s")
        code = proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        for signum, handler in stoppers.items():
            signal.signal(signum, handler)
    output = "".join(lines)
    if "busybox" in output and "could not be found" in output:
        raise LabError(f"busybox-static is missing; {SETUP_HINT}")
    return VmResult(code, output, time.monotonic() - start, outdir)
