"""Keys that churn (root + BPF): thread names and cgroups come and go on a busy
node. The sets keyed by them (syscalls_comm, biojobs, oncpu) keep LRU maps, so
once more keys came than a map holds, the newest are still counted, exactly
what the test's own processes did; and the exporter serves what the map holds
now, however many label sets it served before. A cgroup removed before a
scrape keeps its CPU time, under the path a scrape saw or as
unknown_cgroup_id:N."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernmlops.exporter.config import resolve_sets
from kernmlops.exporter.core import Exporter
from tests.exporter.conftest import scratch_cgroup, usage_us

pytestmark = pytest.mark.bpf

NEWEST = 12  # the last names/cgroups of a churn, checked one by one


@functools.lru_cache(maxsize=2)
def _samples(text: str) -> dict[str, dict[frozenset, float]]:
    """Every sample of a page, by name: parsed once, as a churned set's page is
    megabytes (biojobs': 7 MB), which the parser takes seconds over."""
    found: dict[str, dict[frozenset, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return found


def _series(text: str, name: str) -> dict[frozenset, float]:
    return dict(_samples(text).get(name, {}))


def _map_full(text: str, set_name: str) -> float:
    (value,) = (_series(text, "kernmlops_exporter_map_full_total")[frozenset({("set", set_name)})],)
    return value


@pytest.fixture
def exporter(request: pytest.FixtureRequest) -> Iterator[Exporter]:
    exp = Exporter(resolve_sets([request.param]))
    try:
        (status,) = exp.start()
        assert status.error is None, status.error
        assert not status.missed, [(p.name, p.error) for p in status.missed]
        yield exp
    finally:
        exp.close()


def _run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


COMMS = """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NAME = 15
    churn, newest = int(sys.argv[1]), int(sys.argv[2])
    def name(text):
        assert libc.prctl(PR_SET_NAME, text.encode(), 0, 0, 0) == 0
    for i in range(churn):  # two keys each: (name, getppid), (name, prctl)
        name(f"kmo-c{i}")
        libc.getppid()
    for j in range(newest):
        name(f"kmo-n{j}")
        for _ in range(j + 1):
            libc.getppid()
"""


@pytest.mark.parametrize("exporter", ["syscalls_comm"], indirect=True)
def test_syscalls_comm_counts_new_names_after_more_than_the_map_holds(
    exporter: Exporter,
) -> None:
    """40,000 (name, syscall) keys into a map of 16,384, more label sets than the
    set's max_label_sets (20,000): the newest names' getppid counts are exact."""
    (metric, _errors) = exporter.sets[0].metrics
    churn = 20_000
    assert 2 * churn > metric.reader.max_entries and 2 * churn > metric.max_label_sets
    first = _series(exporter.render().decode(), "kernmlops_syscalls_by_comm_total")
    _run(COMMS, str(churn), str(NEWEST))
    text = exporter.render().decode()
    got = _series(text, "kernmlops_syscalls_by_comm_total")
    for j in range(NEWEST):
        assert got[frozenset({("comm", f"kmo-n{j}"), ("syscall", "getppid")})] == j + 1, j
    churned = {dict(k)["comm"] for k in got if dict(k)["comm"].startswith("kmo-c")}
    assert 0 < len(churned) < churn  # the oldest were evicted to make room
    assert f"kmo-c{churn - 1}" in churned
    assert len(got) <= metric.reader.max_entries
    assert metric.dropped == 0 and _map_full(text, "syscalls_comm") == 0
    assert len(first) < len(got)


BIO = """
    import ctypes, mmap, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NAME = 15
    dev, churn, newest = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
    def name(text):
        assert libc.prctl(PR_SET_NAME, text.encode(), 0, 0, 0) == 0
    def read(n):
        assert os.preadv(fd, [buf], (n % 1024) * 4096) == 4096
    for i in range(churn):
        name(f"kmo-b{i}")
        read(i)
    for j in range(newest):
        name(f"kmo-bn{j}")
        for k in range(j + 1):
            read(k)
"""


@pytest.fixture
def loop_device() -> Iterator[str]:
    """A memory-backed loop device of the test's own, without an I/O scheduler:
    each direct read is one request, submitted and issued by the reader."""
    losetup = shutil.which("losetup")
    assert losetup, "needs losetup (util-linux)"
    backing = Path("/dev/shm") / f"kmo-churn-{os.getpid()}.img"
    with backing.open("wb") as out:
        out.truncate(4 << 20)
    dev = subprocess.run([losetup, "--show", "-f", str(backing)], capture_output=True,
                         text=True, check=True).stdout.strip()  # fmt: skip
    try:
        Path(f"/sys/block/{Path(dev).name}/queue/scheduler").write_text("none")
        yield dev
    finally:
        subprocess.run([losetup, "-d", dev], check=False)
        backing.unlink(missing_ok=True)


@pytest.mark.parametrize("exporter", ["biojobs"], indirect=True)
def test_biojobs_counts_new_jobs_after_more_than_the_map_holds(
    exporter: Exporter, loop_device: str
) -> None:
    """1,100 process names, one read each, into maps of 1,024 keys: the newest
    names' reads and bytes are exact."""
    bytes_metric = exporter.sets[0].metrics[0]
    churn = 1100
    assert churn > bytes_metric.reader.max_entries
    _run(BIO, loop_device, str(churn), str(NEWEST))
    disk = Path(loop_device).name
    last = frozenset({("comm", f"kmo-bn{NEWEST - 1}"), ("device", disk), ("op", "read")})
    deadline = time.monotonic() + 10
    while True:  # until the last name's last completion is counted (or 10 s)
        text = exporter.render().decode()
        reads = _series(text, "kernmlops_job_block_io_latency_seconds_count")
        if NEWEST in (v for k, v in reads.items() if last <= k) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    size = _series(text, "kernmlops_job_block_io_bytes_total")
    for j in range(NEWEST):
        key = frozenset({("comm", f"kmo-bn{j}"), ("device", disk), ("op", "read")})
        (cg,) = {dict(k)["cgroup"] for k in reads if key <= k}
        full = key | {("cgroup", cg)}
        assert reads[full] == j + 1, j
        assert size[full] == 4096 * (j + 1), j
    churned = {dict(k)["comm"] for k in reads if dict(k)["comm"].startswith("kmo-b")}
    assert f"kmo-b{churn - 1}" in churned and len(churned) <= bytes_metric.reader.max_entries
    assert _map_full(text, "biojobs") == 0


CGROUPS = """
    import os, sys, time
    root, churn = sys.argv[1], int(sys.argv[2])
    me = str(os.getpid())
    for i in range(churn):  # a moment on the CPU in each, then off it (any sleep)
        time.sleep(0.00001)
        with open(f"{root}/c{i}/cgroup.procs", "w") as f:
            f.write(me)
        time.sleep(0.00001)
    print("churned", flush=True)
    while (ms := os.read(0, 8)):  # moved meanwhile (asleep): burn, say so, sleep
        end = time.thread_time() + int(ms) / 1000
        while time.thread_time() < end:
            pass
        print("burnt", flush=True)
"""


def _asleep(pid: int) -> None:
    """Until ``pid`` sleeps with its switch off the CPU done (so counted, by the BPF
    program and by cpu.stat): /proc/PID/syscall names the call it blocks in only once
    the kernel saw it off the CPU (it says "running" before)."""
    stat, syscall = Path(f"/proc/{pid}/stat"), Path(f"/proc/{pid}/syscall")
    deadline = time.monotonic() + 10
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "S" or "running" in syscall.read_text():
        assert time.monotonic() < deadline, f"{pid} never went to sleep"
        time.sleep(0.001)


@pytest.fixture
def churn_root() -> Iterator[Path]:
    with scratch_cgroup("kmo-churn") as root:
        yield root


@pytest.mark.parametrize("exporter", ["oncpu"], indirect=True)
def test_oncpu_counts_new_cgroups_after_more_than_the_map_holds(
    exporter: Exporter, churn_root: Path
) -> None:
    """4,200 cgroups, each on the CPU a moment, into a map of 4,096: the newest
    cgroups' CPU time is their cpu.stat's."""
    (metric,) = exporter.sets[0].metrics
    churn = 4200
    assert churn > metric.reader.max_entries
    for i in range(churn):
        (churn_root / f"c{i}").mkdir()
    for j in range(NEWEST):
        (churn_root / f"n{j}").mkdir()
    argv = [sys.executable, "-c", textwrap.dedent(CGROUPS), str(churn_root), str(churn)]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    used = {}
    try:
        assert child.stdout.readline() == b"churned\n"
        for j in range(NEWEST):  # moved while asleep: each quantum wholly in the cgroup
            _asleep(child.pid)
            cgroup = churn_root / f"n{j}"
            (cgroup / "cgroup.procs").write_text(str(child.pid))
            child.stdin.write(f"{5 * (j + 1)}".encode())
            child.stdin.flush()
            assert child.stdout.readline() == b"burnt\n"
            _asleep(child.pid)
            used[f"/{churn_root.name}/{cgroup.name}"] = usage_us(cgroup)
        (churn_root / "cgroup.procs").write_text(str(child.pid))
    finally:
        child.stdin.close()
        assert child.wait(timeout=60) == 0
    text = exporter.render().decode()
    got = {
        dict(k)["cgroup"]: v for k, v in _series(text, "kernmlops_cgroup_cpu_seconds_total").items()
    }
    for label, cpu_us in used.items():
        assert cpu_us >= 5000
        assert got[label] * 1e6 == pytest.approx(cpu_us, abs=2), label
    prefix = f"/{churn_root.name}/c"
    churned = {c for c in got if c.startswith(prefix)}
    assert f"{prefix}{churn - 1}" in churned and len(churned) < churn
    assert _map_full(text, "oncpu") == 0


@pytest.mark.parametrize("exporter", ["oncpu"], indirect=True)
def test_oncpu_keeps_the_cpu_time_of_a_removed_cgroup(exporter: Exporter, churn_root: Path) -> None:
    """A job in a cgroup of its own, removed before the next scrape: a 0.5-s busy
    loop in a cgroup made after the last scrape is served as
    unknown_cgroup_id:<its id>, one in a cgroup a scrape saw under its path;
    each is the CPU time the cgroup's cpu.stat had just before rmdir, and what
    the loop burnt (its own thread CPU clock). It was dropped (a decoder error)."""
    argv = [sys.executable, "-c", textwrap.dedent(CGROUPS), str(churn_root), "0"]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    used, ids = {}, {}
    try:
        assert child.stdout.readline() == b"churned\n"
        for name in ("seen", "brief"):
            cgroup = churn_root / name
            cgroup.mkdir()
            ids[name] = cgroup.stat().st_ino
            _asleep(child.pid)
            (cgroup / "cgroup.procs").write_text(str(child.pid))
            child.stdin.write(b"500")
            child.stdin.flush()
            assert child.stdout.readline() == b"burnt\n"
            _asleep(child.pid)
            if name == "seen":
                exporter.render()  # a scrape while it is there
            used[name] = usage_us(cgroup)
            (churn_root / "cgroup.procs").write_text(str(child.pid))
            cgroup.rmdir()
    finally:
        child.stdin.close()
        assert child.wait(timeout=60) == 0
    text = exporter.render().decode()
    got = {
        dict(k)["cgroup"]: v for k, v in _series(text, "kernmlops_cgroup_cpu_seconds_total").items()
    }
    seen = f"/{churn_root.name}/seen"
    brief = f"unknown_cgroup_id:{ids['brief']}"
    for label, name in ((seen, "seen"), (brief, "brief")):
        assert got[label] * 1e6 == pytest.approx(used[name], abs=2), label
        assert got[label] == pytest.approx(0.5, abs=0.01), label  # the loop's own clock
    errors = _series(text, "kernmlops_exporter_decoder_errors_total")
    assert not any(dict(k)["set"] == "oncpu" and v for k, v in errors.items())
