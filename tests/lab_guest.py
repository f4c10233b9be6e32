"""Runs in the kernel lab (tests/lab.py): every part of the boot in one interpreter.

Under QEMU without KVM a Python start that imports the collector's stack (polars,
numpy, pyarrow) costs 40-60 s, and the guest caches nothing of the host's files
between processes: a part whose command is this Python (``python -m MODULE ...`` or
``python SCRIPT ...``, after ``env VAR=value ...``) runs here, in this process, as
runpy runs it, with its ``sys.argv`` and environment; any other command runs as a
child. Each part's output (fds 1 and 2) goes to ``FOLDER/output`` and its exit code
(124: past its time limit) to ``FOLDER/exit_code``; the process exits with the last
part's exit code.

    python lab_guest.py SPEC.json   # [{"argv": [...], "folder": "...", "timeout_s": N}, ...]
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path


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


def run_part(argv: list[str], folder: Path, timeout_s: int) -> int:
    """One part, its output in ``folder/output``: its exit code."""
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
