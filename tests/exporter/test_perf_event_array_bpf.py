"""ebpf_exporter's ``perf_event_array: true`` counters against the kernel: the
test program (ebpf_exporter/perf-events.bpf.c) sends a perf event array sample
per getppid(2) of a ``kmo-pea`` thread; the served counter must equal the
calls the workload made, and samples the kernel drops must be counted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernmlops.exporter.config import resolve_sets
from kernmlops.exporter.core import Exporter
from kernmlops.exporter.perf_event_array import PerfEventCounts
from tests.conftest import HOTPLUG_CPU, cpu_offline
from tests.exporter.conftest import scratch_cgroup

pytestmark = pytest.mark.bpf

CONFIGS = Path(__file__).parent / "ebpf_exporter"
METRIC = "ebpf_exporter_test_getppid_events_total"
LOST = "dropped_perf_event_map_events_test_getppid_events_total"


def _workload(comm: str, calls: int, cgroup: Path | None = None, cpu: int | None = None) -> int:
    """A process named ``comm`` (in ``cgroup``, if given; on CPU ``cpu``, if given)
    calls getppid ``calls`` times; its process id."""
    code = textwrap.dedent(f"""
        import os, sys
        if {cpu!r} is not None:
            os.sched_setaffinity(0, {{{cpu!r}}})
        if {str(cgroup) if cgroup else ""!r}:
            open({str(cgroup)!r} + "/cgroup.procs", "w").write(str(os.getpid()))
        open("/proc/self/comm", "w").write({comm!r})
        for _ in range({calls}):
            os.getppid()
        print(os.getpid())
    """)
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(done.stdout)


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def _served(exporter: Exporter, tgid: int, want: float, timeout: float = 10) -> dict:
    """The counter's series of process ``tgid`` once it shows ``want`` (the
    poller runs every 300 ms), or as it is at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = {
            labels: v
            for labels, v in _samples(exporter.render().decode(), METRIC).items()
            if dict(labels)["tgid"] == str(tgid)
        }
        if sum(got.values()) >= want or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


@pytest.fixture(scope="module")
def perf_events() -> Iterator[Exporter]:
    exporter = Exporter(resolve_sets([str(CONFIGS / "perf-events.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        assert status.attached == 1, [(p.name, p.error) for p in status.programs]
        yield exporter
    finally:
        exporter.close()


@dataclass
class Unpolled:
    """perf-events.yaml's exporter started with its services (the ring's poller) not
    running: the test polls, or replaces the reader."""

    exporter: Exporter
    metric: Any
    reader: PerfEventCounts
    obj: Any


@pytest.fixture
def unpolled() -> Iterator[Unpolled]:
    exporter = Exporter(resolve_sets([str(CONFIGS / "perf-events.yaml")]), services_later=True)
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        (metric,) = exporter.sets[0].metrics
        assert isinstance(metric.reader, PerfEventCounts)
        assert exporter.sets[0].obj is not None
        yield Unpolled(exporter, metric, metric.reader, exporter.sets[0].obj)
    finally:
        exporter.close()


def test_each_sample_counts_once_under_its_labels(perf_events: Exporter) -> None:
    calls = 5000
    with scratch_cgroup("kmo-pea-cg") as cgroup:
        tgid = _workload("kmo-pea-count", calls, cgroup)
        got = _served(perf_events, tgid, calls)
        # one series: the trailing per-sample field is not part of the key
        ((labels, value),) = got.items()
        assert value == calls
        assert dict(labels)["cgroup"] == str(cgroup), labels  # the full path, as there
        text = perf_events.render().decode()
    assert f"# TYPE {METRIC} counter" in text
    assert _samples(text, LOST) == {(): 0.0}  # nothing dropped at this rate
    (reader,) = (m.reader for m in perf_events.sets[0].metrics)
    assert isinstance(reader, PerfEventCounts)
    keys, _ = reader.read()
    assert all(len(k) == 16 for k in keys)  # cut to the labels' span (4 + 4 + 8)


def test_a_second_process_is_a_series_of_its_own(perf_events: Exporter) -> None:
    first = _workload("kmo-pea-a", 300)
    second = _workload("kmo-pea-b", 700)
    assert sum(_served(perf_events, first, 300).values()) == 300
    assert sum(_served(perf_events, second, 700).values()) == 700


def test_dropped_samples_are_counted(unpolled: Unpolled) -> None:
    """A one-page ring, not read while the workload runs: most samples are
    dropped, and those received plus those reported lost are the calls made."""
    exporter = unpolled.exporter
    unpolled.reader.close()  # its ring replaced by a one-page one
    small = PerfEventCounts(unpolled.obj.map("test_getppid_events_total"), 16, pages=1)
    unpolled.metric.reader = small
    exporter.sets[0].services = [small]
    calls = 20_000
    # one CPU's ring: the kernel reports a ring's loss with the next sample
    # written to that ring, so the flood and the sample after it share a CPU
    cpu = min(os.sched_getaffinity(0))
    tgid = _workload("kmo-pea-flood", calls, cpu=cpu)
    small.poll_now()
    _workload("kmo-pea-flood", 1, cpu=cpu)
    small.poll_now()
    mine = {k: v for k, v in zip(*small.read(), strict=True) if k[:4] == tgid.to_bytes(4, "little")}
    received = int(sum(int(v[0]) for v in mine.values()))
    assert small.lost > 0
    assert received < calls
    # the second workload's sample is received, under its own process id
    assert received + small.lost == calls
    served = _samples(exporter.render().decode(), LOST)
    assert served == {(): float(small.lost)}


OOM_LIKE_C = """
#include <vmlinux.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

struct {
    __uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
    __uint(key_size, sizeof(u32));
    __uint(value_size, sizeof(u32));
} test_ooms_total SEC(".maps");

SEC("kprobe/oom_kill_process")
int BPF_KPROBE(on_oom_kill, struct oom_control *oc)
{
    struct mem_cgroup *memcg = BPF_CORE_READ(oc, memcg);
    u64 id = memcg ? BPF_CORE_READ(memcg, css.cgroup, kn, id) : 0;

    bpf_perf_event_output(ctx, &test_ooms_total, BPF_F_CURRENT_CPU, &id, sizeof(id));
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
"""

OOM_LIKE_YAML = """
metrics:
  counters:
    - name: test_ooms_total
      help: OOM kills by the memory cgroup that ran out
      perf_event_array: true
      labels:
        - name: cgroup_path
          size: 8
          decoders:
            - name: uint
            - name: cgroup
"""


def test_a_kprobe_config_like_ebpf_exporters_oomkill_loads(tmp_path: Path) -> None:
    """The shape of ebpf_exporter's oomkill example (a kprobe on
    oom_kill_process feeding a perf event array) loads; on a kernel without
    kprobes its program is reported not attached, and the counter is served
    empty with its drop count."""
    (tmp_path / "oom-like.bpf.c").write_text(OOM_LIKE_C)
    (tmp_path / "oom-like.yaml").write_text(OOM_LIKE_YAML)
    exporter = Exporter(resolve_sets([str(tmp_path / "oom-like.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        (prog,) = status.programs
        kprobes = Path("/sys/kernel/tracing/kprobe_events").exists()
        assert prog.attached or not kprobes, prog.error
        text = exporter.render().decode()
        assert "# TYPE ebpf_exporter_test_ooms_total counter" in text
        assert _samples(text, "dropped_perf_event_map_events_test_ooms_total") == {(): 0.0}
    finally:
        exporter.close()


def test_counts_start_again_every_flush_interval(tmp_path: Path) -> None:
    """flush_interval: 3s: a series counted before a flush is gone after it,
    and counting goes on from zero, as ebpf_exporter resets its counters."""
    (tmp_path / "flushed.bpf.c").write_text((CONFIGS / "perf-events.bpf.c").read_text())
    config = (CONFIGS / "perf-events.yaml").read_text()
    flushed = config.replace(
        "perf_event_array: true", "perf_event_array: true\n      flush_interval: 3s"
    )
    assert flushed != config
    (tmp_path / "flushed.yaml").write_text(flushed)
    exporter = Exporter(resolve_sets([str(tmp_path / "flushed.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        first = _workload("kmo-pea-f1", 50)
        # well within the first 3 s (a flush there would forget it first)
        assert sum(_served(exporter, first, 50, timeout=2).values()) == 50
        deadline = time.monotonic() + 6
        while _served(exporter, first, 1, timeout=0) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _served(exporter, first, 1, timeout=0), "the flush forgot the series"
        second = _workload("kmo-pea-f2", 30)
        assert sum(_served(exporter, second, 30, timeout=2).values()) == 30
    finally:
        exporter.close()


def _errors(text: str, config: str) -> tuple[float, float]:
    """ebpf_exporter_decoder_errors_total of ``config``, and kernmlops' own
    count of the counter's undecodable cgroup label."""
    ours = _samples(text, "kernmlops_exporter_decoder_errors_total")
    theirs = _samples(text, "ebpf_exporter_decoder_errors_total")
    (mine,) = [v for labels, v in ours.items() if dict(labels)["set"] == config]
    assert {dict(labels)["label"] for labels in ours} == {"cgroup"}
    return theirs.get((("config", config),), -1.0), mine


def test_an_undecodable_sample_is_a_decoder_error_each_time(tmp_path: Path) -> None:
    """The real program's samples with a label planted not to decode (the
    8-byte cgroup id read as an IP address, which takes 4 or 16 bytes): each
    sample is one decoder error, as ebpf_exporter counts them (not one per
    distinct label set), those a flush forgot before any scrape saw them too."""
    (tmp_path / "planted.bpf.c").write_text((CONFIGS / "perf-events.bpf.c").read_text())
    config = (CONFIGS / "perf-events.yaml").read_text()
    planted = config.replace(
        "            - name: uint\n            - name: cgroup", "            - name: inet_ip"
    ).replace("perf_event_array: true", "perf_event_array: true\n      flush_interval: 1s")
    assert planted.count("inet_ip") == 1 and "flush_interval" in planted
    (tmp_path / "planted.yaml").write_text(planted)
    exporter = Exporter(resolve_sets([str(tmp_path / "planted.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        (metric,) = exporter.sets[0].metrics
        reader = metric.reader
        assert isinstance(reader, PerfEventCounts)
        first, second = 300, 200
        _workload("kmo-pea-bad1", first)
        _workload("kmo-pea-bad2", second)
        deadline = time.monotonic() + 30
        while reader.received < first + second or reader.read()[0]:
            # every sample in, then forgotten by a flush: no scrape saw them
            assert time.monotonic() < deadline, (reader.received, len(reader.read()[0]))
            time.sleep(0.1)
        assert reader.received == first + second
        text = exporter.render().decode()
        assert _errors(text, "planted") == (first + second, first + second)
        assert _samples(text, METRIC) == {}  # no series: none decoded
        third = 50
        _workload("kmo-pea-bad3", third)
        while reader.received < first + second + third:
            assert time.monotonic() < deadline, reader.received
            time.sleep(0.1)
        text = exporter.render().decode()
        assert _errors(text, "planted") == (first + second + third,) * 2
        text = exporter.render().decode()  # a scrape with no new samples adds none
        assert _errors(text, "planted") == (first + second + third,) * 2
    finally:
        exporter.close()


def _wait_ring(reader: PerfEventCounts, want: bool) -> None:
    """Until the reader's poller has seen CPU 1 online with a ring (``want``) or
    offline (its poll runs every 300 ms)."""
    deadline = time.monotonic() + 20
    while (HOTPLUG_CPU in reader._buffer.cpus) != want:
        assert time.monotonic() < deadline, (reader._buffer.cpus, reader.unread_cpus)
        time.sleep(0.02)


def _start(config: str = "perf-events.yaml") -> tuple[Exporter, PerfEventCounts]:
    exporter = Exporter(resolve_sets([str(CONFIGS / config)]))
    (status,) = exporter.start()
    assert status.error is None, status.error
    (metric,) = exporter.sets[0].metrics
    assert isinstance(metric.reader, PerfEventCounts)
    return exporter, metric.reader


def test_a_cpu_brought_online_after_the_start_gets_a_ring() -> None:
    """The exporter starts with CPU 1 offline (libbpf opens no ring there);
    once it is online, the samples of a workload pinned to it are all counted."""
    with cpu_offline():
        exporter, reader = _start()
    try:
        _wait_ring(reader, True)
        calls = 400
        tgid = _workload("kmo-pea-hot1", calls, cpu=HOTPLUG_CPU)
        assert sum(_served(exporter, tgid, calls).values()) == calls
        assert reader.unread_cpus == {}
        text = exporter.render().decode()
        assert _samples(text, "kernmlops_exporter_perf_event_array_cpus_unread") == {
            (("counter", "test_getppid_events_total"),): 0.0
        }
    finally:
        exporter.close()


def test_a_cpu_offline_and_back_gets_a_new_ring() -> None:
    """A CPU's perf event dies with the CPU going offline: once back, the
    exporter reads it through a new ring, and a workload pinned there is
    counted in full."""
    exporter, reader = _start()
    try:
        assert HOTPLUG_CPU in reader._buffer.cpus
        with cpu_offline():
            _wait_ring(reader, False)  # the poller saw it go
        _wait_ring(reader, True)
        calls = 300
        tgid = _workload("kmo-pea-hot2", calls, cpu=HOTPLUG_CPU)
        assert sum(_served(exporter, tgid, calls).values()) == calls
    finally:
        exporter.close()


def test_a_cpu_offline_and_back_between_two_looks_gets_a_new_ring(unpolled: Unpolled) -> None:
    """A CPU taken offline and brought back between two looks at the online list
    (here with no look at all in between: the poller is not started) looks as if
    nothing happened, but its perf event is gone: the kernel's uevents, queued
    between looks, say it went, and the next look gives it a new ring. Without
    them, the samples of a workload pinned there are lost unseen."""
    exporter, reader = unpolled.exporter, unpolled.reader
    assert HOTPLUG_CPU in reader._buffer.cpus
    if not reader._buffer._watch.available:
        pytest.fail("no uevent socket on this machine (a network namespace of its own?)")
    with cpu_offline():
        pass
    reader.refresh_cpus()
    calls = 300
    tgid = _workload("kmo-pea-hot3", calls, cpu=HOTPLUG_CPU)
    reader.poll_now()
    assert sum(_served(exporter, tgid, calls, timeout=0).values()) == calls
    # the same without the uevents: the CPU keeps its dead ring
    reader._buffer._watch.close()
    with cpu_offline():
        pass
    reader.refresh_cpus()
    tgid = _workload("kmo-pea-hot4", calls, cpu=HOTPLUG_CPU)
    reader.poll_now()
    assert _served(exporter, tgid, calls, timeout=0) == {}


def test_a_cpu_without_a_ring_is_said_once_and_served(
    unpolled: Unpolled, capfd: pytest.CaptureFixture[str]
) -> None:
    """A CPU that comes online but cannot have a ring (here one past the map's
    slots, as the online list the test gives the reader says; its poller is not
    started, so only these looks happen) is said on stderr once, however many
    looks see it, and served as a gauge; once gone it is no longer counted."""
    exporter, reader, obj = unpolled.exporter, unpolled.reader, unpolled.obj
    slots = obj.map("test_getppid_events_total").max_entries
    online = sorted(reader._buffer.cpus)
    for _ in range(3):
        reader.refresh_cpus([*online, slots])
    assert reader.unread_cpus == {slots: f"map test_getppid_events_total has {slots} "
                                  f"slots, none for CPU {slots}"}  # fmt: skip
    text = exporter.render().decode()
    assert _samples(text, "kernmlops_exporter_perf_event_array_cpus_unread") == {
        (("counter", "test_getppid_events_total"),): 1.0
    }
    lines = [line for line in capfd.readouterr().err.splitlines() if f"CPU {slots}" in line]
    assert len(lines) == 1, lines
    assert "its events are not seen" in lines[0]
    reader.refresh_cpus(online)  # the CPU goes offline again
    assert reader.unread_cpus == {}
