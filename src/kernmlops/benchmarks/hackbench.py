"""hackbench (rt-tests): groups of senders and receivers passing messages over
sockets or pipes, as processes or threads: a scheduler and wake-up storm.

Each group has ``fds`` senders and ``fds`` receivers; every sender writes
``loops`` messages to every receiver of its group, so a run passes
groups x fds x fds x loops messages. hackbench's "Time: X" becomes the
benchmark_result table, with the message rate derived from it. A run stopped
before it was done (the collection's duration, Ctrl+C) still prints a Time and
exits 0, having passed fewer messages: its results are the time alone.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from kernmlops.benchmarks._tools import require_tool
from kernmlops.benchmarks.base import (
    Benchmark,
    BenchmarkOptions,
    BenchmarkRun,
    Launch,
    result_frame,
)
from kernmlops.errors import BenchmarkError
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy_import("polars")


HACKBENCH = "hackbench"
_TIME = re.compile(r"^Time:\s*([0-9.]+)\s*$", re.MULTILINE)
#: hackbench's own counts: "... with G groups using F file descriptors each (== T tasks)"
#: (F is the senders plus the receivers of a group) and "Each sender will pass N messages"
_GROUPS = re.compile(r"with (\d+) groups using (\d+) file descriptors each", re.MULTILINE)
_LOOPS = re.compile(r"^Each sender will pass (\d+) messages", re.MULTILINE)
#: what hackbench prints (to stderr) when a signal ends it before its messages are passed
_STOPPED = re.compile(r"^Signal \d+ caught", re.MULTILINE)
#: hackbench reads its counts into a C int: a larger one wraps (10**22 is -1: endless)
INT_MAX = (1 << 31) - 1
# Short options only: hackbench 2.4 misparses some mixes of long ones
# ("--loops=1 --datasize=100 --process" says --loops needs an integer).
IPC_FLAGS = {"socket": [], "pipe": ["-p"], "inet": ["-i"]}
MODE_FLAGS = {"process": ["-P"], "thread": ["-T"]}


class HackbenchOptions(BenchmarkOptions):
    groups: int = Field(10, ge=1, le=1000, description="groups of senders and receivers")
    loops: int = Field(
        100, ge=1, le=INT_MAX, description="messages each sender sends each receiver"
    )
    fds: int = Field(20, ge=1, le=1000, description="senders (and receivers) per group")
    datasize: int = Field(100, ge=1, le=1 << 20, description="bytes per message")
    ipc: Literal["socket", "pipe", "inet"] = Field(
        "socket", description="socket: UNIX socket pairs; pipe: pipes; inet: TCP on loopback"
    )
    mode: Literal["process", "thread"] = Field(
        "process", description="senders and receivers as processes (fork) or threads"
    )
    extra_args: list[str] = Field(
        default_factory=list, description="more hackbench arguments, appended as given"
    )


class HackbenchBenchmark(Benchmark[HackbenchOptions]):
    """Runs hackbench once."""

    name: ClassVar[str] = "hackbench"
    default_filter: ClassVar[str] = "tree"

    def check(self) -> None:
        require_tool("hackbench", HACKBENCH, "apt-get install rt-tests")

    def messages(self) -> int:
        """Messages one run passes in total."""
        o = self.options
        return o.groups * o.fds * o.fds * o.loops

    def tasks(self) -> int:
        """Senders plus receivers."""
        return 2 * self.options.groups * self.options.fds

    def launch(self) -> Launch | None:
        o = self.options
        argv = [
            HACKBENCH,
            "-g", str(o.groups),
            "-l", str(o.loops),
            "-f", str(o.fds),
            "-s", str(o.datasize),
            *IPC_FLAGS[o.ipc],
            *MODE_FLAGS[o.mode],
            *o.extra_args,
        ]  # fmt: skip
        return Launch(argv=argv, capture_output=True)

    def results(self, run: BenchmarkRun) -> pl.DataFrame | None:
        if run.stdout_path is None:
            return None
        text = run.stdout_path.read_text(errors="replace")
        seconds = parse_time(text)
        if seconds is None:
            # a signal before the messages were kicked off: no Time, exit 0 all the same
            if run.exit_code == 0 and not stopped(run):
                raise BenchmarkError("hackbench: exited 0 but printed no 'Time:' line")
            return None
        # hackbench's own counts: extra_args may repeat -g, -f or -l (the last one wins)
        counts = parse_counts(text)
        tasks, messages = counts if counts else (self.tasks(), self.messages())
        rows = [
            ("hackbench", "time_s", seconds, "s"),
            ("hackbench", "tasks", float(tasks), "tasks"),
        ]
        if stopped(run):
            return result_frame(rows)  # fewer messages than asked: no count, no rate
        rows.append(("hackbench", "messages", float(messages), "messages"))
        if seconds > 0:
            rows.append(("hackbench", "messages_per_s", messages / seconds, "1/s"))
        return result_frame(rows)


def stopped(run: BenchmarkRun) -> bool:
    """Whether a signal ended hackbench before it passed all its messages (it says so
    on stderr, and exits 0 all the same)."""
    for path in (run.stderr_path, run.stdout_path):
        if path is not None and path.exists() and _STOPPED.search(path.read_text(errors="replace")):
            return True
    return False


def parse_counts(text: str) -> tuple[int, int] | None:
    """(tasks, messages) of the run as hackbench announced it, or None: a group of F
    descriptors is F/2 senders, each passing N messages to each of F/2 receivers."""
    groups, loops = _GROUPS.search(text), _LOOPS.search(text)
    if groups is None or loops is None:
        return None
    g, f, n = int(groups.group(1)), int(groups.group(2)), int(loops.group(1))
    return g * f, g * (f // 2) * (f // 2) * n


def parse_time(text: str) -> float | None:
    """The seconds of hackbench's last "Time: X" line, or None."""
    found = _TIME.findall(text)
    return float(found[-1]) if found else None
