"""The exporter against the real kernel (root + BPF): a job with known kernel
activity, the exporter restricted to it, two scrapes, promtool, a real
Prometheus scraping it, and a clean SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.exporter.conftest import free_port, scratch_cgroup, stop, usage_us, wait_serving

pytestmark = pytest.mark.bpf

HERE = Path(__file__).resolve().parent
JOB = "kmo-expjob"  # the workload's name, which the exporter filters on
WRITES, SLEEPS, GETPPIDS, ENOENTS, PAGES, MOVES, BURN_MS = 64, 100, 777, 33, 300, 20, 300
SETS = ["biolatency", "runqlat", "syscalls", "pagefaults", "migrations", "oncpu"]


def get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


def disk_of(path: Path) -> str:
    """The whole disk under a file (block requests are on the disk, not the partition)."""
    dev = path.stat().st_dev
    sysdir = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    return sysdir.parent.name if (sysdir / "partition").exists() else sysdir.name


def exp_programs() -> set[int]:
    tool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    out = subprocess.run([tool, "-j", "prog", "show"], capture_output=True, text=True, check=True)
    return {p["id"] for p in json.loads(out.stdout or "[]") if p.get("name", "").startswith("exp_")}


def programs_of(pid: int) -> set[int]:
    """The BPF programs a process holds a descriptor of (its fdinfo's prog_id): its own,
    not another exporter's on the same machine."""
    ids = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            text = info.read_text()
        except OSError:  # closed meanwhile
            continue
        ids |= {int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("prog_id:")}
    return ids


@pytest.fixture
def job_cgroup() -> Iterator[Path]:
    with scratch_cgroup("kmo-exporter-test") as path:
        yield path


def usage_s(cgroup: Path) -> float:
    return usage_us(cgroup) / 1e6


def query(prom: str, expr: str, timeout: float = 40) -> list[dict]:
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    deadline = time.monotonic() + timeout
    while True:
        try:
            body = json.loads(get(url, timeout=5))
            if body["status"] == "success" and body["data"]["result"]:
                return body["data"]["result"]
        except OSError:
            pass  # not up yet
        if time.monotonic() > deadline:
            raise AssertionError(f"Prometheus found nothing for {expr} within {timeout} s")
        time.sleep(0.5)


def test_exporter_counts_a_known_job_and_prometheus_scrapes_it(
    tmp_path: Path, job_cgroup: Path
) -> None:
    for tool in ("promtool", "prometheus"):
        assert shutil.which(tool), f"{tool} missing: apt-get install prometheus"
    started: list[subprocess.Popen] = []
    logs = []
    port, prom_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    data_dir = Path("/var/tmp") / f"kmo-exporter-test-{os.getpid()}"
    data_dir.mkdir()
    log = tmp_path / "exporter.log"
    try:
        args = [sys.executable, "-m", "kernmlops.exporter", "--listen", f"127.0.0.1:{port}"]
        args += ["--comm", JOB, "--bpf-stats", *(x for s in SETS for x in ("-c", s))]
        with log.open("w") as out:
            exporter = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        started.append(exporter)
        wait_serving(exporter, url, log)
        loaded = exp_programs() & programs_of(exporter.pid)
        assert loaded, "the exporter's programs are not in the kernel"

        work = subprocess.Popen(
            [sys.executable, str(HERE / "workload.py"), JOB, str(data_dir / "data"),
             *map(str, (WRITES, SLEEPS, GETPPIDS, ENOENTS, PAGES, MOVES, BURN_MS))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        started.append(work)
        assert work.stdout is not None and work.stdin is not None
        assert work.stdout.readline().strip() == "ready"
        (job_cgroup / "cgroup.procs").write_text(str(work.pid))
        cpu0 = usage_s(job_cgroup)
        first = parse(get(url))
        work.stdin.write("go\n")
        work.stdin.flush()
        did = json.loads(work.stdout.readline())
        assert work.wait(timeout=60) == 0
        # A parent can reap its child before the child's last switch off the CPU
        # (exit_notify comes first), and the job's last quantum is counted at that
        # switch; on a host that stalls vCPUs the gap reaches milliseconds.
        time.sleep(0.2)
        cpu1 = usage_s(job_cgroup)
        text = get(url)
        second = parse(text)

        def grew(name: str, **labels: str) -> float:
            return total(second, name, **labels) - total(first, name, **labels)

        disk = disk_of(data_dir)
        writes = grew("kernmlops_block_io_latency_seconds_count", device=disk, op="write")
        misses = {k: v for k, v in second.items() if "recursion" in k[0] or "map_full" in k[0]}
        # Only the job's requests. A request the job issued directly is, rarely, inserted
        # by a kworker when the device was busy (README, "What is not attributed"): it
        # is the kworker's then. Seen once, 63 of 64, on a loaded 2-vCPU runner.
        assert WRITES - 2 <= writes <= WRITES + 8, (writes, misses)
        assert grew("kernmlops_block_io_bytes_total", device=disk, op="write") >= writes * 4096
        le_inf = grew(
            "kernmlops_block_io_latency_seconds_bucket", device=disk, op="write", le="+Inf"
        )
        assert le_inf == writes
        assert grew("kernmlops_block_io_latency_seconds_sum", device=disk, op="write") > 0
        assert grew("kernmlops_runqueue_latency_seconds_count") >= SLEEPS
        assert grew("kernmlops_syscalls_total", syscall="getppid") == GETPPIDS
        assert grew("kernmlops_syscalls_total", syscall="pwrite64") == WRITES
        enoent = grew("kernmlops_syscall_errors_total", syscall="openat", errno="ENOENT")
        assert ENOENTS <= enoent <= ENOENTS + 5, enoent
        assert grew("kernmlops_page_faults_total", mode="user") >= PAGES
        assert grew("kernmlops_task_migrations_total") >= did["moved"]
        if did["cpus"] >= 2:
            assert did["moved"] == MOVES
        # CPU time of the job's cgroup: the scheduler's account, as cpu.stat keeps it
        cg_label = "/" + job_cgroup.name
        on_cpu = grew("kernmlops_cgroup_cpu_seconds_total", cgroup=cg_label)
        assert on_cpu >= BURN_MS / 1000 * 0.9
        assert abs(on_cpu - (cpu1 - cpu0)) <= 0.1 * (cpu1 - cpu0) + 0.03, (on_cpu, cpu1 - cpu0)
        print(
            f"writes {writes} enoent {enoent} on-cpu {on_cpu:.4f} s, cpu.stat {cpu1 - cpu0:.4f} s"
        )
        # the exporter's own metrics
        assert value(second, "kernmlops_exporter_set_enabled", set="biolatency") == 1
        assert value(second, "kernmlops_exporter_programs_attached", set="syscalls") == 2
        assert value(second, "kernmlops_exporter_bpf_stats_enabled") == 1
        runs = total(second, "kernmlops_exporter_program_runs_total", set="syscalls")
        assert runs >= GETPPIDS  # every call entered the program, filtered or not
        assert total(second, "kernmlops_exporter_program_run_seconds_total", set="syscalls") > 0
        assert total(second, "kernmlops_exporter_decoder_errors_total") == 0
        assert value(second, "kernmlops_exporter_scrapes_total") == 3  # with the readiness probe

        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                               text=True, timeout=30)  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr

        # A real Prometheus scrapes the exporter every second.
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: kernmlops\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
        )
        prom_log = (tmp_path / "prometheus.log").open("w")
        logs.append(prom_log)
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=prom_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        started.append(prom)
        api = f"http://127.0.0.1:{prom_port}"
        expr = f'kernmlops_block_io_latency_seconds_bucket{{device="{disk}",op="write",le="+Inf"}}'
        (series,) = query(api, expr)
        assert series["metric"] == {
            "__name__": "kernmlops_block_io_latency_seconds_bucket",
            "device": disk,
            "op": "write",
            "le": "+Inf",
            "instance": f"127.0.0.1:{port}",
            "job": "kernmlops",
        }
        assert float(series["value"][1]) >= WRITES
        buckets = query(api, f'kernmlops_block_io_latency_seconds_bucket{{device="{disk}"}}')
        assert len({s["metric"]["le"] for s in buckets}) == 28  # 27 bounds and +Inf
        writes_expr = f'kernmlops_block_io_latency_seconds_bucket{{device="{disk}",op="write"}}'
        median = query(api, f"histogram_quantile(0.5, {writes_expr})")
        assert 0 < float(median[0]["value"][1]) < 10  # seconds

        # SIGTERM: the exporter detaches everything and exits 0.
        exporter.send_signal(signal.SIGTERM)
        assert exporter.wait(timeout=20) == 0, log.read_text()
        assert "stopping (SIGTERM)" in log.read_text()
        deadline = time.monotonic() + 5
        while loaded & exp_programs() and time.monotonic() < deadline:
            time.sleep(0.1)  # the kernel frees programs asynchronously
        assert not loaded & exp_programs()
    finally:
        for proc in started:
            stop(proc, timeout=10)
        shutil.rmtree(data_dir, ignore_errors=True)
        for fh in logs:
            fh.close()
    for proc in started:
        assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == "zombie"
    mine = {p.pid for p in started}
    assert not mine & {c.pid for c in psutil.Process().children(recursive=True)}


def test_oncpu_counts_the_quanta_whose_switch_in_was_not_seen(
    job_cgroup: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The oncpu set against the cgroup's cpu.stat, for a job whose switches in the
    program never sees (tests.unseen: as after a switch out that never reaches the
    tracepoint). Such quanta were dropped: a job burning 0.3 s read 0.02 s here, and
    the known job above read 0.250 s of its 0.3 s burn once, in CI."""
    from kernmlops.exporter.config import resolve_sets
    from kernmlops.exporter.core import Exporter, JobFilter
    from tests.hooks.conftest import build_c
    from tests.unseen import BURN, Unseen, wait_asleep

    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, "needs two CPUs: the job's and the blanking thread's"
    taskset = shutil.which("taskset")
    assert taskset, "taskset (util-linux) is needed"
    burn = build_c(tmp_path_factory, "burn", BURN)
    exporter = Exporter(resolve_sets(["oncpu"]), job=JobFilter(cgroup=str(job_cgroup)))
    child = None
    try:
        (status,) = exporter.start()
        assert status.error is None and exporter.sets[0].obj is not None
        counter = exporter.sets[0].obj.map("cgroup_cpu_ns")
        key = job_cgroup.stat().st_ino.to_bytes(8, "little")  # the cgroup's id

        def counted_ns() -> int:
            return int(counter.lookup_percpu(key).sum()) if counter.lookup(key) else 0

        def enter() -> None:  # in the child, before exec: its whole life is the job's
            (job_cgroup / "cgroup.procs").write_text(str(os.getpid()))

        child = subprocess.Popen([taskset, "-c", str(cpus[-1]), str(burn), "300"],
                                 stdin=subprocess.PIPE, preexec_fn=enter)  # fmt: skip
        assert child.stdin is not None
        wait_asleep(child.pid, "burn")
        # From here (the job asleep, each of its quanta counted) the two accounts grow
        # alike: the exporter's ns, cpu.stat's µs (truncated).
        ns0, us0 = counted_ns(), usage_s(job_cgroup) * 1e6
        with Unseen(exporter.sets[0].obj, "exp_oncpu_cur", cpus[0]) as unseen:
            child.stdin.write(b"x")
            child.stdin.close()
            assert child.wait(timeout=60) == 0
        time.sleep(0.2)  # its last switch off the CPU may follow the reaping (above)
        used_us = usage_s(job_cgroup) * 1e6 - us0
        got_us = (counted_ns() - ns0) / 1000
    finally:
        exporter.close()
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
    # 0.3 s less its start-up (and what cpu.stat had not taken in at the first read:
    # 243 ms once, 157 ms another time, on a loaded CI machine: the burn is by the clock,
    # and the CPU a 2-vCPU machine gives it varies); the check is the equality below
    assert unseen.blanked > 10 and used_us >= 100_000
    assert got_us == pytest.approx(used_us, abs=2), (got_us, used_us)


def test_a_hangup_stops_the_exporter_cleanly(tmp_path: Path) -> None:
    # its terminal closed (an ssh session lost): detached, exit 0, as for SIGTERM; the
    # default action ended it with its programs' links left to the kernel to drop
    port = free_port()
    log = tmp_path / "exporter.log"
    args = [sys.executable, "-m", "kernmlops.exporter", "--listen", f"127.0.0.1:{port}",
            "-c", "migrations"]  # fmt: skip
    with log.open("w") as out:
        exporter = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_serving(exporter, f"http://127.0.0.1:{port}/metrics", log)
        assert exp_programs() & programs_of(exporter.pid), "its programs are not in the kernel"
        exporter.send_signal(signal.SIGHUP)
        assert exporter.wait(timeout=20) == 0, log.read_text()
        assert "stopping (SIGHUP): detaching programs" in log.read_text()
    finally:
        if exporter.poll() is None:
            exporter.kill()
            exporter.wait()
