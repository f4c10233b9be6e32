"""The test run's two lanes (tests/lanes.py): which modules run beside the others, and
the lock that lets a quiet test run alone."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import run_order
from tests.lanes import hold, idle_policy


@dataclass
class Item:
    """What run_order reads of a pytest item."""

    nodeid: str
    marks: tuple[str, ...] = ()
    fixturenames: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> str | None:
        return name if name in self.marks else None


def test_modules_run_beside_only_without_bpf_quiet_spark_or_lab() -> None:
    items = [
        Item("tests/a.py::t1"),
        Item("tests/q.py::t1"),
        Item("tests/q.py::t2", marks=("quiet",)),
        Item("tests/b.py::t1", marks=("bpf",)),
        Item("tests/b.py::t2"),  # one bpf test: all of b.py one at a time
        Item("tests/lab.py::t1", fixturenames=("lab",)),
        Item("tests/s.py::t1", fixturenames=("spark",)),
        Item("tests/c.py::t1"),
        Item("tests/c.py::t2"),
        Item("tests/b2.py::t1"),
        Item("tests/b2.py::t2", marks=("bpf", "quiet")),
    ]
    beside, alone = run_order(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in beside] == ["tests/a.py::t1", "tests/c.py::t1", "tests/c.py::t2"]
    # bpf and Spark in their order, then the lab's, then the quiet modules, whole
    assert [i.nodeid for i in alone] == [
        "tests/b.py::t1", "tests/b.py::t2", "tests/s.py::t1", "tests/lab.py::t1",
        "tests/q.py::t1", "tests/q.py::t2", "tests/b2.py::t1", "tests/b2.py::t2",
    ]  # fmt: skip


def _flocks(path: Path) -> list[str]:
    """/proc/locks' lines of this process's flocks on ``path``: held, or waited for
    ("->"). By inode number alone: on overlayfs the device shown is the layer's."""
    inode, pid = f":{path.stat().st_ino} ", f" {os.getpid()} "
    return [ln for ln in Path("/proc/locks").read_text().splitlines() if inode in ln and pid in ln]


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_quiet_test_waits_for_the_running_one_and_no_other_starts_meanwhile(
    tmp_path: Path,
) -> None:
    # Each step waits for the one before as the kernel shows it (/proc/locks), not for
    # a fixed time: in CI's idle lane a thread may get no CPU for seconds.
    prefix = tmp_path / "lanes"
    events: list[str] = []
    first_in, let_go = threading.Event(), threading.Event()

    def idle(name: str, release: threading.Event | None) -> None:
        with hold(prefix, alone=False):
            events.append(f"{name} in")
            first_in.set()
            if release is not None:
                assert release.wait(60)
            events.append(f"{name} out")

    def quiet() -> None:
        with hold(prefix, alone=True):
            events.append("quiet in")
            time.sleep(0.2)
            events.append("quiet out")

    running = threading.Thread(target=idle, args=("idle-1", let_go))
    running.start()
    assert first_in.wait(60)
    turn, lock = prefix.with_suffix(".turn"), prefix.with_suffix(".lock")
    waiting = threading.Thread(target=quiet)
    waiting.start()
    # the quiet test holds the turnstile and waits for idle-1's shared lock
    _until(lambda: any("->" in ln for ln in _flocks(lock)), "the quiet test waiting")
    assert [ln for ln in _flocks(turn) if "->" not in ln]
    later = threading.Thread(target=idle, args=("idle-2", None))
    later.start()
    _until(lambda: any("->" in ln for ln in _flocks(turn)), "idle-2 at the turnstile")
    let_go.set()
    for thread in (running, waiting, later):
        thread.join(60)
    assert events == ["idle-1 in", "idle-1 out", "quiet in", "quiet out", "idle-2 in", "idle-2 out"]


def test_idle_tests_share_the_lock(tmp_path: Path) -> None:
    prefix = tmp_path / "lanes"
    with hold(prefix, alone=False):
        done = threading.Event()

        def other() -> None:
            with hold(prefix, alone=False):
                done.set()

        thread = threading.Thread(target=other)
        thread.start()
        assert done.wait(60), "a second idle test waited for the first"
        thread.join()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE")
def test_the_idle_policy_is_the_kernels_and_children_keep_it() -> None:
    import subprocess
    import sys

    code = "import os; print(os.sched_getscheduler(0))"
    out = subprocess.run(
        [sys.executable, "-c", code], preexec_fn=idle_policy, capture_output=True, text=True
    )
    assert int(out.stdout) == os.SCHED_IDLE
    stat = subprocess.run(
        ["sh", "-c", "cat /proc/self/stat"], preexec_fn=idle_policy, capture_output=True, text=True
    ).stdout
    # field 41, the policy, after the command's parenthesised name: 5 is SCHED_IDLE
    assert int(stat.rpartition(")")[2].split()[38]) == os.SCHED_IDLE == 5


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroups")
def test_a_lanes_session_weighs_as_nice_19() -> None:
    import subprocess

    from tests.lanes import IDLE_SESSION

    said = subprocess.run(
        ["setsid", "--wait", "sh", "-c", f"{IDLE_SESSION}cat /proc/self/autogroup"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert said.split()[-2:] == ["nice", "19"], said
