"""ebpf_exporter's tracing spans without the kernel: configs, the span a
record's labels make (ids, times, name, attributes, as its tracing package
makes them), the pipeline's spans as the SDK hands them to an exporter, and
the one-line errors of a config or environment that cannot send spans."""

from __future__ import annotations

import random
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import yaml
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kernmlops.exporter.config import MetricSetError, load_metric_set
from kernmlops.exporter.decoders import DecoderContext, DropLabelSet, label_decoders
from kernmlops.exporter.tracing import (
    AT_EXIT,
    CONFIG_ATTRIBUTE,
    EXPORT_FAILED,
    QUEUE_FULL,
    SCOPE,
    START_UP,
    SpanError,
    SpanPipeline,
    SpanRecord,
    SpanSpec,
    batch_sizes,
    check_available,
    decode_record,
    send_startup,
    span_exporter,
    span_from_labels,
)

CONFIGS = Path(__file__).parent / "ebpf_exporter"


def _label(name: str, size: int, decoder: str = "hex", **more: object) -> dict:
    return {"name": name, "size": size, "decoders": [{"name": decoder}], **more}


BASE = [
    _label("trace_id", 16),
    _label("parent_span_id", 8),
    _label("span_id", 8),
    _label("span_monotonic_timestamp_ns", 8, "uint"),
    _label("span_duration_ns", 8, "uint"),
]


def _write(tmp_path: Path, data: dict, name: str = "spans") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _spec(**fields: object) -> SpanSpec:
    return SpanSpec(**{"ringbuf": "ring", "labels": [], **fields})  # type: ignore[arg-type]


NAMES = ["trace_id", "parent_span_id", "span_id", "span_monotonic_timestamp_ns"]
NAMES += ["span_duration_ns"]
TRACE = "00000000000004d2000000000000162e"


def test_labels_make_the_span() -> None:
    values = [TRACE, "1100000000000000", "2200000000000000", "5000", "750"]
    span = span_from_labels(
        [*NAMES, "cpu.orig", "span_name"],
        [*values, "3", "/bin/ls"],
        _spec(name="exec"),
        "exec-trace",
        wall_ns=1_700_000_000_000_000_000,
        monotonic_ns=8000,
    )
    assert span == SpanRecord(
        name="/bin/ls",  # span_name replaces the configured name
        trace_id=int(TRACE, 16),
        span_id=0x2200000000000000,
        parent_span_id=0x1100000000000000,
        start_ns=1_700_000_000_000_000_000 - 3000,  # 3 us before "now" in monotonic time
        end_ns=1_700_000_000_000_000_000 - 3000 + 750,
        attributes={"cpu.orig": "3", CONFIG_ATTRIBUTE: "exec-trace"},
    )


def test_absent_ids_are_made_up_as_the_sdk_does() -> None:
    rng = random.Random(7)
    nil = "0" * 16
    root = span_from_labels(NAMES, [TRACE, nil, nil, "1", "0"], _spec(), "c", rng=rng)
    assert root.parent_span_id == 0  # a root span
    assert root.trace_id == int(TRACE, 16)  # its trace kept
    assert root.span_id != 0  # one made up
    assert root.name == "ring"  # no name: the ring's
    # no trace id at all: a new trace, and a new span id whatever the label said
    lone = span_from_labels(["span_id"], ["2200000000000000"], _spec(), "c", rng=rng)
    assert lone.trace_id != 0 and lone.span_id not in (0, 0x2200000000000000)
    # no time labels: now, zero long
    assert lone.start_ns == lone.end_ns > 0


@pytest.mark.parametrize(
    ("label", "value", "message"),
    [
        ("trace_id", "0" * 32, "trace_id '0000", ),
        ("trace_id", "abc", "not 32 lower-case hex digits"),
        ("trace_id", "A" * 32, "not 32 lower-case hex digits"),
        ("span_id", "12345678", "not 16 lower-case hex digits"),
        ("parent_span_id", "zz00000000000000", "not 16 lower-case hex digits"),
        ("span_monotonic_timestamp_ns", "-5", "not an unsigned 64-bit decimal"),
        ("span_duration_ns", "18446744073709551616", "not an unsigned 64-bit decimal"),
        ("span_duration_ns", "1_000", "not an unsigned 64-bit decimal"),
    ],
)  # fmt: skip
def test_values_that_make_no_span(label: str, value: str, message: str) -> None:
    with pytest.raises(SpanError, match=message):
        span_from_labels([label], [value], _spec(), "c")


def test_records_are_cut_to_the_labels_and_decoded(tmp_path: Path) -> None:
    """A record decodes as a map key does: ebpf_exporter's padding after a
    label, decoders' chains, a record longer than the labels cut to them."""
    labels = [*BASE, _label("op", 4, "uint", padding=4)]
    labels[-1]["decoders"].append({"name": "static_map", "static_map": {1: "write"}})
    ms = load_metric_set(
        _write(tmp_path, {"tracing": {"spans": [{"ringbuf": "r", "labels": labels}]}})
    )
    (spec,) = ms.spans
    assert spec.record_bytes == 56  # 48 + 4 + its 4 of padding
    decoders = label_decoders(spec.labels, DecoderContext(), flavor="ebpf_exporter")
    trace = struct.pack("<QQ", 0x4D2, 0x162E)
    record = trace + struct.pack("<QQQQ", 0, 0x99, 10, 20) + struct.pack("<I4x", 1) + b"tail"
    span = decode_record(record, spec, decoders, "x")
    assert span.trace_id == int(trace.hex(), 16)  # the bytes in hex, as the hex decoder gives
    assert span.span_id == int(struct.pack("<Q", 0x99).hex(), 16)
    assert span.attributes == {"op": "write", CONFIG_ATTRIBUTE: "x"}
    assert span.end_ns - span.start_ns == 20
    with pytest.raises(SpanError, match="the record has 55 bytes but the labels span 56"):
        decode_record(record[:55], spec, decoders, "x")


def test_a_regexp_that_does_not_match_drops_the_span(tmp_path: Path) -> None:
    comm = {"name": "comm", "size": 8, "decoders": [{"name": "string"}]}
    comm["decoders"].append({"name": "regexp", "regexps": ["^kmo"]})
    data = {"tracing": {"spans": [{"ringbuf": "r", "labels": [comm]}]}}
    (spec,) = load_metric_set(_write(tmp_path, data)).spans
    decoders = label_decoders(spec.labels, DecoderContext(), flavor="ebpf_exporter")
    assert decode_record(b"kmo-a\0\0\0", spec, decoders, "x").attributes["comm"] == "kmo"
    with pytest.raises(DropLabelSet):
        decode_record(b"bash\0\0\0\0", spec, decoders, "x")


def test_a_config_of_spans_only(tmp_path: Path) -> None:
    span = {"name": "exec", "ringbuf": "exec_spans", "service": "exec-trace", "labels": BASE}
    ms = load_metric_set(_write(tmp_path, {"tracing": {"spans": [span]}}, "exec-trace"))
    assert ms.name == "exec-trace" and ms.metrics == []
    (spec,) = ms.spans
    assert (spec.span_name, spec.ringbuf, spec.service) == ("exec", "exec_spans", "exec-trace")
    # beside metrics, in one config
    ms = load_metric_set(CONFIGS / "span-trace.yaml")
    assert [s.span_name for s in ms.spans] == ["getppid", "process"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"tracing": {"spans": [{"labels": BASE}]}}, "tracing.spans[0].ringbuf: Field required"),
        ({"tracing": {"spans": [{"ringbuf": "r", "servce": "x"}]}}, "did you mean 'service'"),
        ({"tracing": {"spans": [{"ringbuf": "r", "labels": [_label("x", 0)]}]}},
         "labels[0] (x).size"),
        ({"tracing": {"spans": [{"ringbuf": "r"}, {"ringbuf": "r", "name": "b"}]}},
         "tracing spans read ring r twice"),
        ({"tracing": {"spans": []}}, "neither metrics nor tracing are defined"),
        ({"tracing": {"span": []}}, "did you mean 'spans'"),
    ],
)  # fmt: skip
def test_bad_span_configs_get_one_clear_error(tmp_path: Path, data: dict, message: str) -> None:
    with pytest.raises(MetricSetError) as err:
        load_metric_set(_write(tmp_path, data))
    assert message in str(err.value), str(err.value)


def test_the_pipeline_hands_the_sdk_finished_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids, parent, times and attributes reach the exporter as given; the
    resource is the span's service over OTEL_RESOURCE_ATTRIBUTES, and a span
    of no service is OTEL_SERVICE_NAME's, else ebpf_exporter's."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "host.name=box,service.name=env")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    memory = InMemorySpanExporter()
    pipeline = SpanPipeline(memory)
    root = SpanRecord("root", 0xAB, 0x11, 0, 1000, 5000, {CONFIG_ATTRIBUTE: "c"})
    child = SpanRecord("child", 0xAB, 0x22, 0x11, 2000, 3000, {"k": "v"})
    pipeline.emit(root, "kernel")
    pipeline.emit(child, "")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "mine")
    pipeline.emit(SpanRecord("other", 0xCD, 0x33, 0, 1, 2), "")
    pipeline.shutdown()
    got = {s.name: s for s in memory.get_finished_spans()}
    assert set(got) == {"root", "child", "other"}
    r, c = got["root"], got["child"]
    assert (r.context.trace_id, r.context.span_id, r.parent) == (0xAB, 0x11, None)
    assert c.parent is not None and (c.parent.trace_id, c.parent.span_id) == (0xAB, 0x11)
    assert (c.start_time, c.end_time, dict(c.attributes)) == (2000, 3000, {"k": "v"})
    assert r.context.trace_flags.sampled
    assert r.instrumentation_scope.name == SCOPE
    assert r.resource.attributes["service.name"] == "kernel"
    assert r.resource.attributes["host.name"] == "box"
    assert c.resource.attributes["service.name"] == "ebpf_exporter"
    assert got["other"].resource.attributes["service.name"] == "mine"


def test_the_environment_chooses_the_exporter() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    assert isinstance(span_exporter({}), OTLPSpanExporter)  # autoexport's default
    assert isinstance(span_exporter({"OTEL_TRACES_EXPORTER": "console"}), ConsoleSpanExporter)
    assert span_exporter({"OTEL_TRACES_EXPORTER": "none"}) is None
    check_available({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    with pytest.raises(MetricSetError, match="OTEL_TRACES_EXPORTER='zipkin' is not one of"):
        check_available({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(
        MetricSetError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json' is not one of"
    ):
        check_available({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"})


def _export(args: list[str], blocked: list[str], env: dict[str, str] | None = None):
    """``kernmlops export ARGS`` with the modules ``blocked`` not importable."""
    code = textwrap.dedent(f"""
        import sys
        for name in {blocked!r}:
            sys.modules[name] = None
        sys.argv = ["kernmlops", "export", *{args!r}]
        from kernmlops.cli import main
        main()
    """)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    ("blocked", "env", "message"),
    [
        (["opentelemetry"], {}, "pip install 'kernmlops[tracing]'"),
        (["opentelemetry.exporter.otlp.proto.grpc"], {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
         "OTLP/grpc: pip install opentelemetry-exporter-otlp-proto-grpc"),
        ([], {"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER='jaeger'"),
    ],
)  # fmt: skip
def test_a_tracing_config_that_cannot_send_says_so_in_one_line(
    blocked: list[str], env: dict[str, str], message: str
) -> None:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | env
    done = _export(["--config", str(CONFIGS / "span-trace.yaml"), "--check"], blocked, full)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() + done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert message in lines[0] and "span-trace.yaml" in lines[0], lines
    assert "Traceback" not in done.stderr


class _HeldExporter:
    """A span exporter whose exports wait until ``release`` is set, then end
    as ``outcome`` says: "ok", "fail" (a FAILURE result) or "raise"."""

    def __init__(self, outcome: str = "ok") -> None:
        self.outcome = outcome
        self.release = threading.Event()
        self.entered = threading.Event()
        self.got: list[str] = []

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.entered.set()
        self.release.wait()
        if self.outcome == "raise":
            raise ConnectionError("collector gone")
        if self.outcome == "fail":
            return SpanExportResult.FAILURE
        self.got += [s.name for s in spans]
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _records(n: int) -> list[SpanRecord]:
    return [SpanRecord(f"s{i}", 0xAB, i + 1, 0, 1, 2) for i in range(n)]


def test_the_hand_off_never_lets_the_sdk_queue_drop_a_span() -> None:
    """While the exporter is held, the pipeline hands over as many spans as
    the queue holds and counts each later one as queue_full (the newest, as
    Go's processor drops): the exporter then gets exactly those handed over,
    the SDK having dropped none of them unseen."""
    held = _HeldExporter()
    env = {"OTEL_BSP_MAX_QUEUE_SIZE": "8", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4"}
    pipeline = SpanPipeline(held, env)
    source = ("cfg", "ring")
    handed = [pipeline.emit(r, "", source) for r in _records(30)]
    assert handed == [True] * 8 + [False] * 22
    assert pipeline.dropped_of(source) == {QUEUE_FULL: 22, EXPORT_FAILED: 0, AT_EXIT: 0}
    held.release.set()
    pipeline.shutdown()
    assert sorted(held.got) == sorted(f"s{i}" for i in range(8))
    assert pipeline.exported == {source: 8}
    assert pipeline.dropped_of(source) == {QUEUE_FULL: 22, EXPORT_FAILED: 0, AT_EXIT: 0}


@pytest.mark.parametrize("outcome", ["fail", "raise"])
def test_a_failed_export_counts_its_spans(outcome: str, capfd: pytest.CaptureFixture[str]) -> None:
    """A batch the exporter fails (a FAILURE result, or an exception the SDK
    would log with a traceback) counts each of its spans as export_failed,
    under its own source, and says so in one line at the end."""
    held = _HeldExporter(outcome)
    held.release.set()
    pipeline = SpanPipeline(held, {})
    for r in _records(5):
        assert pipeline.emit(r, "", ("a", "r1"))
    for r in _records(3):
        assert pipeline.emit(r, "", ("b", "r2"))
    pipeline.shutdown()
    assert pipeline.dropped_of(("a", "r1"))[EXPORT_FAILED] == 5
    assert pipeline.dropped_of(("b", "r2"))[EXPORT_FAILED] == 3
    assert pipeline.exported == {}
    err = capfd.readouterr().err
    assert "8 spans not sent (8 in all: 8 failed to export" in err, err
    assert "Traceback" not in err
    if outcome == "raise":
        assert "ConnectionError: collector gone" in err


def test_batch_sizes_come_from_the_environment() -> None:
    assert batch_sizes({}) == (2048, 512)  # the specification's defaults
    assert batch_sizes({"OTEL_BSP_MAX_QUEUE_SIZE": "64"}) == (64, 64)  # clamped, as in Go
    both = {"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "10"}
    assert batch_sizes(both) == (100, 10)
    for bad in ("0", "-3", "lots", "1.5"):
        with pytest.raises(MetricSetError, match=f"OTEL_BSP_MAX_QUEUE_SIZE='{bad}' is not a"):
            check_available({"OTEL_BSP_MAX_QUEUE_SIZE": bad})


def test_a_failed_start_up_step_is_an_error_span() -> None:
    """The start-up's phases become one trace, parents by index; a step that
    failed has an error status (its message) and keeps its events, as
    ebpf_exporter records a program that did not attach."""
    from opentelemetry.trace.status import StatusCode

    from kernmlops.exporter.core import StartupTrace

    trace = StartupTrace()
    root = trace.begin("attach")
    step = trace.begin("attach_module", root)
    trace.event(step, "prog_attach", SEC="kprobe/x")
    trace.event(step, "exception", **{"exception.message": "no kprobes"})
    trace.fail(step, "no kprobes")
    trace.end(step)
    trace.end(root)
    memory = InMemorySpanExporter()
    pipeline = SpanPipeline(memory, {})
    assert send_startup(pipeline, trace.phases) == 2
    pipeline.shutdown()
    got = {s.name: s for s in memory.get_finished_spans()}
    attach, module = got["attach"], got["attach_module"]
    assert module.parent is not None and module.parent.span_id == attach.context.span_id
    assert module.context.trace_id == attach.context.trace_id and attach.parent is None
    assert module.status.status_code == StatusCode.ERROR
    assert module.status.description == "no kprobes"
    assert attach.status.status_code == StatusCode.UNSET
    assert [(e.name, dict(e.attributes)) for e in module.events] == [
        ("prog_attach", {"SEC": "kprobe/x"}),
        ("exception", {"exception.message": "no kprobes"}),
    ]
    assert pipeline.exported == {START_UP: 2}
