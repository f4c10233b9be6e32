"""Runs in the kernel lab (tests/lab.py): every part of the boot in one interpreter.

Under QEMU without KVM a Python start that imports the collector's stack (polars,
numpy, pyarrow) costs 40-60 s, and the guest caches nothing of the host's files
between processes: a part whose command is this Python (``python -m MODULE ...`` or
``python SCRIPT ...``, after ``env VAR=value ...``) runs here, in this process, as
runpy runs it, with its ``sys.argv`` and environment; any other command runs as a
child. Each part's output (fds 1 and 2) goes to ``FOLDER/output`` and its exit code
(124: past its time limit) to ``FOLDER/exit_code``; the process exits with the last
part's exit code.

A part still running at half its limit (at most STUCK_S) leaves ``FOLDER/stuck.txt``:
every Python thread's stack, each of this process's threads' kernel stack, and the
machine's busiest tasks (a hang in the guest explains itself to the host's test). One
that has not ended GRACE_S after its limit (a cleanup that hangs too) ends the
interpreter: its exit code is 124 and the parts after it do not run.

    python lab_guest.py SPEC.json   # [{"argv": [...], "folder": "...", "timeout_s": N}, ...]
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

#: a part still running after this many seconds (or half its limit) leaves stuck.txt
STUCK_S = 300
#: a part that has not ended this long after its limit ends the interpreter
GRACE_S = 60


class _PastLimit(BaseException):
    """The part ran past its time limit (BaseException: no part's handler takes it)."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _PastLimit


def split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """``env A=1 B=2 cmd ...`` -> ({A: 1, B: 2}, [cmd, ...]); other argv unchanged."""
    if not argv or argv[0] != "env":
        return {}, argv
    env, rest = {}, argv[1:]
    while rest and "=" in rest[0] and not rest[0].startswith("="):
        key, _, value = rest.pop(0).partition("=")
        env[key] = value
    return env, rest


def in_process(argv: list[str]) -> bool:
    """Whether ``argv`` is this interpreter running a module or a script."""
    return (
        len(argv) >= 2
        and argv[0] == sys.executable
        and ((argv[1] == "-m" and len(argv) >= 3) or argv[1].endswith(".py"))
    )


def run_here(argv: list[str], env: dict[str, str]) -> int:
    """``python -m MODULE ARGS`` or ``python SCRIPT ARGS`` as runpy runs it: its exit
    code (SystemExit's, 1 for an exception, whose traceback goes to the output)."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    os.environ.update(env)
    # PYTHONPATH as a fresh interpreter would take it: ahead of the rest
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [p for p in extra if p not in sys.path]
    try:
        if argv[1] == "-m":
            sys.argv = [argv[2], *argv[3:]]
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv[1:]
            sys.path.insert(0, str(Path(argv[1]).resolve().parent))
            runpy.run_path(argv[1], run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except _PastLimit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


def _task_lines(proc: str) -> list[str]:
    """A task's name, state, wait channel and kernel stack (root reads the stack)."""

    def read(name: str) -> str:
        try:
            return Path(proc, name).read_text(errors="replace").strip()
        except OSError as err:
            return f"({err.strerror})"

    state = next((ln for ln in read("status").splitlines() if ln.startswith("State:")), "")
    head = f"{proc}: {read('comm')} {state.removeprefix('State:').strip()} wchan={read('wchan')}"
    return [head, *("    " + ln for ln in read("stack").splitlines())]


def _cpu_ticks() -> dict[str, tuple[int, str]]:
    ticks = {}
    for stat in Path("/proc").glob("[0-9]*/task/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            fields = text[text.rindex(")") + 2 :].split()
            ticks[str(stat.parent)] = (int(fields[11]) + int(fields[12]), fields[0])
    return ticks


def describe_stuck(path: Path) -> None:
    """Append to ``path`` what this process's threads wait on in the kernel and the
    tasks that used the most CPU over one second (best effort: it runs beside a hang)."""
    lines = [f"-- guest uptime {time.clock_gettime(time.CLOCK_BOOTTIME):.1f} s, load "
             f"{Path('/proc/loadavg').read_text().strip()}",
             "-- this process's threads:"]  # fmt: skip
    for task in sorted(Path("/proc/self/task").iterdir()):
        lines += _task_lines(str(task))
    before = _cpu_ticks()
    time.sleep(1.0)
    after = _cpu_ticks()
    busy = sorted(((t - before.get(k, (0, ""))[0], k, s) for k, (t, s) in after.items()),
                  reverse=True)[:8]  # fmt: skip
    lines.append("-- the busiest tasks over 1 s (ticks, task, state):")
    for ticks, task, state in busy:
        if ticks > 0:
            lines += [f"{ticks} {state}", *_task_lines(task)]
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")


class _Watch:
    """stuck.txt at STUCK_S (or half the limit), the interpreter's end GRACE_S after
    the limit; both cancelled when the part ends."""

    def __init__(self, folder: Path, timeout_s: int) -> None:
        self.stuck = folder / "stuck.txt"
        at = min(timeout_s / 2, STUCK_S)
        self._file = open(self.stuck, "w")  # noqa: SIM115 (faulthandler writes to its fd)
        # a thread of C, not of Python: it dumps even if the main thread holds the GIL
        faulthandler.dump_traceback_later(at, file=self._file)
        self._timers = [threading.Timer(at + 0.1, describe_stuck, (self.stuck,)),
                        threading.Timer(timeout_s + GRACE_S, self._end, (folder,))]  # fmt: skip
        for t in self._timers:
            t.daemon = True
            t.start()

    def _end(self, folder: Path) -> None:
        with contextlib.suppress(Exception):
            describe_stuck(self.stuck)
        (folder / "exit_code").write_text("124\n")
        print(f"lab part {folder.name}: not ended {GRACE_S} s after its limit: the "
              "interpreter ends", file=sys.__stderr__, flush=True)  # fmt: skip
        os._exit(124)

    def cancel(self) -> None:
        faulthandler.cancel_dump_traceback_later()
        for t in self._timers:
            t.cancel()
        self._file.close()
        if self.stuck.stat().st_size == 0:
            self.stuck.unlink()


def run_part(argv: list[str], folder: Path, timeout_s: int) -> int:
    """One part, its output in ``folder/output``: its exit code."""
    watch = _Watch(folder, timeout_s)
    try:
        return _run_part(argv, folder, timeout_s)
    finally:
        watch.cancel()


def _run_part(argv: list[str], folder: Path, timeout_s: int) -> int:
    env, argv = split_env(argv)
    with open(folder / "output", "wb") as out:
        if not in_process(argv):
            try:
                done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT,
                                      env={**os.environ, **env}, timeout=timeout_s)  # fmt: skip
            except subprocess.TimeoutExpired:
                return 124
            return done.returncode
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.alarm(timeout_s)
        try:
            return run_here(argv, env)
        except _PastLimit:
            return 124
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def main(spec_path: str) -> int:
    code = 0
    for part in json.loads(Path(spec_path).read_text()):
        folder = Path(part["folder"])
        began = time.monotonic()
        code = run_part(part["argv"], folder, int(part["timeout_s"]))
        (folder / "exit_code").write_text(f"{code}\n")
        # on the console: where the lab's minutes go, part by part
        print(f"lab part {folder.name}: exit {code} after {time.monotonic() - began:.1f} s "
              f"(guest uptime {time.clock_gettime(time.CLOCK_BOOTTIME):.1f} s)",
              file=sys.stderr, flush=True)  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
