"""The tests of test_environment.py that need root and BPF (the main lane): THP, the CPUs
and the page cache seen from inside a collected benchmark, after a failure and Ctrl+C;
apart from the others so that those run beside it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from kernmlops.host.cpus import online_cpus
from kernmlops.host.environment import (
    cached_bytes,
    read_thp_mode,
)
from tests.e2e.conftest import only_collection
from tests.host.test_environment import _REPORT, _collect, _other_mode, _seen, needs_thp


@pytest.mark.bpf
@needs_thp
@pytest.mark.skipif(len(online_cpus()) < 2, reason="needs 2 CPUs")
def test_thp_cpus_and_page_cache_during_and_after_a_failing_run(tmp_path: Path) -> None:
    before, mode = read_thp_mode(), _other_mode()
    # 64 MiB of cached file pages that the drop must take away
    data = tmp_path / "warm.bin"
    data.write_bytes(os.urandom(64 << 20))
    data.read_bytes()
    cached_before = cached_bytes()
    cpu = online_cpus()[-1]
    proc = _collect(
        tmp_path,
        {"transparent_hugepages": mode, "cpus": str(cpu), "drop_page_cache": True},
        "sh", "-c", _REPORT + "; exit 3",
    )  # fmt: skip
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 3, err  # the benchmark's failure is the command's
    seen = _seen(out)
    assert f"[{mode}]" in seen["thp"]  # during the run
    assert seen["cpus"] == str(cpu)
    assert read_thp_mode() == before  # after it, although it failed
    assert cached_before is not None
    assert int(seen["cached_kib"]) * 1024 < cached_before - (32 << 20)
    env = only_collection(tmp_path / "out").manifest.benchmark.environment
    assert env["transparent_hugepages"] == {"set": mode, "was": before, "restored": before}
    page = env["page_cache"]
    assert page["dropped"] and page["cached_bytes_after"] < page["cached_bytes_before"] - (32 << 20)
    assert env["cpus"]["cpus"] == str(cpu) and env["cpus"]["method"] in ("cpuset", "affinity")


@pytest.mark.bpf
@needs_thp
def test_thp_is_restored_after_ctrl_c_and_a_count_of_cpus(tmp_path: Path) -> None:
    before, mode = read_thp_mode(), _other_mode()
    proc = _collect(
        tmp_path, {"transparent_hugepages": mode, "cpus": 1},
        "sh", "-c", _REPORT + "; exec sleep 60",
    )  # fmt: skip
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]  # the benchmark is running
    assert read_thp_mode() == mode
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert read_thp_mode() == before
    seen = _seen("".join(lines) + out)
    assert seen["cpus"] == str(online_cpus()[0])
    env = only_collection(tmp_path / "out").manifest.benchmark.environment
    assert env["transparent_hugepages"]["restored"] == before and "page_cache" not in env
