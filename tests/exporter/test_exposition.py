"""Exposition: what a scrape writes, parsed back with prometheus_client's
parser, and the fast writer's bytes against prometheus_client's own."""

from __future__ import annotations

import struct
import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kernmlops.exporter.config import CounterSpec, DecoderSpec, HistogramSpec, LabelSpec
from kernmlops.exporter.core import MetricReader, _Families, escape_label_value
from kernmlops.exporter.decoders import DecoderContext
from kernmlops.exporter.histogram import Buckets
from kernmlops.exporter.server import ListenError, MetricsServer, parse_listen


class FakeReader:
    """Stands in for a BPF map: keys (bytes) and u64 values, as MapReader gives."""

    def __init__(self, rows: dict[bytes, list[int]]) -> None:
        self.rows = rows

    def read(self) -> tuple[list[bytes], np.ndarray]:
        keys = list(self.rows)
        return keys, np.array([self.rows[k] for k in keys], dtype=np.uint64).reshape(len(keys), -1)


def key(comm: bytes, op: int) -> bytes:
    return comm.ljust(16, b"\0") + struct.pack("<I", op)


LABELS = [
    LabelSpec(name="comm", size=16, decoders=[DecoderSpec(name="comm")]),
    LabelSpec(
        name="op",
        size=4,
        decoders=[DecoderSpec(name="static_map", static_map={"0": "read", "1": "write"})],
    ),
]
HIST = HistogramSpec(
    name="test_io_latency_seconds",
    help='latency\nwith "odd" \\ help',
    map="m",
    labels=LABELS,
    bucket_type="exp2",
    bucket_max=3,
    bucket_multiplier=1e-6,
)
COUNTER = CounterSpec(
    name="test_io_bytes_total", help="bytes", map="m", labels=LABELS, value_multiplier=0.5
)


def reader(spec, rows, limit: int = 100) -> MetricReader:
    return MetricReader("test", spec, FakeReader(rows), DecoderContext(), limit)


def both_ways(metric: MetricReader) -> tuple[bytes, bytes]:
    snap = metric.snapshot()
    out: list[str] = []
    metric.text(snap, out)
    return "".join(out).encode(), generate_latest(_Families([metric.family(snap)]))


def test_histogram_exposition_is_cumulative_with_inf_sum_and_count() -> None:
    rows = {
        key(b"dd", 1): [0, 2, 3, 1, 4, 1234],  # 4 bucket slots, overflow, sum (µs)
        key(b"dd", 0): [1, 0, 0, 0, 0, 1],
        key(b"fio", 1): [0, 0, 0, 5, 0, 40],
    }
    fast, reference = both_ways(reader(HIST, rows))
    assert fast == reference
    (family,) = text_string_to_metric_families(fast.decode())
    assert family.name == "test_io_latency_seconds" and family.type == "histogram"
    assert family.documentation == 'latency\nwith "odd" \\ help'
    got = {}
    for s in family.samples:
        labels = dict(s.labels)
        got[(s.name, labels.pop("comm"), labels.pop("op"), labels.pop("le", None))] = s.value
        assert not labels
    name = "test_io_latency_seconds"
    dd_write = [got[(f"{name}_bucket", "dd", "write", le)] for le in Buckets.from_spec(HIST).le]
    assert dd_write == [0, 2, 5, 6, 10]  # cumulative, +Inf includes the overflow slot
    assert got[(f"{name}_count", "dd", "write", None)] == 10
    assert got[(f"{name}_sum", "dd", "write", None)] == pytest.approx(1234e-6)
    assert got[(f"{name}_bucket", "dd", "read", "1e-06")] == 1
    assert got[(f"{name}_count", "fio", "write", None)] == 5
    assert fast.count(b"_bucket{") == 3 * 5


def test_counter_exposition_and_keys_that_decode_alike_are_summed() -> None:
    rows = {
        key(b"dd", 1): [10],
        key(b"dd", 7): [4],  # unknown:7
        key(b"dd\0junk", 1): [6],  # the same label set as (dd, write): summed
    }
    fast, reference = both_ways(reader(COUNTER, rows))
    assert fast == reference
    (family,) = text_string_to_metric_families(fast.decode())
    assert family.type == "counter" and family.name == "test_io_bytes"
    values = {(s.labels["comm"], s.labels["op"]): s.value for s in family.samples}
    assert values == {("dd", "write"): 8.0, ("dd", "unknown:7"): 2.0}  # x value_multiplier


def test_label_values_are_escaped_like_prometheus_client() -> None:
    rows = {key(b'a"b\\c\nd', 0): [3], key(b"", 1): [1]}
    fast, reference = both_ways(reader(COUNTER, rows))
    assert fast == reference
    (family,) = text_string_to_metric_families(fast.decode())
    assert {s.labels["comm"] for s in family.samples} == {'a"b\\c\nd', ""}
    assert escape_label_value('x"\\\n') == 'x\\"\\\\\\n'


def test_metric_without_labels() -> None:
    spec = HistogramSpec(
        name="test_runq_seconds", help="h", map="m", bucket_type="exp2zero", bucket_max=2
    )
    fast, reference = both_ways(reader(spec, {b"\0\0\0\0": [1, 2, 3, 4, 99]}))
    assert fast == reference
    assert b"test_runq_seconds_count 10.0\n" in fast and b"test_runq_seconds_sum 99.0\n" in fast
    counter = CounterSpec(name="test_things", help="h", map="m")
    fast, reference = both_ways(reader(counter, {b"\0": [5]}))
    head = b"# HELP test_things_total h\n# TYPE test_things_total counter\n"
    assert fast == reference == head + b"test_things_total 5.0\n"


def _served(metric: MetricReader) -> dict[tuple[str, str], float]:
    (family,) = text_string_to_metric_families(both_ways(metric)[0].decode())
    return {(s.labels["comm"], s.labels["op"]): s.value for s in family.samples}


def test_cardinality_limit_serves_the_recently_changed_and_counts_the_rest() -> None:
    rows = {key(f"c{i}".encode(), 0): [i] for i in range(10)}
    metric = reader(COUNTER, rows, limit=4)
    # all new (c0 too, at 0): the first seen are served
    assert _served(metric) == {(f"c{i}", "read"): i / 2 for i in range(4)}
    assert metric.dropped == 6
    rows[key(b"c0", 1)] = [1]  # a new label set, and c7 and c8 count on: they are served
    rows[key(b"c7", 0)] = [70]
    rows[key(b"c8", 0)] = [80]
    assert _served(metric) == {
        ("c0", "write"): 0.5, ("c7", "read"): 35.0, ("c8", "read"): 40.0, ("c0", "read"): 0.0,
    }  # fmt: skip
    assert metric.dropped == 7
    # nothing changes: the same ones stay
    assert set(_served(metric)) == {("c0", "write"), ("c7", "read"), ("c8", "read"), ("c0", "read")}
    # the limit is on what the map holds now: once keys leave it, all fit
    for i in range(10):
        if i not in (7, 8):
            del rows[key(f"c{i}".encode(), 0)]
    assert _served(metric) == {("c0", "write"): 0.5, ("c7", "read"): 35.0, ("c8", "read"): 40.0}
    assert metric.dropped == 0


def test_keys_that_churn_are_served_and_forgotten() -> None:
    """An LRU map's keys come and go (comms, cgroups): every scrape serves what
    the map holds now, however many label sets came before (the limit held
    them forever), and those gone are forgotten (memory stays bounded)."""
    metric = reader(COUNTER, {}, limit=1500)
    rows = metric.reader.rows
    for batch in range(12):
        rows.clear()
        rows.update({key(f"b{batch}-{i}".encode(), 1): [2 * i] for i in range(1000)})
        assert _served(metric) == {(f"b{batch}-{i}", "write"): float(i) for i in range(1000)}
        assert metric.dropped == 0
        assert len(metric._labelsets) <= 4096 + 1000  # 12,000 seen in all
        assert len(metric._index) <= len(metric._labelsets)


def test_decoder_errors_are_counted_per_label_and_regexp_drops_are_not() -> None:
    labels = [
        LabelSpec(name="nr", size=4, decoders=[DecoderSpec(name="errno")]),
        LabelSpec(
            name="comm",
            size=4,
            decoders=[DecoderSpec(name="string"), DecoderSpec(name="regexp", regexps=["^k"])],
        ),
    ]
    spec = CounterSpec(name="test_errs", help="h", map="m", labels=labels)
    rows = {
        struct.pack("<I", 2) + b"kw\0\0": [1],
        struct.pack("<I", 9999) + b"kw\0\0": [1],  # no such errno
        struct.pack("<I", 2) + b"xx\0\0": [1],  # dropped by the regexp
    }
    metric = reader(spec, rows)
    (family,) = text_string_to_metric_families(both_ways(metric)[0].decode())
    assert [dict(s.labels) for s in family.samples] == [{"nr": "ENOENT", "comm": "kw"}]
    assert metric.decoder_errors == {"nr": 1}
    both_ways(metric)  # tried again at this scrape, but the same key: not counted again
    assert metric.decoder_errors == {"nr": 1}


def _scrape(metric: MetricReader, label: str) -> dict[str, float]:
    (family,) = text_string_to_metric_families(both_ways(metric)[0].decode())
    return {s.labels[label]: s.value for s in family.samples}


def test_an_undecodable_key_is_counted_once_until_it_leaves() -> None:
    label = LabelSpec(name="err", size=4, decoders=[DecoderSpec(name="errno")])
    spec = CounterSpec(name="test_err_total", help="h", map="m", labels=[label])
    bad = struct.pack("<I", 4000)  # no errno
    rows = {struct.pack("<I", 2): [1], bad: [5]}
    metric = MetricReader("test", spec, FakeReader(rows), DecoderContext(), 100)
    for _ in range(3):  # the same undecodable key at every scrape: one error, not three
        assert _scrape(metric, "err") == {"ENOENT": 1}
        assert metric.decoder_errors == {"err": 1}
    del rows[bad]  # it leaves the map; when it comes back it is counted again
    assert _scrape(metric, "err") == {"ENOENT": 1} and metric.decoder_errors == {"err": 1}
    rows[bad] = [6]
    for _ in range(2):
        assert _scrape(metric, "err") == {"ENOENT": 1} and metric.decoder_errors == {"err": 2}


class FakeEvents(FakeReader):
    """Stands in for a perf event array's counts (maps.EventCounts): samples
    counted per key, those of keys not settled also kept apart until taken."""

    def __init__(self) -> None:
        super().__init__({})
        self.name = "events"
        self.settled = lambda _key: False
        self.unsettled: dict[bytes, int] = {}

    def sample(self, key: bytes, n: int = 1) -> None:
        self.rows[key] = [self.rows.get(key, [0])[0] + n]
        if not self.settled(key):
            self.unsettled[key] = self.unsettled.get(key, 0) + n

    def read(self) -> tuple[list[bytes], np.ndarray]:
        if not self.rows:  # flushed
            return [], np.zeros((0, 1), np.uint64)
        return super().read()

    def take_unsettled(self) -> dict[bytes, int]:
        taken, self.unsettled = self.unsettled, {}
        return taken


def test_an_event_readers_undecodable_samples_count_each() -> None:
    """Samples of a perf event array whose key does not decode count once per
    sample, as ebpf_exporter counts them, those of a key seen at every scrape
    included, and those a flush forgot before any scrape saw them too; the
    samples of keys that decode are not kept apart once the key is known."""
    label = LabelSpec(name="err", size=4, decoders=[DecoderSpec(name="errno")])
    spec = CounterSpec(name="test_err_total", help="h", map="m", labels=[label])
    events = FakeEvents()
    metric = MetricReader("test", spec, events, DecoderContext(), 100)
    good, bad, other_bad = (struct.pack("<I", n) for n in (2, 4000, 4001))
    events.sample(good, 3)
    events.sample(bad, 5)
    assert _scrape(metric, "err") == {"ENOENT": 3}
    assert metric.decoder_errors == {"err": 5}
    events.sample(good, 2)
    assert events.unsettled == {}  # a key known to decode is not kept apart
    events.sample(bad, 4)
    assert _scrape(metric, "err") == {"ENOENT": 5}
    assert metric.decoder_errors == {"err": 9}  # the same key again: each sample counts
    events.sample(other_bad, 7)
    events.rows.clear()  # a flush before the next scrape
    assert _scrape(metric, "err") == {}
    assert metric.decoder_errors == {"err": 16}
    assert _scrape(metric, "err") == {} and metric.decoder_errors == {"err": 16}


def test_a_removed_cgroups_value_is_kept(tmp_path) -> None:
    """CPU time of a cgroup removed before a scrape: served as
    unknown_cgroup_id:N (ebpf_exporter's label) when no walk saw it, under its
    path when one did; no decoder error. (Removed: moved out of the tree, as an
    inode freed by rmdir could come back, which a cgroup id never does.)"""
    import os

    from kernmlops.exporter.decoders import CgroupPaths

    root, away = tmp_path / "cg", tmp_path / "away"
    (root / "seen").mkdir(parents=True)
    away.mkdir()
    seen = os.stat(root / "seen").st_ino
    rows = {struct.pack("<Q", os.stat(root).st_ino): [1], struct.pack("<Q", seen): [2]}
    label = LabelSpec(name="cgroup", size=8, decoders=[DecoderSpec(name="cgroup")])
    spec = CounterSpec(name="test_cg_total", help="h", map="m", labels=[label])
    ctx = DecoderContext(cgroups=CgroupPaths(root))
    metric = MetricReader("test", spec, FakeReader(rows), ctx, 100)
    assert _scrape(metric, "cgroup") == {"/": 1, "/seen": 2}
    (root / "brief").mkdir()  # made and removed between two scrapes
    brief = os.stat(root / "brief").st_ino
    (root / "brief").rename(away / "brief")
    (root / "seen").rename(away / "seen")
    rows[struct.pack("<Q", brief)] = [7]
    rows[struct.pack("<Q", seen)] = [3]
    for _ in range(2):
        got = _scrape(metric, "cgroup")
        assert got == {"/": 1, "/seen": 3, f"unknown_cgroup_id:{brief}": 7}
        assert metric.decoder_errors == {}


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9435") == ("127.0.0.1", 9435)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen("localhost:80") == ("localhost", 80)
    for bad, why in [
        (":9435", "give the host"),
        ("9435", "expected HOST:PORT"),
        ("127.0.0.1:http", "expected HOST:PORT"),
        ("127.0.0.1:70000", "out of range"),
    ]:
        with pytest.raises(ListenError, match=why):
            parse_listen(bad)


def test_server_serves_metrics_on_loopback_and_stops() -> None:
    calls = []

    def render() -> bytes:
        calls.append(1)
        return b"# HELP x_total x\n# TYPE x_total counter\nx_total 1.0\n"

    server = MetricsServer(render, "127.0.0.1", 0).start()
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.port > 0
        with urllib.request.urlopen(server.url, timeout=60) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            family, *server_own = text_string_to_metric_families(resp.read().decode())
        assert family.samples[0].value == 1.0 and calls == [1]
        # the server's own health follows what render() gave
        assert {f.name for f in server_own} == {
            "kernmlops_exporter_http_connections",
            "kernmlops_exporter_http_responses",
            "kernmlops_exporter_http_connections_closed",
        }
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(server.url.replace("/metrics", "/nope"), timeout=60)
        assert info.value.code == 404
        with pytest.raises(ListenError, match="cannot listen"):
            MetricsServer(render, "127.0.0.1", server.port)  # taken
    finally:
        server.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url, timeout=2)


def test_a_failing_scrape_answers_500_and_the_server_lives_on() -> None:
    state = {"fail": True}

    def render() -> bytes:
        if state["fail"]:
            raise RuntimeError("map gone")
        return b"ok 1.0\n"

    with MetricsServer(render, "127.0.0.1", 0) as server:
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(server.url, timeout=60)
        assert info.value.code == 500 and b"map gone" in info.value.read()
        state["fail"] = False
        with urllib.request.urlopen(server.url, timeout=60) as resp:
            assert resp.read().startswith(b"ok 1.0\n# HELP kernmlops_exporter_http")


def test_job_filter_settings() -> None:
    from kernmlops.exporter.core import ExporterError, JobFilter

    assert JobFilter().globals() == {} and not JobFilter().active
    got = JobFilter(tgid=42, comm="a-very-long-thread-name").globals()
    # the kernel keeps 15 characters of a name, NUL-terminated in 16 bytes
    assert got["exp_tgid"] == 42 and got["exp_comm_on"] == 1
    assert got["exp_comm"].to_bytes(16, "little") == b"a-very-long-thr\0"
    with pytest.raises(ExporterError, match="a process id is positive"):
        JobFilter(tgid=0).globals()


def test_bulk_float_texts_match_prometheus_client() -> None:
    from prometheus_client.utils import floatToGoString

    from kernmlops.exporter.core import float_texts

    values = [0.0, 1.0, 0.5, 1e-7, 999999.0, 1e6, 1234567.5, 2.0**53, 1e16, 3e22]
    values += [float("inf"), float("-inf"), float("nan"), -2.5, -1e7, 123456.789]
    assert float_texts(np.array(values)) == [floatToGoString(v) for v in values]
    assert float_texts(np.zeros((0, 3))) == []
    table = np.array([[1.0, 2e6], [3.0, 4.5]])  # rows in order
    assert float_texts(table) == ["1.0", "2e+06", "3.0", "4.5"]


def test_plain_text_of_own_metrics_matches_generate_latest() -> None:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from kernmlops.exporter.core import plain_text

    gauge = GaugeMetricFamily("t_gauge", 'help "with" \\ and\nnewline', labels=["set", "b"])
    gauge.add_metric(['odd "value" \\ \n', "x"], 1.0)
    gauge.add_metric(["plain", "y"], 2.5e6)
    counter = CounterMetricFamily("t_runs", "runs", labels=["program"])
    counter.add_metric(["p1"], 12345678.0)
    bare = GaugeMetricFamily("t_bare", "no labels")
    bare.add_metric([], 0.25)
    empty = CounterMetricFamily("t_empty", "no samples", labels=["x"])
    families = [gauge, counter, bare, empty]
    assert plain_text(families).encode() == generate_latest(_Families(families))


def test_large_counts_written_as_prometheus_client_writes_them() -> None:
    rows = {key(b"big", 0): [2_000_000, 3, 0, 1_500_000, 7, 10**12]}
    text, reference = both_ways(reader(HIST, rows))
    assert text == reference
    text, reference = both_ways(reader(COUNTER, {key(b"big", 1): [12_345_678]}))
    assert text == reference


def test_repeated_scrapes_follow_label_sets_that_come_and_go() -> None:
    """The text before each value is kept between scrapes: a scrape after a
    label set appeared (or went) still writes what prometheus_client writes."""
    rows = {key(b"a", 0): [1, 2, 3, 4, 5, 6], key(b"b", 1): [0, 0, 1, 0, 0, 9]}
    metric = reader(HIST, rows)
    first = both_ways(metric)
    assert first[0] == first[1]
    assert both_ways(metric) == first
    rows[key(b"c", 0)] = [5, 0, 0, 0, 0, 1]
    text, reference = both_ways(metric)
    assert text == reference and b'comm="c"' in text
    del rows[key(b"a", 0)]
    text, reference = both_ways(metric)
    assert text == reference and b'comm="a"' not in text


def test_scrapes_total_counts_renders_and_says_so() -> None:
    """Eight concurrent scrapes of a slow render share it: the counter counts the
    renders (the render function's own calls), fewer than the 200s answered, and
    its HELP says renders, not scrapes served."""
    import threading
    import time

    from kernmlops.exporter.core import Exporter

    exporter = Exporter([])
    exporter.start()
    calls = []

    def render() -> bytes:
        calls.append(1)
        if len(calls) == 1:
            # slow until every scrape arrived (their requests read and waiting on it),
            # not for a fixed 0.3 s: in CI's idle lane their threads may take longer
            deadline = time.monotonic() + 60
            while sum(c.busy for c in list(server._conns.values())) < 8:
                assert time.monotonic() < deadline, "the 8 scrapes never all arrived"
                time.sleep(0.01)
        return exporter.render()

    bodies: list[str] = []
    with MetricsServer(render, "127.0.0.1", 0) as server:
        url = f"http://127.0.0.1:{server.port}/metrics"

        def scrape() -> None:
            with urllib.request.urlopen(url, timeout=60) as resp:
                assert resp.status == 200
                bodies.append(resp.read().decode())

        threads = [threading.Thread(target=scrape) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        scrape()  # one more, alone
    families = {f.name: f for f in text_string_to_metric_families(bodies[-1])}
    scrapes = families["kernmlops_exporter_scrapes"]
    assert scrapes.documentation.startswith("renders of the metrics")
    assert scrapes.samples[0].value == len(calls) < len(bodies) == 9
    responses = families["kernmlops_exporter_http_responses"].samples
    assert [s.value for s in responses if s.labels == {"code": "200"}] == [8]  # before this one


def test_build_info_names_the_version_python_and_kernel() -> None:
    import os
    import platform
    from importlib.metadata import version

    from kernmlops.exporter.core import Exporter

    exporter = Exporter([])
    exporter.start()
    families = {f.name: f for f in text_string_to_metric_families(exporter.render().decode())}
    (sample,) = families["kernmlops_exporter_build_info"].samples
    assert families["kernmlops_exporter_build_info"].type == "gauge" and sample.value == 1
    assert sample.labels == {
        "version": version("kernmlops"),
        "pythonversion": platform.python_version(),
        "kernel": os.uname().release,
    }
