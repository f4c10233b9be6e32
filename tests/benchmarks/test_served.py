"""The throw-away server of memcached's and redis's benchmarks (LocalServer): what a
server that dies, never answers or answers says, and that stopping it ends it."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import psutil
import pytest

from kernmlops.benchmarks._served import HOST, LocalServer
from kernmlops.benchmarks.faux import FauxBenchmark
from kernmlops.errors import BenchmarkError


def test_a_server_that_exits_is_named_with_its_status_and_its_last_words(tmp_path: Path) -> None:
    served = LocalServer(FauxBenchmark(), "sh")
    argv = ["sh", "-c", "echo starting; echo 'cannot bind: in use' >&2; exit 3"]
    with pytest.raises(BenchmarkError) as err:
        served.start(argv, cwd=tmp_path, log=tmp_path / "log", answers=lambda: False,
                     question="hello", timeout_s=60)  # fmt: skip
    assert str(err.value) == (
        "faux: sh exited with status 3 before answering: starting | cannot bind: in use"
    )
    served.stop()
    assert served.proc is None and served.pids() == []


def test_a_server_that_never_answers_is_given_up_after_the_timeout(tmp_path: Path) -> None:
    served = LocalServer(FauxBenchmark(), "sleep")
    try:
        with pytest.raises(BenchmarkError, match=r"faux: sleep did not answer hello on "
                           rf"{HOST}:\d+ within 0.3 s: \(no output\)"):  # fmt: skip
            served.start(["sleep", "30"], cwd=tmp_path, log=tmp_path / "log",
                         answers=lambda: False, question="hello", timeout_s=0.3)  # fmt: skip
        pid = served.proc.pid if served.proc else -1
        assert served.pids() == [pid]
    finally:
        served.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_server_is_up_once_it_answers_on_its_port_and_polite_stop_comes_first(
    tmp_path: Path,
) -> None:
    served = LocalServer(FauxBenchmark(), "python3")
    server = (f"import socket; s=socket.socket(); s.bind(('{HOST}', {served.port})); "
              "s.listen(); print('listening', flush=True)\n"
              "while s.accept()[0].recv(9) != b'bye': pass\n"
              "print('told to stop', flush=True)")  # fmt: skip

    def answers() -> bool:
        with socket.create_connection((HOST, served.port), timeout=0.5):
            return True

    said: list[str] = []

    def polite() -> None:
        said.append("bye")
        with socket.create_connection((HOST, served.port), timeout=0.5) as c:
            c.sendall(b"bye")
        # until it said so: stop() waits 5 s for the exit, which a starved server (in
        # CI's idle lane) may need for the line alone
        deadline = time.monotonic() + 60
        while "told to stop" not in (tmp_path / "log").read_text():
            assert time.monotonic() < deadline, "the server never took the bye"
            time.sleep(0.02)

    served.start(["python3", "-c", server], cwd=tmp_path, log=tmp_path / "log",
                 answers=answers, question="a connection", timeout_s=60)  # fmt: skip
    pid = served.proc.pid if served.proc else -1
    assert served.pids() == [pid]
    served.stop(polite)
    assert said == ["bye"] and served.pids() == []
    assert (tmp_path / "log").read_text().split() == ["listening", "told", "to", "stop"]
