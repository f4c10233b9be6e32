"""Helpers for benchmark tests that run the real `kernmlops collect` (root + BPF):
a run with overrides, and a run stopped with SIGINT that records every process
the collector started so the test can prove they are all gone."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import psutil
import yaml

from kernmlops.data import Collection
from tests.e2e.conftest import KERNMLOPS, only_collection, run_collect


def write_overrides(tmp_path: Path, benchmark: str, options: dict[str, Any]) -> Path:
    path = tmp_path / "overrides.yaml"
    key = benchmark.replace("-", "_")
    path.write_text(yaml.safe_dump({"benchmark": {key: options}}))
    return path


def collect(
    tmp_path: Path, benchmark: str, options: dict[str, Any], *args: str
) -> tuple[subprocess.CompletedProcess[str], Collection]:
    """`kernmlops collect -b BENCHMARK -c overrides.yaml ARGS` into tmp_path/out."""
    overrides = write_overrides(tmp_path, benchmark, options)
    proc, col = run_collect(tmp_path / "out", "-b", benchmark, "-c", str(overrides), *args)
    assert col is not None, proc.stdout + proc.stderr
    return proc, col


def results(col: Collection) -> dict[tuple[str, str], float]:
    """benchmark_result as {(key, metric): value}."""
    frame = col["benchmark_result"]
    return {(k, m): v for k, m, v in frame.select("key", "metric", "value").iter_rows()}


def execs(col: Collection, comm: str) -> pl.DataFrame:
    pt = col["process_trace"]
    return pt.filter((pl.col("kind") == "exec") & (pl.col("comm") == comm))


@dataclass
class Interrupted:
    returncode: int
    collection: Collection | None
    #: (pid, create_time) -> last name, of every descendant of the collector seen
    seen: dict[tuple[int, float], str] = field(default_factory=dict)
    #: what the probe returned for each process seen (e.g. cwd, cmdline)
    facts: dict[int, Any] = field(default_factory=dict)
    started: float = 0.0


def collect_and_interrupt(
    tmp_path: Path,
    benchmark: str,
    options: dict[str, Any],
    running: str,
    *,
    after_s: float = 0.7,
    probe: Callable[[psutil.Process], Any] | None = None,
    timeout_s: float = 60,
) -> Interrupted:
    """Start a collection, wait until a process named ``running`` works under
    the collector for ``after_s``, send the collector SIGINT, and return what
    was seen. ``probe(process)`` is kept per pid (e.g. a server's cwd)."""
    overrides = write_overrides(tmp_path, benchmark, options)
    out = tmp_path / "out"
    started = time.time()
    log = (tmp_path / "collect.log").open("w")
    collector = subprocess.Popen(
        [*KERNMLOPS, "collect", "--no-progress", "-o", str(out), "-b", benchmark,
         "-c", str(overrides)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    seen: dict[tuple[int, float], str] = {}
    facts: dict[int, Any] = {}
    parent = psutil.Process(collector.pid)
    deadline = time.monotonic() + timeout_s
    running_since: float | None = None
    try:
        while time.monotonic() < deadline and collector.poll() is None:
            try:
                children = parent.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for child in children:
                try:
                    # Always the latest name: the gate shell becomes the benchmark
                    # by exec, keeping its pid and start time.
                    seen[(child.pid, child.create_time())] = child.name()
                    # Until it answers: a shell that execs the process comes first.
                    if probe is not None and facts.get(child.pid) is None:
                        facts[child.pid] = probe(child)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            if running_since is None and running in seen.values():
                running_since = time.monotonic()
            if running_since is not None and time.monotonic() - running_since >= after_s:
                break
            time.sleep(0.05)
        assert running_since is not None, (
            f"{running} never ran: " + (tmp_path / "collect.log").read_text()
        )
        collector.send_signal(signal.SIGINT)
        code = collector.wait(timeout=timeout_s)
    finally:
        if collector.poll() is None:  # a failed wait: let it clean up, then insist
            collector.send_signal(signal.SIGINT)
            try:
                collector.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                collector.kill()
                collector.wait()
        log.close()
    return Interrupted(code, only_collection(out), seen, facts, started)


def leftovers(run: Interrupted, names: set[str]) -> list[str]:
    """Processes of the run still alive: any seen descendant, and any process
    named in ``names`` started since the run began (children forked at the
    last moment are caught by the second rule)."""
    alive: list[str] = []
    for (pid, created), name in run.seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{name}[{pid}]")
        except psutil.NoSuchProcess:
            continue
    for p in psutil.process_iter(["name", "create_time", "status"]):
        info = p.info
        if (
            info["name"] in names
            and info["create_time"] >= run.started - 1
            and info["status"] != psutil.STATUS_ZOMBIE
        ):
            alive.append(f"{info['name']}[{p.pid}]")
    return sorted(set(alive))
