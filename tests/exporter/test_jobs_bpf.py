"""Watching I/O jobs (root + BPF): biolatency's queue time against fio's own count
of completed I/Os, `--tgid` following a process tree (fio does its I/O in a
forked job process), and the biojobs set telling two concurrent jobs apart by
their cgroups. fio reads a loop device of the test's own, so the counts compare
request for request."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernmlops.exporter.decoders import cgroup2_mount
from tests.exporter.conftest import free_port, wait_serving
from tests.exporter.test_exporter_bpf import get, parse, total

pytestmark = pytest.mark.bpf

FILE_MB = 64


@pytest.fixture
def data_file() -> Iterator[Path]:
    """A loop device of its own (backed by memory, with the mq-deadline scheduler, so
    requests are inserted, then issued): only the test's fio reads reach it, while
    page-ins of fio itself, or anyone else's I/O, go to other disks."""
    losetup = shutil.which("losetup")
    assert losetup and shutil.which("fio"), "needs losetup (util-linux) and fio"
    backing = Path("/dev/shm") / f"kmo-jobs-test-{os.getpid()}.img"
    with backing.open("wb") as out:
        out.truncate(FILE_MB << 20)
    dev = subprocess.run([losetup, "--show", "-f", str(backing)], capture_output=True,
                         text=True, check=True).stdout.strip()  # fmt: skip
    try:
        Path(f"/sys/block/{Path(dev).name}/queue/scheduler").write_text("mq-deadline")
        yield Path(dev)
    finally:
        subprocess.run([losetup, "-d", dev], check=False)
        backing.unlink(missing_ok=True)


def fio_argv(path: Path, ios: int, name: str) -> list[str]:
    return ["fio", f"--name={name}", f"--filename={path}", "--rw=randread", "--bs=4k",
            "--direct=1", "--ioengine=psync", f"--size={FILE_MB}M", f"--number_ios={ios}",
            "--output-format=json"]  # fmt: skip


def gated(argv: list[str], cgroup: Path | None = None) -> subprocess.Popen:
    """A shell that waits for a line on stdin, then (in ``cgroup``) execs argv."""
    enter = f'echo $$ > "{cgroup}/cgroup.procs" && ' if cgroup else ""
    return subprocess.Popen(
        ["/bin/sh", "-c", f'read go && {enter}exec "$@"', "sh", *argv],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def start_exporter(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    log = tmp_path / f"exporter-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernmlops.exporter", "--listen", f"127.0.0.1:{port}", *args],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    wait_serving(proc, url, log)
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def fio_reads(stdout: str) -> int:
    """Completed reads as fio counts them (its JSON, after any warning lines)."""
    report = json.loads(stdout[stdout.index("{") :])
    return sum(job["read"]["total_ios"] for job in report["jobs"])


def test_queue_time_counts_every_read_of_a_forked_fio_job(tmp_path: Path, data_file: Path) -> None:
    job = gated(fio_argv(data_file, 3000, "kmo-q"))
    exporter, url = start_exporter(tmp_path, "-c", "biolatency", "--tgid", str(job.pid))
    try:
        disk = data_file.name
        before = parse(get(url))
        assert job.stdin is not None
        job.stdin.write("go\n")
        job.stdin.flush()
        out, _ = job.communicate(timeout=300)
        assert job.returncode == 0
        reads = fio_reads(out)
        time.sleep(0.2)
        after = parse(get(url))
    finally:
        stop(exporter)
        if job.poll() is None:
            job.kill()

    def grew(name: str) -> float:
        labels = {"device": disk, "op": "read"}
        return total(after, name, **labels) - total(before, name, **labels)

    assert reads >= 3000
    # fio's I/O runs in a process it forks: counted only because --tgid follows the tree.
    queued = grew("kernmlops_block_io_queue_seconds_count")
    assert abs(queued - reads) <= 0.005 * reads, (queued, reads)
    assert grew("kernmlops_block_io_latency_seconds_count") == queued  # one of each
    assert grew("kernmlops_block_io_bytes_total") == pytest.approx(reads * 4096, rel=0.005)
    inf = {"device": disk, "op": "read", "le": "+Inf"}
    bucket = "kernmlops_block_io_queue_seconds_bucket"
    assert total(after, bucket, **inf) - total(before, bucket, **inf) == queued
    # Both stages took time: the scheduler held each request (mq-deadline inserts
    # it, then dispatches it), and the device served it.
    queue_s = grew("kernmlops_block_io_queue_seconds_sum")
    service_s = grew("kernmlops_block_io_latency_seconds_sum")
    print(f"reads {reads}: queue {queue_s / queued * 1e6:.1f} µs, service "
          f"{service_s / queued * 1e6:.1f} µs on average")  # fmt: skip
    assert queue_s > 0 and service_s > 0


def test_tgid_alone_misses_nothing_of_the_tree_and_counts_no_other_process(
    tmp_path: Path, data_file: Path
) -> None:
    job = gated(fio_argv(data_file, 1000, "kmo-tree"))
    other = gated(fio_argv(data_file, 700, "kmo-other"))  # same disk, not in the tree
    exporter, url = start_exporter(tmp_path, "-c", "biolatency", "--tgid", str(job.pid))
    try:
        disk = data_file.name
        before = parse(get(url))
        for p in (job, other):
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=300)[0] for p in (job, other)]
        assert job.returncode == 0 and other.returncode == 0
        time.sleep(0.2)
        after = parse(get(url))
    finally:
        stop(exporter)
    name = "kernmlops_block_io_queue_seconds_count"
    counted = total(after, name, device=disk, op="read") - total(before, name, device=disk,
                                                                  op="read")  # fmt: skip
    mine = fio_reads(outs[0])
    assert abs(counted - mine) <= 0.005 * mine, (counted, mine, fio_reads(outs[1]))


@pytest.fixture
def two_cgroups() -> Iterator[tuple[Path, Path]]:
    mount = cgroup2_mount()
    assert mount is not None, "the test needs a cgroup v2 hierarchy"
    paths = (mount / f"kmo-jobA-{os.getpid()}", mount / f"kmo-jobB-{os.getpid()}")
    for p in paths:
        p.mkdir()
    try:
        yield paths
    finally:
        for p in paths:
            for _ in range(50):
                try:
                    p.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def test_biojobs_tells_two_concurrent_jobs_apart(
    tmp_path: Path, data_file: Path, two_cgroups: tuple[Path, Path]
) -> None:
    ios = (1200, 2000)
    jobs = [gated(fio_argv(data_file, n, f"kmo-j{i}"), cg)
            for i, (n, cg) in enumerate(zip(ios, two_cgroups, strict=True))]  # fmt: skip
    exporter, url = start_exporter(tmp_path, "-c", "biojobs")
    try:
        disk = data_file.name
        for p in jobs:  # both at once
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=300)[0] for p in jobs]
        assert all(p.returncode == 0 for p in jobs)
        time.sleep(0.2)
        after = parse(get(url))
    finally:
        stop(exporter)
    for cg, out in zip(two_cgroups, outs, strict=True):
        reads = fio_reads(out)
        labels = {"cgroup": "/" + cg.name, "device": disk, "op": "read"}
        queued = total(after, "kernmlops_job_block_io_queue_seconds_count", **labels)
        served = total(after, "kernmlops_job_block_io_latency_seconds_count", **labels)
        assert abs(queued - reads) <= 0.005 * reads, (cg.name, queued, reads)
        assert served == queued
        assert total(after, "kernmlops_job_block_io_queue_seconds_count", comm="fio",
                     **labels) == queued  # fmt: skip


def helps(text: str) -> dict[str, str]:
    """Each family's HELP text as served (``# HELP name text`` lines)."""
    lines = [line.split(" ", 3)[2:] for line in text.splitlines() if line.startswith("# HELP ")]
    return {name: doc for name, doc in lines}


def test_help_says_which_job_is_counted_and_only_then(tmp_path: Path) -> None:
    """Without --tgid, --comm or --cgroup the sets count every task on the machine,
    and their HELP must not claim a job; with them, HELP names what is counted (the
    YAML's own words said "of the job" either way)."""
    from kernmlops.exporter.config import resolve_sets

    sets = ["pagefaults", "oncpu", "runqlat"]
    loaded = resolve_sets(sets)
    ours = {getattr(m, "exposed_name", m.name): m.help for ms in loaded for m in ms.metrics}
    assert len(ours) == 3 and not any("job" in h for h in ours.values())
    args = [a for s in sets for a in ("-c", s)]
    proc, url = start_exporter(tmp_path, *args)
    try:
        served = helps(get(url))
    finally:
        stop(proc)
    assert {name: served[name] for name in ours} == ours
    assert loaded[sets.index("runqlat")].spec.description == "run-queue latency of tasks"

    job = subprocess.Popen(["sleep", "120"])
    try:
        proc, url = start_exporter(tmp_path, *args, "--tgid", str(job.pid), "--comm", "sleep")
        try:
            served = helps(get(url))
        finally:
            stop(proc)
    finally:
        job.kill()
        job.wait()
    scope = (f" (counted only for tasks that match each of: process {job.pid} and its "
             "descendants; threads named sleep)")  # fmt: skip
    assert {name: served[name] for name in ours} == {n: h + scope for n, h in ours.items()}
