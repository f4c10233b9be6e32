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

The boot starts as soon as the run's tests are collected, in the background, at the
idle CPU policy (tests/lanes.py): it takes only CPU time the run's tests leave, while
the ``bpf`` modules run; the lab's tests come after them and wait for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.lanes import start_idle_session

#: ``kernmlops vm``'s machine for every part: two CPUs on two NUMA nodes (TCG runs one
#: host thread per guest CPU). Not ``--idle``: QEMU's session is an autogroup of its own,
#: and at nice 19 it would get ~1.5% of a CPU while the idle lane (in the run's group)
#: has work, so the boot would wait for that lane's ~7 minutes and the lab's tests in
#: the main lane with it; at nice 0 it shares the CPUs with the run's group instead
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


#: each prepared part's guest command and time limit, by name
Commands = dict[str, tuple[list[str], int]]

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


def _prepare(parts: Iterable[Part], out: Path) -> tuple[LabRun, Commands]:
    """Every part's folder and host-side preparation: the run so far, and the commands
    of the parts that prepared."""
    run = LabRun()
    commands: Commands = {}
    for part in sorted(parts, key=lambda p: (p.order, p.name)):
        folder = out / part.name
        folder.mkdir(parents=True)
        result = run.parts[part.name] = PartResult(folder)
        try:
            commands[part.name] = (part.prepare(folder), part.timeout_s)
        except Exception as err:  # that part's test reports it; the others run
            result.error = err
    return run, commands


def _vm_argv(run: LabRun, commands: Commands, out: Path) -> list[str]:
    # files the guest reads (the command goes on the kernel's command line, 2 KiB)
    spec = out / "lab.json"
    spec.write_text(json.dumps([
        {"argv": argv, "folder": str(run.parts[name].folder), "timeout_s": timeout_s}
        for name, (argv, timeout_s) in commands.items()
    ]))  # fmt: skip
    script = out / "lab.sh"
    script.write_text(guest_script(spec) + "\n")
    return [sys.executable, "-m", "kernmlops", "vm", *VM_ARGS, "-o", str(out),
            "--timeout", str(_limit(commands)), "--", "sh", str(script)]  # fmt: skip


def _limit(commands: Commands) -> int:
    return BOOT_S + sum(t for _, t in commands.values())


def _finish(run: LabRun, commands: Commands, code: int, said: str) -> LabRun:
    """``kernmlops vm``'s exit code and output, and each part's."""
    run.exit_code, run.output = code, said
    for name in commands:
        result = run.parts[name]
        exit_code = result.folder / "exit_code"
        # a part that ran long left what it waited on (tests/lab_guest.py): shown after
        # its output, where a failing test prints the output's end
        stuck = result.folder / "stuck.txt"
        stuck_said = ""
        if stuck.exists():
            stuck_said = "\n-- still running at half its limit (stuck.txt):\n" + stuck.read_text(
                errors="replace"
            )
        if not exit_code.exists():
            result.error = RuntimeError(f"no exit code: the VM said {said[-4000:]}{stuck_said}")
            continue
        result.exit_code = int(exit_code.read_text())
        result.output = (result.folder / "output").read_text(errors="replace") + stuck_said
    return run


def _failed(run: LabRun, commands: Iterable[str], err: BaseException) -> LabRun:
    for name in commands:
        run.parts[name].error = err
    return run


class LabStart:
    """Every part prepared here, then the lab's one boot started in the background, at
    the idle CPU policy: the run's other tests go on meanwhile; :meth:`result` waits
    for it. The VM is started in a session of its own and is no child of the test run
    (tests check that the code they run leaves no child behind)."""

    def __init__(self, parts: Iterable[Part], out: Path) -> None:
        self.run, self.commands = _prepare(parts, out)
        self.out = out
        self.deadline = time.monotonic() + _limit(self.commands) + 60
        self._done: LabRun | None = None
        if not self.commands:
            return
        said, code = out / "vm.stderr", out / "vm.exit_code"
        argv = _vm_argv(self.run, self.commands, out)
        start_idle_session(argv, out / "vm.pid", code, stdout=None, stderr=said)

    def result(self) -> LabRun:
        """What each part did, once the VM exited (at most the lab's time limit)."""
        if self._done is not None:
            return self._done
        code = self.out / "vm.exit_code"
        if self.commands:
            while not code.exists() and time.monotonic() < self.deadline:
                time.sleep(0.5)
        if not self.commands:
            self._done = self.run
        elif not code.exists():
            late = TimeoutError(f"the lab ran past {_limit(self.commands) + 60} s")
            self._done = _failed(self.run, self.commands, late)
        else:
            said = (self.out / "vm.stderr").read_text(errors="replace")
            self._done = _finish(self.run, self.commands, int(code.read_text()), said)
        return self._done

    def stop(self) -> None:
        """A run that ends before the lab did (Ctrl+C, -x): its VM goes too.
        ``kernmlops vm`` takes SIGINT as Ctrl+C and stops the VM it started."""
        if not self.commands or (self.out / "vm.exit_code").exists():
            return
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int((self.out / "vm.pid").read_text()), signal.SIGINT)
