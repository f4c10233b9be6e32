"""A benchmark that leaves its session, process group or parent stays contained."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernmlops.collect.manifest import read_manifest
from tests.faults.conftest import assert_no_benchmark_left, pids_matching, start_collect

pytestmark = pytest.mark.bpf


@pytest.mark.parametrize(
    "script",
    [
        "setsid sleep 27 & sleep 30",  # a new session
        "(setsid sh -c 'sleep 28 &' &); sleep 30",  # a double-forked daemon
        "setsid sh -c 'trap \"\" TERM; sleep 29' & sleep 30",  # ignores SIGTERM
    ],
)
def test_escapees_are_stopped(tmp_path: Path, bpf_baseline, script: str) -> None:
    run = start_collect(tmp_path / "out", "-d", "1", "--", "sh", "-c", script)
    code, err = run.finish(timeout_s=60)
    assert code == 0, err
    assert_no_benchmark_left(run.marker)
    manifest = read_manifest(run.collection())
    assert manifest.state == "duration"
    cgroup = manifest.benchmark.cgroup
    assert cgroup and cgroup.startswith("/") and "kernmlops-" in cgroup
    # the cgroup is gone with its processes
    from kernmlops.host.cgroup import cgroup2_mount

    assert not (cgroup2_mount() / cgroup.lstrip("/")).exists()


def test_benchmark_that_ends_leaves_nothing(tmp_path: Path, bpf_baseline) -> None:
    """The main process exits at once; what it left behind is ended too."""
    run = start_collect(tmp_path / "out", "--", "sh", "-c", "setsid sleep 31 & exit 0")
    code, err = run.finish(timeout_s=60)
    assert code == 0, err
    assert not pids_matching(run.marker)
    assert read_manifest(run.collection()).state == "completed"


REDIS = "benchmark:\n  redis:\n    tests: [set]\n    requests: 50000000\n    clients: 4\n"


def test_a_server_started_in_setup_dies_with_a_killed_collector(
    tmp_path: Path, bpf_baseline
) -> None:
    """redis-server is started before the probes attach (setup()); a SIGKILLed
    collector's watchdog ends it with the client."""
    from tests.faults.conftest import kill_collector

    run = start_collect(tmp_path / "out", "-b", "redis", more_config=REDIS)
    run.wait_for("probes attached")
    import psutil

    from tests.faults.conftest import wait_until

    def started() -> list[psutil.Process]:
        return psutil.Process(run.proc.pid).children(recursive=True)

    # The client execs once the gate opens, just after "probes attached". (redis-server
    # rewrites its title over its environment: it is found as the collector's child.)
    assert wait_until(lambda: {"redis-server", "redis-benchmark"} <= {p.name() for p in started()})
    seen = started()
    kill_collector(run)
    assert_no_benchmark_left(run.marker)
    _, alive = psutil.wait_procs(seen, timeout=10)
    assert not alive, alive


def test_a_service_that_daemonises_is_ended_with_the_collection(tmp_path: Path) -> None:
    """Benchmark.start_service: what the service forks into a new session stays in its
    cgroup and ends at stop_services()."""
    import os
    import subprocess

    from kernmlops.benchmarks.faux import FauxBenchmark

    marker = f"kmofault-svc-{os.getpid()}"
    os.environ["KMO_FAULT_MARKER"] = marker
    try:
        bench = FauxBenchmark(FauxBenchmark.Options())
        server = bench.start_service(
            ["sh", "-c", "setsid sh -c 'trap \"\" TERM; sleep 61' & exec sleep 62"],
            stdout=subprocess.DEVNULL,
        )
    finally:
        del os.environ["KMO_FAULT_MARKER"]
    from tests.faults.conftest import wait_until

    [box] = bench.__dict__["_services"]
    folder = box.path
    assert folder is not None
    # the service and the session it left (dash may exec its last command)
    assert wait_until(lambda: len(box.pids()) >= 2)
    assert set(box.pids()) <= set(pids_matching(marker))  # (its watchdog is outside)
    bench.stop_services()
    assert server.wait(timeout=10) == -9
    assert_no_benchmark_left(marker)
    assert not folder.exists()  # the cgroup is removed with its processes
    bench.stop_services()  # idempotent
