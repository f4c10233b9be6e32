"""The kernel lab's runner of parts (tests/lab_guest.py), here on the host: this
Python's parts in its own interpreter, others as children, each part's output, exit
code and time limit its own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab_guest import in_process, split_env

# Quiet (tests/lanes.py): the runner's watch acts at fixed times (stuck.txt at half a
# part's 3-s limit, what the threads wait on over the next second, the end at the
# limit); at the idle lane's policy the part may not be asleep yet at 1.5 s, nor that
# second's look done by 3 s.
pytestmark = pytest.mark.quiet

GUEST = Path(__file__).resolve().parents[1] / "lab_guest.py"


def test_env_and_which_parts_run_in_process() -> None:
    assert split_env(["env", "A=1", "B=x=y", sys.executable, "s.py"]) == (
        {"A": "1", "B": "x=y"},
        [sys.executable, "s.py"],
    )
    assert split_env(["sh", "-c", "A=1"]) == ({}, ["sh", "-c", "A=1"])
    assert in_process([sys.executable, "-m", "kernmlops.lb", "shadow"])
    assert in_process([sys.executable, "driver.py", "out"])
    assert not in_process([sys.executable, "-c", "pass"])
    assert not in_process(["python0", "driver.py"]) and not in_process(["sh", "-c", "true"])


def test_parts_share_one_interpreter_and_keep_their_own_output_and_codes(tmp_path: Path) -> None:
    script = tmp_path / "part.py"
    script.write_text(
        "import os, sys, kernmlops\n"
        "print('pid', os.getpid(), sys.argv[1:], os.environ['MARK'], flush=True)\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    parts = {
        "a": (["env", "MARK=one", sys.executable, str(script), "3"], 60),
        "b": ([sys.executable, str(script), "0"], 60),
        "m": ([sys.executable, "-m", "kernmlops.lb", "--help"], 60),
        "boom": ([sys.executable, "-m", "no_such_module_here"], 60),
        "sh": (["sh", "-c", "echo from sh; exit 7"], 60),
        "hang": ([sys.executable, str(tmp_path / "hang.py")], 3),
    }
    (tmp_path / "hang.py").write_text("import time\nprint('waiting', flush=True)\ntime.sleep(30)\n")
    spec = []
    for name, (argv, limit) in parts.items():
        (tmp_path / name).mkdir()
        spec.append({"argv": argv, "folder": str(tmp_path / name), "timeout_s": limit})
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, str(GUEST), str(tmp_path / "spec.json")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    code = {n: int((tmp_path / n / "exit_code").read_text()) for n in parts}
    out = {n: (tmp_path / n / "output").read_text() for n in parts}
    assert code == {"a": 3, "b": 0, "m": 0, "boom": 1, "sh": 7, "hang": 124}, out
    assert done.returncode == 124 and done.stdout == "", done.stderr
    assert out["a"].split()[1] == out["b"].split()[1]  # one interpreter, one pid
    assert "['3'] one" in out["a"] and "['0'] one" in out["b"]  # the env set stays set
    assert "Usage: kernmlops lb" in out["m"]
    assert "No module named no_such_module_here" in out["boom"]
    assert out["sh"] == "from sh\n" and out["hang"] == "waiting\n"
    # the part still running at half its limit left what it waited on; none other did
    assert [n for n in parts if (tmp_path / n / "stuck.txt").exists()] == ["hang"]
    stuck = (tmp_path / "hang" / "stuck.txt").read_text()
    assert f'File "{tmp_path / "hang.py"}", line 3 in <module>' in stuck, stuck  # Python's
    # the kernel's: the main thread sleeps in the part's time.sleep, its stack shown
    assert re.search(r"/proc/self/task/\d+: \S+ S \(sleeping\) wchan=\w*nanosleep\n"
                     r"    \[<0>\] \w*nanosleep", stuck), stuck  # fmt: skip
    assert "-- the busiest tasks over 1 s" in stuck
