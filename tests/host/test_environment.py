"""The benchmark's environment: THP set for the run and restored (after a failure and
Ctrl+C too), the page cache dropped first, the benchmark kept on benchmark.cpus; each
checked from inside the benchmark (/sys, /proc/meminfo, /proc/self/status) and in the
manifest (those collections: test_environment_bpf.py); here the CPU list, the readers,
bad CPUs refused before anything runs and a cpuset made for running processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kernmlops.errors import BenchmarkError
from kernmlops.host.cpus import online_cpus
from kernmlops.host.environment import (
    THP_ENABLED,
    CpuLimit,
    _cpuset_v1_root,
    cached_bytes,
    read_thp_mode,
    resolve_cpus,
)
from tests.e2e.conftest import KERNMLOPS

needs_thp = pytest.mark.skipif(read_thp_mode() is None, reason="no transparent huge pages")


def test_resolve_cpus() -> None:
    assert resolve_cpus(None, [0, 1, 2]) is None
    assert resolve_cpus(0, [0, 1, 2]) is None
    assert resolve_cpus(2, [0, 2, 5]) == [0, 2]
    assert resolve_cpus("0,2-3", [0, 1, 2, 3]) == [0, 2, 3]
    with pytest.raises(BenchmarkError, match="3 CPUs asked for, 2 online"):
        resolve_cpus(3, [0, 1])
    with pytest.raises(BenchmarkError, match=r"CPU\(s\) 7 not online"):
        resolve_cpus("0,7", [0, 1])
    with pytest.raises(BenchmarkError, match="not a CPU count or list"):
        resolve_cpus("two", [0, 1])


def test_readers(tmp_path: Path) -> None:
    (tmp_path / "enabled").write_text("always madvise [never]\n")
    assert read_thp_mode(tmp_path / "enabled") == "never"
    assert read_thp_mode(tmp_path / "absent") is None
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nCached:   2048 kB\n")
    assert cached_bytes(tmp_path / "meminfo") == 2048 * 1024


def _other_mode() -> str:
    return "never" if read_thp_mode() != "never" else "madvise"


def _collect(tmp_path: Path, bench: dict, *command: str) -> subprocess.Popen[str]:
    cfg = tmp_path / "env.yaml"
    cfg.write_text(yaml.safe_dump({"benchmark": bench}))
    return subprocess.Popen(
        [*KERNMLOPS, "collect", "--no-progress", "-o", str(tmp_path / "out"), "-c", str(cfg),
         "--hooks", "process_trace", "--", *command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


# What the benchmark sees, printed as key=value lines.
_REPORT = (
    f"echo thp=$(cat {THP_ENABLED});"
    " echo cpus=$(sed -n 's/^Cpus_allowed_list:\\s*//p' /proc/self/status);"
    " echo cached_kib=$(sed -n 's/^Cached:\\s*\\([0-9]*\\) kB/\\1/p' /proc/meminfo)"
)


def _seen(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def test_bad_cpus_fail_before_anything_runs(tmp_path: Path) -> None:
    cfg = tmp_path / "env.yaml"
    cfg.write_text(yaml.safe_dump({"benchmark": {"cpus": 4096}}))
    proc = subprocess.run(
        [sys.executable, "-m", "kernmlops", "collect", "-o", str(tmp_path / "out"),
         "-c", str(cfg), "--", "touch", str(tmp_path / "ran")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "benchmark.cpus: 4096 CPUs asked for" in proc.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.skipif(
    os.geteuid() != 0 or _cpuset_v1_root() is None or len(online_cpus()) < 2,
    reason="needs root, a cgroup v1 cpuset hierarchy and 2 CPUs",
)
def test_a_cpuset_made_here_moves_its_running_processes() -> None:
    limit = CpuLimit([0])
    assert limit.own_cpuset and limit.method == "cpuset"
    proc = subprocess.Popen(["sleep", "30"])
    try:
        limit.add(proc.pid)

        def allowed() -> str:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list"):
                    return line.split()[1]
            raise AssertionError("no Cpus_allowed_list")

        assert allowed() == "0"
        for want in ("1", "0", "1"):  # the same open file, written again and again
            assert limit.move({int(want)})
            assert allowed() == want and limit.cpus == [int(want)]
    finally:
        proc.kill()
        proc.wait()
        path = limit.path
        limit.close()
    assert path is not None and not path.exists()
    assert not limit.own_cpuset and not limit.move([0])  # closed: nothing to move
