"""ebpf_exporter's tracing spans against the kernel and a collector: the test
program (ebpf_exporter/span-trace.bpf.c) makes a trace per ``kmo-spn``
process, a root span for its life and a child span per getppid(2) call; the
exporter sends them over OTLP/HTTP (the SDK's own exporter, as configured by
OTEL_* variables) to a receiver on localhost, which decodes them with the
OTLP protobuf classes. What arrives must be the workload's own calls, linked
to its root span and timed within its own run."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families

from kernmlops.exporter.config import resolve_sets
from kernmlops.exporter.core import Exporter
from kernmlops.exporter.tracing import (
    AT_EXIT,
    CONFIG_ATTRIBUTE,
    EXPORT_FAILED,
    QUEUE_FULL,
    SCOPE,
    START_UP,
    SpanRing,
)
from tests.exporter.conftest import free_port, wait_serving

pytestmark = pytest.mark.bpf

CONFIG = Path(__file__).parent / "ebpf_exporter" / "span-trace.yaml"
SOURCE = CONFIG.with_suffix(".bpf.c")
ERRORS = "ebpf_exporter_decoder_errors_total"
DROPPED = "dropped_tracing_spans_total"
#: the spans of ebpf_exporter's start-up trace for one config without kaddrs
STARTUP_NAMES = (
    "attach", "register_handlers", "attach_configs", "attach_config", "new_module",
    "bpf_load_object", "attach_module",
)  # fmt: skip


@dataclass
class Span:
    """One received span, with its resource's service and its attributes."""

    service: str
    scope: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, str]
    #: (name, Unix ns, attributes) of each event; the status code (2: error) and message
    events: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)
    status: tuple[int, str] = (0, "")


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on localhost: POST /v1/traces, protobuf.
    With a ``gate``, a request is held (not read as received, not answered)
    until the gate is set: a collector as slow as the test wants."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if gate is not None:
                    gate.wait()
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces"
                if ok:
                    receiver._add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _add(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            self.requests += 1
            for rs in request.resource_spans:
                res = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(
                            Span(
                                service=res.get("service.name", ""),
                                scope=ss.scope.name,
                                name=s.name,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_span_id=s.parent_span_id.hex(),
                                start_ns=s.start_time_unix_nano,
                                end_ns=s.end_time_unix_nano,
                                attributes={a.key: a.value.string_value for a in s.attributes},
                                events=[
                                    (
                                        e.name,
                                        e.time_unix_nano,
                                        {a.key: a.value.string_value for a in e.attributes},
                                    )
                                    for e in s.events
                                ],
                                status=(s.status.code, s.status.message),
                            )
                        )

    def wait_for(self, pred, timeout: float = 20) -> list[Span]:
        """The spans received once ``pred(spans)`` holds, or at the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if pred(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    try:
        yield r
    finally:
        r.close()


def _otel_env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    env["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # batches sent every 100 ms, not 5 s
    return env


def _workload(comm: str, calls: int) -> tuple[int, int, int]:
    """A process named ``comm`` calls getppid ``calls`` times and exits; its
    process id and the Unix times (ns) just before it started and after it ended."""
    code = textwrap.dedent(f"""
        import os
        open("/proc/self/comm", "w").write({comm!r})
        for _ in range({calls}):
            os.getppid()
        print(os.getpid())
    """)
    before = time.time_ns()
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    after = time.time_ns()
    return int(done.stdout), before, after


def _check_trace(spans: list[Span], tgid: int, calls: int, before: int, after: int) -> None:
    """The workload's trace: one root span for the process, ``calls`` child
    spans under it, all inside the run's own times."""
    (root,) = [s for s in spans if s.name == "kmo-spn-work" and s.attributes["tgid"] == str(tgid)]
    children = [s for s in spans if s.name == "getppid" and s.trace_id == root.trace_id]
    assert len(children) == calls
    # the trace id is the record's 16 bytes in hex: trace_id_hi (tgid), then trace_id_lo
    assert root.trace_id[:16] == tgid.to_bytes(8, "little").hex()
    assert root.parent_span_id == ""  # a zero parent: the trace's root
    assert root.service == "span-test"  # the config's service
    assert root.attributes == {
        "tgid": str(tgid),
        "calls": str(calls),
        "ebpf_exporter.config": "span-trace",
    }
    assert root.scope == "github.com/cloudflare/ebpf_exporter/v2/tracing"
    # within the run, as the test's clock saw it (the kernel's monotonic time
    # turned into Unix time: 2 ms for the two clocks' reads and NTP's slewing)
    slack = 2_000_000
    assert before - slack <= root.start_ns < root.end_ns <= after + slack
    ids = set()
    for child in children:
        assert child.service == "ebpf_exporter"  # none configured: the default
        assert child.parent_span_id == root.span_id
        assert child.span_id not in ("", "0" * 16, root.span_id)  # made up: none was sent
        ids.add(child.span_id)
        assert child.attributes == {
            "thread.id": str(tgid),  # the single-threaded workload's only thread
            "syscall": "getppid",
            "ebpf_exporter.config": "span-trace",
        }
        assert root.start_ns - slack <= child.start_ns <= child.end_ns <= root.end_ns + slack
    assert len(ids) == calls
    # the calls do not overlap (one thread): their time adds up within the root's
    assert sum(c.end_ns - c.start_ns for c in children) <= root.end_ns - root.start_ns


def _sections(source: Path) -> list[str]:
    """The program sections of a .bpf.c, as its SEC("...") lines name them."""
    found = re.findall(r'SEC\("([^"]+)"\)', source.read_text())
    return [sec for sec in found if sec not in (".maps", "license")]


def _check_startup(spans: list[Span], config: str) -> None:
    """ebpf_exporter's start-up trace: ``attach`` (the root) > ``register_handlers``
    and ``attach_configs`` > ``attach_config`` {config} > ``new_module``,
    ``bpf_load_object`` and ``attach_module`` (a ``prog_attach`` {SEC} event
    per program of the .bpf.c), one trace, each span within its parent,
    the service ebpf_exporter's, the scope its tracing package's."""
    assert sorted(s.name for s in spans) == sorted(STARTUP_NAMES), [s.name for s in spans]
    by_name = {s.name: s for s in spans}
    parent_of = {
        "register_handlers": "attach", "attach_configs": "attach",
        "attach_config": "attach_configs", "new_module": "attach_config",
        "bpf_load_object": "attach_config", "attach_module": "attach_config",
    }  # fmt: skip
    root = by_name["attach"]
    assert root.parent_span_id == ""
    for name, parent in parent_of.items():
        span, up = by_name[name], by_name[parent]
        assert span.parent_span_id == up.span_id, name
        assert up.start_ns <= span.start_ns <= span.end_ns <= up.end_ns, name
    assert {s.trace_id for s in spans} == {root.trace_id}
    assert len({s.span_id for s in spans}) == len(spans)
    assert {s.service for s in spans} == {"ebpf_exporter"}
    assert {s.scope for s in spans} == {SCOPE}
    assert by_name["attach_config"].attributes == {"config": config}
    attach = by_name["attach_module"]
    assert [e[0] for e in attach.events] == ["prog_attach"] * len(attach.events)
    assert sorted(e[2]["SEC"] for e in attach.events) == sorted(_sections(SOURCE))
    assert all(attach.start_ns <= e[1] <= attach.end_ns for e in attach.events)
    assert all(s.status[0] != 2 for s in spans)  # every step went well


def _decoder_errors(text: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == ERRORS and s.labels.get("config") == "span-trace"
    )


def test_spans_reach_a_collector_over_otlp_http(tmp_path: Path, receiver: OtlpReceiver) -> None:
    """``kernmlops export`` as ebpf_exporter runs: the collector named by
    OTEL_EXPORTER_OTLP_ENDPOINT gets each process's trace; the record with a
    zero trace id is counted as a decoder error, not sent."""
    port = free_port()
    log = tmp_path / "exporter.log"
    url = f"http://127.0.0.1:{port}/metrics"
    args = ["export", "--config", str(CONFIG), "--web.listen-address", f"127.0.0.1:{port}"]
    env = _otel_env(receiver.endpoint)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernmlops", *args], stdout=out, stderr=subprocess.STDOUT,
            env=env,
        )  # fmt: skip
    try:
        wait_serving(proc, url, log)
        runs = [(_workload("kmo-spn-work", calls), calls) for calls in (40, 75)]
        want = sum(calls + 1 for _, calls in runs) + len(STARTUP_NAMES)
        spans = receiver.wait_for(lambda s: len(s) >= want)
        for (tgid, before, after), calls in runs:
            _check_trace(spans, tgid, calls, before, after)
        # nothing else: the bad records were not sent; the start-up trace was
        assert len(spans) == want, log.read_text()
        _check_startup([s for s in spans if CONFIG_ATTRIBUTE not in s.attributes], "span-trace")
        deadline = time.monotonic() + 10
        while _decoder_errors(page := wait_serving(proc, url, log).decode()) < 2:
            assert time.monotonic() < deadline, page
            time.sleep(0.2)
        assert _decoder_errors(page) == 2  # one zero-trace-id record per process
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()


def test_spans_queued_at_exit_are_flushed(receiver: OtlpReceiver, monkeypatch) -> None:
    """Spans still in the batch processor's queue when the exporter closes are
    sent before it ends (as ebpf_exporter flushes on SIGTERM): a 1-hour batch
    delay, so only the close sends them."""
    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")
    exporter = Exporter(resolve_sets([str(CONFIG)]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        assert status.attached == 3, [(p.name, p.error) for p in status.programs]
        tgid, before, after = _workload("kmo-spn-work", 25)
        time.sleep(1.0)  # several polls of the rings: read, queued, not yet sent
        assert receiver.spans == []
    finally:
        exporter.close()
    _check_trace(receiver.spans, tgid, 25, before, after)
    assert receiver.requests >= 1


def _dropped(exporter: Exporter) -> dict[tuple[str, str], float]:
    """dropped_tracing_spans_total of the span-trace config and of the start-up
    trace (ringbuf ""), by (ringbuf, reason)."""
    return {
        (s.labels["ringbuf"], s.labels["reason"]): s.value
        for family in text_string_to_metric_families(exporter.render().decode())
        for s in family.samples
        if s.name == DROPPED and s.labels["config"] in ("span-trace", "")
    }


def _by_reason(dropped: dict[tuple[str, str], float], reason: str) -> float:
    return sum(n for (_ring, r), n in dropped.items() if r == reason)


def _wait(pred, what: str, timeout: float = 60):
    """``pred()``'s value once it is true; fails with ``what`` at the timeout
    (reached only when the code is wrong)."""
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


def _only_otel(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_spans_past_the_queue_are_counted_while_the_collector_is_slow(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A collector that answers nothing until the test lets it: the exporter
    hands the SDK as many spans as its queue holds (OTEL_BSP_MAX_QUEUE_SIZE)
    and counts every later one as queue_full, so what the collector finally
    gets plus what is counted is the spans made, exactly: one per getppid
    call, one for the process, and the exporter's own start-up trace (sent
    first, so in the batch the collector holds)."""
    gate = threading.Event()
    receiver = OtlpReceiver(gate)
    queue, calls = 256, 2000
    _only_otel(
        monkeypatch,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_EXPORTER_OTLP_TIMEOUT="120",  # the held request must not time out
        OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_BSP_MAX_QUEUE_SIZE=str(queue),
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="64",
    )
    exporter = Exporter(resolve_sets([str(CONFIG)]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        assert status.attached == 3, [(p.name, p.error) for p in status.programs]
        rings = [s for s in exporter.sets[0].services if isinstance(s, SpanRing)]
        startup = len(exporter.startup.phases)
        made = calls + 1 + startup
        tgid, _before, _after = _workload("kmo-spn-work", calls)
        # the collector holds the first batch: the queue fills, the rest is counted
        full = _wait(
            lambda: (n := _by_reason(_dropped(exporter), QUEUE_FULL)) >= made - queue and n,
            "the spans past the queue were not counted",
        )
        assert full == made - queue
        gate.set()
        spans = receiver.wait_for(lambda s: len(s) >= queue, timeout=60)
        assert len(spans) == queue
        mine = [
            s for s in spans if s.attributes.get("thread.id") == str(tgid)
            or s.attributes.get("tgid") == str(tgid)
        ]  # fmt: skip
        assert len(mine) == queue - startup  # every other span sent is the workload's
        assert sorted(s.name for s in spans if s not in mine) == sorted(STARTUP_NAMES)
    finally:
        gate.set()
        exporter.close()
        receiver.close()
    # at exit: the detach trace sent (the queue is empty again), nothing more counted
    assert sorted(s.name for s in receiver.spans[queue:]) == ["close_module", "detach"]
    final = {(r.spec.ringbuf, reason): n for r in rings for reason, n in r.dropped().items()}
    final |= {("", reason): n for reason, n in rings[0].dropped(START_UP).items()}
    assert _by_reason(final, QUEUE_FULL) == made - queue
    assert _by_reason(final, EXPORT_FAILED) == _by_reason(final, AT_EXIT) == 0
    err = capfd.readouterr().err
    assert f"({made - queue} in all: " in err, err  # the last line says the whole
    assert f"over the queue of {queue}" in err, err


def test_spans_the_collector_never_gets_are_counted_as_failed(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """No collector listening: every span made is counted as export_failed
    once the exporter gives up on its batch; none as anything else."""
    port = free_port()  # nothing listens there
    _only_otel(
        monkeypatch,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",  # each batch given up after 1 s of retries
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    calls = 150
    exporter = Exporter(resolve_sets([str(CONFIG)]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        _workload("kmo-spn-work", calls)
        made = calls + 1 + len(STARTUP_NAMES)  # the start-up trace fails too
        failed = _wait(
            lambda: (n := _by_reason(_dropped(exporter), EXPORT_FAILED)) >= made and n,
            "the spans that failed to export were not counted",
        )
        assert failed == made
        dropped = _dropped(exporter)
        assert dropped[("call_spans", EXPORT_FAILED)] == calls
        assert dropped[("process_spans", EXPORT_FAILED)] == 1
        assert dropped[("", EXPORT_FAILED)] == len(STARTUP_NAMES)
        assert _by_reason(dropped, QUEUE_FULL) == _by_reason(dropped, AT_EXIT) == 0
    finally:
        exporter.close()
    err = capfd.readouterr().err
    assert f"{made} failed to export" in err, err


def _started_with_spans(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> tuple[Exporter, Any]:
    """span-trace.yaml's exporter started, its spans sent to ``receiver``; the caller
    closes it."""
    _only_otel(
        monkeypatch, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="100"
    )
    exporter = Exporter(resolve_sets([str(CONFIG)]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
    except BaseException:
        exporter.close()
        raise
    return exporter, status


def test_the_start_up_trace_is_sent_with_spans_configured(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a tracing config, the exporter's start-up is one trace, as
    ebpf_exporter sends its own; without spans configured nothing is sent (no
    pipeline is made)."""
    from kernmlops.exporter import tracing

    exporter, _status = _started_with_spans(receiver, monkeypatch)
    try:
        spans = receiver.wait_for(lambda s: len(s) >= len(STARTUP_NAMES))
        _check_startup(spans, "span-trace")
    finally:
        exporter.close()
    plain = Exporter(
        resolve_sets([str(Path(__file__).parent / "ebpf_exporter" / "perf-events.yaml")])
    )
    try:
        (status,) = plain.start()
        assert status.error is None, status.error
        assert plain.startup.phases  # timed, but not sent: no tracing config
        assert tracing._pipeline is None
    finally:
        plain.close()


def test_the_detach_trace_is_sent_at_exit(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing, the exporter sends its detach as one trace, as ebpf_exporter
    does at exit: ``detach`` > ``close_module`` {config}, a ``prog_detach``
    {SEC} event per attached program, then ``close``; flushed before close
    returns, though the span rings that held the pipeline closed first."""
    exporter, status = _started_with_spans(receiver, monkeypatch)
    try:
        attached = sorted(p.section for p in status.programs if p.attached)
        receiver.wait_for(lambda s: len(s) >= len(STARTUP_NAMES))
    finally:
        exporter.close()
    with receiver._lock:  # no wait: close() flushed it
        spans = [s for s in receiver.spans if s.name in ("detach", "close_module")]
    assert sorted(s.name for s in spans) == ["close_module", "detach"], spans
    root, module = sorted(spans, key=lambda s: s.name != "detach")
    assert root.parent_span_id == "" and module.parent_span_id == root.span_id
    assert module.trace_id == root.trace_id
    assert root.start_ns <= module.start_ns <= module.end_ns <= root.end_ns
    assert module.attributes == {"config": "span-trace"}
    names = [e[0] for e in module.events]
    assert names == ["prog_detach"] * len(attached) + ["close"], names
    assert sorted(e[2]["SEC"] for e in module.events[:-1]) == attached == sorted(_sections(SOURCE))
    assert {s.service for s in spans} == {"ebpf_exporter"}
    assert all(s.status[0] != 2 for s in spans)
    from kernmlops.exporter import tracing

    assert tracing._pipeline is None  # released: nothing holds it after close
