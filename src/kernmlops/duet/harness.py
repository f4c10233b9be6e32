"""The built-in harness: time each execution of any command.

    python -m kernmlops.duet.harness --iterations 50 -- ./app arg
    python -m kernmlops.duet.harness --budget 10 --output times.jsonl -- ./app

One row per iteration, written and flushed as soon as the iteration ends (a
timeout or a kill keeps every finished iteration):

    iteration, iteration_start_ns, iteration_end_ns, iteration_time_ns,
    epoch_start_ms, exit_code

``iteration_start_ns``/``iteration_end_ns`` are CLOCK_MONOTONIC (shared by
every process on the machine, containers included, so the two sides of a duet
can be paired); ``epoch_start_ms`` is wall-clock time. The file is CSV, or
JSON lines when its name ends in ``.jsonl``/``.json``.

Sync-duet protocol (any harness can speak it): when the environment has
``KERNMLOPS_DUET_SYNC=<dir>`` (or ``--sync DIR`` is given), before iteration i
the harness writes ``ready <i>\\n`` to the FIFO ``<dir>/ready`` and reads one
line from the FIFO ``<dir>/go``: ``go`` runs the iteration, ``stop`` or end of
file ends the run. The duet runner answers ``go`` to both sides once both are
ready, so their iterations start together.

The harness also speaks asynchronous-duet's barrier (``--barrier NAME``, as
the Java agent's ``--iteration-barrier``): it waits on the shared-memory
barrier NAME before each iteration (kernmlops.duet.barrier), so a sync-duet
config written for the original (``syncduet_run_base: ... --barrier $$``) runs
with it unchanged.

A failing iteration (non-zero exit) is recorded and ends the run; the harness
then exits with that status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

SYNC_ENV = "KERNMLOPS_DUET_SYNC"
COLUMNS = (
    "iteration",
    "iteration_start_ns",
    "iteration_end_ns",
    "iteration_time_ns",
    "epoch_start_ms",
    "exit_code",
)


def _open_fifo(path: Path, mode: int) -> int:
    fd = os.open(path, mode | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a FIFO")
    return fd


class SyncClient:
    """The side's end of the sync-duet protocol."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        # The runner holds both FIFOs open read-write, so these opens never block.
        # Never created, truncated or reached through a link: only the runner's FIFOs.
        self._ready = os.fdopen(_open_fifo(folder / "ready", os.O_WRONLY), "w", buffering=1)
        self._go = os.fdopen(_open_fifo(folder / "go", os.O_RDONLY), "r")

    def wait(self, iteration: int) -> bool:
        """Tell the runner we are ready; True when it says go."""
        try:
            self._ready.write(f"ready {iteration}\n")
        except BrokenPipeError:
            return False
        line = self._go.readline()
        return line.strip() == "go"

    def close(self) -> None:
        for f in (self._ready, self._go):
            with contextlib.suppress(OSError):
                f.close()


class _Writer:
    def __init__(self, path: str | None) -> None:
        self.jsonl = bool(path) and str(path).endswith((".jsonl", ".json"))
        self.out: IO[str] = open(path, "w") if path else sys.stdout  # noqa: SIM115
        if not self.jsonl:
            self.out.write(",".join(COLUMNS) + "\n")
            self.out.flush()

    def row(self, values: tuple[int, ...]) -> None:
        if self.jsonl:
            self.out.write(json.dumps(dict(zip(COLUMNS, values, strict=True))) + "\n")
        else:
            self.out.write(",".join(str(v) for v in values) + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.out is not sys.stdout:
            self.out.close()


def run_harness(
    argv: list[str],
    *,
    iterations: int | None = None,
    budget_s: float | None = None,
    output: str | None = None,
    sync: str | None = None,
    barrier: str | None = None,
    quiet: bool = False,
) -> int:
    """Run ``argv`` repeatedly; return the exit status for the harness."""
    if not argv:
        raise ValueError("no command to time")
    if iterations is None and budget_s is None:
        raise ValueError("give --iterations, --budget or both")
    writer = _Writer(output)
    client = None
    shared = None
    try:
        client = SyncClient(sync) if sync else None
        if barrier:
            from kernmlops.duet.barrier import BarrierClient

            shared = BarrierClient(barrier)
    except (OSError, ValueError) as err:
        writer.close()
        if client is not None:
            client.close()
        what = f"barrier {barrier!r}" if client is not None or not sync else f"sync folder {sync}"
        print(f"harness: cannot use {what}: {err}", file=sys.stderr)
        return 2
    child: subprocess.Popen[bytes] | None = None
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)
        if child is not None and child.poll() is None:
            child.terminate()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    devnull = subprocess.DEVNULL if quiet else None
    status = 0
    t0 = time.monotonic_ns()
    i = 0
    try:
        while not stopping:
            if iterations is not None and i >= iterations:
                break
            if budget_s is not None and time.monotonic_ns() - t0 >= budget_s * 1e9:
                break
            if client is not None and not client.wait(i):
                break
            if shared is not None:
                shared.wait()
            epoch_ms = time.time_ns() // 1_000_000
            start = time.monotonic_ns()
            try:
                child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=devnull)
            except OSError as err:
                print(f"harness: cannot run {argv[0]!r}: {err.strerror}", file=sys.stderr)
                return 127
            code = child.wait()
            end = time.monotonic_ns()
            if stopping:  # interrupted mid-iteration: not a measurement
                break
            writer.row((i, start, end, end - start, epoch_ms, code))
            if code != 0:
                print(f"harness: iteration {i} exited with {code}", file=sys.stderr)
                status = 128 - code if code < 0 else code
                break
            i += 1
    finally:
        writer.close()
        if client is not None:
            client.close()
        if shared is not None:
            shared.close()
        for s, h in old.items():
            signal.signal(s, h)
    if stopping:
        return 128 + stopping[0]
    return status


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernmlops.duet.harness",
        description="Time each execution of a command (one CSV/JSON-lines row per iteration).",
    )
    parser.add_argument("--iterations", "-n", type=int, help="run the command this many times")
    parser.add_argument("--budget", "-b", type=float, help="run until this many seconds passed")
    parser.add_argument("--output", "-o", help="file to write (.csv, .jsonl); default stdout")
    parser.add_argument(
        "--sync", help=f"sync-duet folder with ready/go FIFOs (default: ${SYNC_ENV})"
    )
    parser.add_argument(
        "--barrier",
        help="wait on this asynchronous-duet barrier (shared memory) before each iteration",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="discard the command's stdout")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARG...")
    ns = parser.parse_args(args)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        parser.error("no command: give it after --, e.g. -- ./app arg")
    if ns.iterations is None and ns.budget is None:
        parser.error("give --iterations N, --budget SECONDS or both")
    if ns.iterations is not None and ns.iterations < 1:
        parser.error("--iterations must be at least 1")
    if ns.budget is not None and ns.budget <= 0:
        parser.error("--budget must be positive")
    sync = ns.sync or os.environ.get(SYNC_ENV) or None
    if ns.barrier:
        from kernmlops.duet.barrier import barrier_path

        try:
            path = barrier_path(ns.barrier)
        except ValueError as err:
            parser.error(str(err))
        if not path.exists():
            parser.error(f"no barrier {ns.barrier!r} ({path} does not exist)")
        sync = None  # the barrier syncs the sides
    return run_harness(
        command,
        iterations=ns.iterations,
        budget_s=ns.budget,
        output=ns.output,
        sync=sync,
        barrier=ns.barrier,
        quiet=ns.quiet,
    )


if __name__ == "__main__":
    sys.exit(main())
