"""Restricting sets to one job happens in the kernel: by process (--tgid), by
cgroup and everything below it (--cgroup), and by a collection's process
filter (collect --export). Two processes make known numbers of getppid calls;
each exporter counts exactly its own process's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernmlops.collect.filter import ProcessFilter
from kernmlops.exporter.config import resolve_sets
from kernmlops.exporter.core import Exporter, ExporterError, JobFilter
from kernmlops.exporter.decoders import cgroup2_mount

pytestmark = pytest.mark.bpf

CALLS = {"a": 1234, "b": 321}
CHILD = (
    "import os, sys\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    os.getppid()\n"
)


def getppids(exporter: Exporter) -> float:
    for family in text_string_to_metric_families(exporter.render().decode()):
        for s in family.samples:
            if s.name == "kernmlops_syscalls_total" and s.labels == {"syscall": "getppid"}:
                return s.value
    return 0.0


def spawn(calls: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(calls)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_tgid_cgroup_and_process_filter_count_only_their_job(tmp_path: Path) -> None:
    mount = cgroup2_mount()
    assert mount is not None, "the test needs a cgroup v2 hierarchy"
    outer = mount / f"kmo-exporter-filter-{os.getpid()}"
    inner = outer / "inner"
    inner.mkdir(parents=True)
    procs: list[subprocess.Popen] = []
    exporters: list[Exporter] = []
    flt: ProcessFilter | None = None
    try:
        a, b = spawn(CALLS["a"]), spawn(CALLS["b"])
        procs += [a, b]
        (inner / "cgroup.procs").write_text(str(a.pid))  # a is below the filtered cgroup
        flt = ProcessFilter(follow_children=False)
        flt.add(a.pid)
        sets = resolve_sets(["syscalls"])
        by_tgid = Exporter(sets, job=JobFilter(tgid=a.pid))
        by_cgroup = Exporter(sets, job=JobFilter(cgroup="/" + outer.name))
        by_filter = Exporter(sets, process_filter_fd=flt.fd)
        exporters += [by_tgid, by_cgroup, by_filter]
        for exporter in exporters:
            (status,) = exporter.start()
            assert status.error is None and status.attached == 2, status
        before = [getppids(e) for e in exporters]
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            assert proc.wait(timeout=30) == 0
        after = [getppids(e) for e in exporters]
        assert [x - y for x, y in zip(after, before, strict=True)] == [CALLS["a"]] * 3
    finally:
        for exporter in exporters:
            exporter.close()
        if flt is not None:
            flt.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for cg in (inner, outer):
            for _ in range(50):
                try:
                    cg.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def test_unknown_cgroup_is_refused_before_loading() -> None:
    with pytest.raises(ExporterError, match="--cgroup: cgroup /no-such-cgroup-kmo not found"):
        Exporter(resolve_sets(["syscalls"]), job=JobFilter(cgroup="/no-such-cgroup-kmo")).start()
