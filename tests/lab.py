"""The kernel lab's one boot for the whole test run (fixture ``lab`` in tests/conftest.py).

A boot of Debian's kernel under QEMU without KVM costs 30-45 s on a 2-vCPU machine, and
each lab test used to boot once. A lab test module declares ``LAB_PART``, a
:class:`Part`: what it prepares on the host and the command it runs in the guest. The
parts of every collected test that uses ``lab`` run in one guest, one after the other,
each with its own folder, output and exit code; the guest exits with the last part's
exit code, as ``kernmlops vm`` exits with its command's.

They run in one guest interpreter (tests/lab_guest.py): a part whose command is this
Python runs in it, as runpy runs it. There, a Python start that imports the
collector's stack costs 25-60 s, every time (nothing of the host's files is cached
between processes).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

#: ``kernmlops vm``'s machine for every part: two CPUs on two NUMA nodes (TCG runs one
#: host thread per guest CPU)
VM_ARGS = ["--cpus", "2", "--numa", "2", "--memory", "2G"]
#: the boot and the guest's shutdown, beside the parts' own time limits
BOOT_S = 300


@dataclass(frozen=True)
class Part:
    """One test's share of the boot. ``prepare(folder)`` runs on the host first and
    returns the command that runs in the guest (argv; ``folder`` is writable there at
    the same path), for at most ``timeout_s``. Parts run in ``order``."""

    name: str
    prepare: Callable[[Path], list[str]]
    timeout_s: int
    order: int = 0


@dataclass
class PartResult:
    folder: Path
    #: the command's exit code in the guest (124: it ran past its time limit)
    exit_code: int | None = None
    #: its output (stdout and stderr)
    output: str = ""
    #: why it did not run (its prepare failed, or the boot did)
    error: BaseException | None = None

    def check(self) -> PartResult:
        """This result, or the reason the part has none raised."""
        if self.error is not None:
            raise AssertionError(f"the lab part did not run: {self.error!r}") from self.error
        return self


@dataclass
class LabRun:
    #: ``kernmlops vm``'s exit code and output (its own lines, the guest's console)
    exit_code: int | None = None
    output: str = ""
    parts: dict[str, PartResult] = field(default_factory=dict)


#: the guest's runner of the parts
GUEST = Path(__file__).with_name("lab_guest.py")


def guest_script(spec: Path) -> str:
    """sh: the parts in ``spec`` run by tests/lab_guest.py in one interpreter, with this
    checkout's package first on its path (a venv's editable install may name another
    checkout); exits with the last part's exit code."""
    import kernmlops

    src = Path(kernmlops.__file__).resolve().parents[1]
    runner = shlex.join([sys.executable, str(GUEST), str(spec)])
    return f"PYTHONPATH={shlex.quote(str(src))} exec {runner}"


def run_lab(parts: Iterable[Part], out: Path) -> LabRun:
    """Prepare every part, boot once, run them in order; what each did."""
    run = LabRun()
    commands: dict[str, tuple[list[str], int]] = {}
    for part in sorted(parts, key=lambda p: (p.order, p.name)):
        folder = out / part.name
        folder.mkdir(parents=True)
        result = run.parts[part.name] = PartResult(folder)
        try:
            commands[part.name] = (part.prepare(folder), part.timeout_s)
        except Exception as err:  # that part's test reports it; the others run
            result.error = err
    if not commands:
        return run
    # files the guest reads (the command goes on the kernel's command line, 2 KiB)
    spec = out / "lab.json"
    spec.write_text(json.dumps([
        {"argv": argv, "folder": str(run.parts[name].folder), "timeout_s": timeout_s}
        for name, (argv, timeout_s) in commands.items()
    ]))  # fmt: skip
    script = out / "lab.sh"
    script.write_text(guest_script(spec) + "\n")
    limit = BOOT_S + sum(t for _, t in commands.values())
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kernmlops", "vm", *VM_ARGS, "-o", str(out),
             "--timeout", str(limit), "--", "sh", str(script)],
            capture_output=True, text=True, timeout=limit + 60,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        for name in commands:
            run.parts[name].error = err
        return run
    run.exit_code, run.output = proc.returncode, proc.stderr
    for name in commands:
        result = run.parts[name]
        code = result.folder / "exit_code"
        if not code.exists():
            result.error = RuntimeError(f"no exit code: the VM said {proc.stderr[-4000:]}")
            continue
        result.exit_code = int(code.read_text())
        result.output = (result.folder / "output").read_text(errors="replace")
    return run
