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
    run = start_collect(tmp_path / "out", "-d", "2", "--", "sh", "-c", script)
    code, err = run.finish(timeout_s=60)
    assert code == 0, err
    assert_no_benchmark_left(run.marker)
    manifest = read_manifest(run.collection())
    assert manifest.state == "duration"
    cgroup = manifest.benchmark.cgroup
    assert cgroup and cgroup.startswith("/") and "kernmlops-" in cgroup
    # the cgroup is gone with its processes
    from kernmlops.collect.cgroup import cgroup2_mount

    assert not (cgroup2_mount() / cgroup.lstrip("/")).exists()


def test_benchmark_that_ends_leaves_nothing(tmp_path: Path, bpf_baseline) -> None:
    """The main process exits at once; what it left behind is ended too."""
    run = start_collect(tmp_path / "out", "--", "sh", "-c", "setsid sleep 31 & exit 0")
    code, err = run.finish(timeout_s=60)
    assert code == 0, err
    assert not pids_matching(run.marker)
    assert read_manifest(run.collection()).state == "completed"
