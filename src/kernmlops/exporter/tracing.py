"""ebpf_exporter's tracing spans: records a program submits to a ring buffer,
decoded with the label decoders of its metrics and sent as OpenTelemetry spans.

A config's ``tracing: spans:`` names, per kind of span, the ring buffer to read
(``ringbuf``), the span's name (``name``, else the ring's), its service
(``service``, else ``OTEL_SERVICE_NAME``, else ``ebpf_exporter``) and the
labels that lay out the record, decoded as a map key's are. Labels with these
names make the span rather than an attribute, as in ebpf_exporter:

- ``trace_id`` (32 hex digits), ``span_id`` and ``parent_span_id`` (16 each;
  ``0000000000000000``: none, a span id is then made up, a span without a
  parent is a trace's root);
- ``span_monotonic_timestamp_ns`` (``bpf_ktime_get_ns()``) and
  ``span_duration_ns``, decimal;
- ``span_name``, which replaces the configured name.

Every other label becomes a string attribute, and ``ebpf_exporter.config``
names the config. A record longer than the labels is cut to them; a record
that cannot be decoded counts in ``ebpf_exporter_decoder_errors_total`` and
is logged; one a decoder drops (a regexp that does not match) is skipped.

The spans are sent as ebpf_exporter's ``autoexport`` sends them, set by the
standard environment: ``OTEL_TRACES_EXPORTER`` (``otlp``, the default,
``console`` or ``none``), ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``
(``http/protobuf``, the default, or ``grpc``), ``OTEL_EXPORTER_OTLP_ENDPOINT``
and the other ``OTEL_EXPORTER_OTLP_*`` and ``OTEL_BSP_*`` settings, which the
OpenTelemetry SDK reads itself. The SDK is an optional dependency
(``pip install 'kernmlops[tracing]'``), imported only when a config has spans.

With spans configured, the exporter's own start-up is sent as one trace too,
as ebpf_exporter sends its own (``send_startup``): ``attach`` >
``register_handlers``, ``attach_configs`` > ``attach_config`` {config} >
``new_module``, ``pass_kaddrs``, ``bpf_load_object``, ``attach_module``; and
its close at exit (``detach`` > ``close_module`` {config}), as ebpf_exporter's
``Detach`` sends it.

Every span made but not exported is counted, by config, ring and reason, and
served as ``dropped_tracing_spans_total`` (ebpf_exporter's Go SDK counts the
spans its batch processor drops only inside itself): the SDK's own queue drops
the oldest span when full and counts it nowhere we can read, so the pipeline
never lets it fill. It hands a span to the SDK only while fewer than
``OTEL_BSP_MAX_QUEUE_SIZE`` spans are between the hand-off and the end of their
export (which an exporter wrapper sees); past that the new span is dropped here
(``queue_full``, as Go's processor drops the newest), a batch the exporter
fails to send (the collector down, refusing, too slow) counts as
``export_failed``, and what is still unsent when the exporter ends (the final
flush failed or timed out) as ``at_exit``. Spans made = spans exported + spans
counted there, exactly.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import random
import re
import select
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from kernmlops.ebpf.ringbuf import RingBuffer
from kernmlops.exporter.decoders import (
    DecodeError,
    DecoderContext,
    DropLabelSet,
    LabelDecodeError,
    LabelDecoder,
    label_decoders,
)
from kernmlops.exporter.spec import EBPF_EXPORTER_FORMAT, LabelSpec, MetricSetError, _Strict
from kernmlops.exporter.throttled import ThrottledCount

if TYPE_CHECKING:
    from kernmlops.ebpf.objects import Map

#: ebpf_exporter's instrumentation scope (its tracing package's import path)
SCOPE = "github.com/cloudflare/ebpf_exporter/v2/tracing"
#: the attribute naming the config a span came from
CONFIG_ATTRIBUTE = "ebpf_exporter.config"
#: the service of spans whose config names none, when OTEL_SERVICE_NAME is unset
DEFAULT_SERVICE = "ebpf_exporter"
NIL_SPAN_ID = "0" * 16
#: how long a poll of a ring waits (ebpf_exporter polls its rings with 325 ms)
POLL_MS = 325
#: at most one line about undecodable spans per this many seconds
ERROR_LOG_EVERY_S = 60.0
#: the SDK and OTLP exporter, as pyproject.toml's ``tracing`` extra names them
INSTALL_HINT = (
    "install the OpenTelemetry SDK: pip install 'kernmlops[tracing]' "
    "(opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http)"
)
GRPC_HINT = "pip install opentelemetry-exporter-otlp-proto-grpc"
#: the OpenTelemetry specification's defaults for the batch span processor
DEFAULT_QUEUE_SIZE = 2048
DEFAULT_BATCH_SIZE = 512
#: why a span was not exported: the ``reason`` of dropped_tracing_spans_total
QUEUE_FULL = "queue_full"
EXPORT_FAILED = "export_failed"
AT_EXIT = "at_exit"
REASONS = (QUEUE_FULL, EXPORT_FAILED, AT_EXIT)
#: at most one line about spans not sent per this many seconds
DROP_LOG_EVERY_S = 60.0
EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")
_PACKAGE = {"http/protobuf": "http.trace_exporter", "grpc": "grpc.trace_exporter"}
_HEX = re.compile(r"[0-9a-f]*")
_DECIMAL = re.compile(r"[0-9]+")
_KALLSYMS_DECODERS = frozenset({"ksym", "kstack"})


class SpanError(ValueError):
    """A span's labels do not make a span (a trace id that is not 32 hex digits...)."""


# --- the config -------------------------------------------------------------------
class SpanLabelSpec(LabelSpec):
    """A span's label: its name is an attribute's, not a Prometheus label's
    (``cpu.orig`` in ebpf_exporter's sched-trace)."""

    @field_validator("name")
    @classmethod
    def _label_name(cls, name: str) -> str:
        if not name:
            raise ValueError("a span label needs a name")
        return name


class SpanSpec(_Strict):
    """One ``tracing.spans`` entry (its labels' padding moved before the next
    label, as for metrics: see compat._padding_before)."""

    ringbuf: str = Field(min_length=1, description="the BPF_MAP_TYPE_RINGBUF to read")
    name: str = ""
    service: str = ""
    labels: list[SpanLabelSpec] = Field(default_factory=list)
    tail_padding: int = Field(0, ge=0, description="padding after the last label")

    @property
    def span_name(self) -> str:
        return self.name or self.ringbuf

    @property
    def record_bytes(self) -> int:
        """The bytes the labels span: a longer record is cut to them."""
        return sum(label.padding + label.size for label in self.labels) + self.tail_padding


def check_available(env: dict[str, str] | None = None) -> None:
    """Raise MetricSetError (one line) unless spans can be sent as the
    environment asks: the SDK and the chosen exporter installed, known names."""
    env = dict(os.environ) if env is None else env
    try:
        importlib.import_module("opentelemetry.sdk.trace.export")
    except ImportError:
        raise MetricSetError(f"tracing spans: {INSTALL_HINT}") from None
    batch_sizes(env)
    kind, protocol = _exporter_choice(env)
    if kind != "otlp":
        return
    try:
        importlib.import_module(f"opentelemetry.exporter.otlp.proto.{_PACKAGE[protocol]}")
    except ImportError:
        hint = GRPC_HINT if protocol == "grpc" else INSTALL_HINT
        raise MetricSetError(f"tracing spans over OTLP/{protocol}: {hint}") from None


def batch_sizes(env: dict[str, str] | None = None) -> tuple[int, int]:
    """The batch processor's queue and batch sizes (``OTEL_BSP_MAX_QUEUE_SIZE``,
    ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``), a batch at most the queue's size, as
    Go's SDK clamps it (Python's refuses a larger one). Raises MetricSetError
    for a value that is not a positive integer (the SDK would log and go on
    with its default)."""
    env = dict(os.environ) if env is None else env
    sizes = []
    for var, default in (
        ("OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE_SIZE),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BATCH_SIZE),
    ):
        text = env.get(var, "").strip()
        if not text:
            sizes.append(default)
            continue
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise MetricSetError(f"tracing spans: {var}={text!r} is not a positive integer")
        sizes.append(value)
    queue, batch = sizes
    return queue, min(batch, queue)


def _exporter_choice(env: dict[str, str]) -> tuple[str, str]:
    kind = env.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp"
    if kind not in EXPORTERS:
        raise MetricSetError(
            f"tracing spans: OTEL_TRACES_EXPORTER={kind!r} is not one of {', '.join(EXPORTERS)}"
        )
    var = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    if not env.get(var, "").strip():
        var = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = env.get(var, "").strip() or "http/protobuf"
    if kind == "otlp" and protocol not in PROTOCOLS:
        raise MetricSetError(
            f"tracing spans: {var}={protocol!r} is not one of {', '.join(PROTOCOLS)}"
        )
    return kind, protocol


# --- one span, from its labels ------------------------------------------------------
@dataclass
class SpanRecord:
    """A span as its labels give it; ids as integers (0: none)."""

    name: str
    trace_id: int
    span_id: int
    parent_span_id: int
    start_ns: int  # Unix time
    end_ns: int
    attributes: dict[str, str] = field(default_factory=dict)
    #: ``(name, Unix ns, attributes)``; an error makes the span's status Error
    events: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)
    error: str | None = None


def _span_id(label: str, value: str) -> int:
    # As Go's trace.SpanIDFromHex: 16 lower-case hex digits, not all zero.
    if len(value) != 16 or not _HEX.fullmatch(value):
        raise SpanError(f"{label} {value!r} is not 16 lower-case hex digits")
    number = int(value, 16)
    if not number:
        raise SpanError(f"{label} {value!r} is zero")
    return number


def _uint64(label: str, value: str) -> int:
    # As Go's strconv.ParseUint(value, 10, 64): digits only, below 2**64.
    if not _DECIMAL.fullmatch(value) or int(value) >= 1 << 64:
        raise SpanError(f"{label} {value!r} is not an unsigned 64-bit decimal")
    return int(value)


def _as_int64(value: int) -> int:
    """Go's conversion of a uint64 to time.Duration (int64): wraps."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def span_from_labels(
    names: list[str],
    values: list[str],
    spec: SpanSpec,
    config: str,
    *,
    wall_ns: int | None = None,
    monotonic_ns: int | None = None,
    rng: random.Random | None = None,
) -> SpanRecord:
    """The span the decoded labels ``values`` (named ``names``) describe, as
    ebpf_exporter makes it: an absent or zero parent span id makes a root span;
    an absent span id is made up; without a trace id, the trace id and span id
    are both made up (the SDK starts a new trace). ``wall_ns`` and
    ``monotonic_ns`` (now, by default) turn the kernel's monotonic time into
    Unix time. Raises SpanError for a value that is not an id or a number."""
    wall = time.time_ns() if wall_ns is None else wall_ns
    mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC) if monotonic_ns is None else monotonic_ns
    rng = rng or _RNG
    name, start, duration = spec.span_name, wall, 0
    trace_id = span_id = parent = 0
    attributes: dict[str, str] = {}
    for label, value in zip(names, values, strict=True):
        if label == "span_id":
            if value != NIL_SPAN_ID:
                span_id = _span_id(label, value)
        elif label == "parent_span_id":
            if value != NIL_SPAN_ID:
                parent = _span_id(label, value)
        elif label == "trace_id":
            if len(value) != 32 or not _HEX.fullmatch(value):
                raise SpanError(f"trace_id {value!r} is not 32 lower-case hex digits")
            trace_id = int(value, 16)
            if not trace_id:
                raise SpanError(f"trace_id {value!r} is zero")
        elif label == "span_monotonic_timestamp_ns":
            start = wall + _as_int64(_uint64(label, value) - mono)
        elif label == "span_duration_ns":
            duration = _as_int64(_uint64(label, value))
        elif label == "span_name":
            name = value
        else:
            attributes[label] = value
    if not trace_id:  # a new trace: both ids made up, whatever span_id said
        trace_id, span_id = _random_id(rng, 128), _random_id(rng, 64)
    elif not span_id:
        span_id = _random_id(rng, 64)
    attributes[CONFIG_ATTRIBUTE] = config
    return SpanRecord(name, trace_id, span_id, parent, start, start + duration, attributes)


_RNG = random.Random()
_RNG_LOCK = threading.Lock()


def _random_id(rng: random.Random, bits: int) -> int:
    with _RNG_LOCK:
        while True:
            number = rng.getrandbits(bits)
            if number:
                return number


def decode_record(
    raw: bytes, spec: SpanSpec, decoders: list[LabelDecoder], config: str
) -> SpanRecord:
    """The span of one ring record: cut to the labels' span (a longer record
    keeps fields no label names), decoded, made a span. Raises SpanError,
    LabelDecodeError, or DropLabelSet (a decoder does not want the span)."""
    size = spec.record_bytes
    if len(raw) < size:
        raise SpanError(f"the record has {len(raw)} bytes but the labels span {size}")
    key = raw[:size]
    values = [decode(key) for decode in decoders]
    return span_from_labels([label.name for label in spec.labels], values, spec, config)


# --- sending -------------------------------------------------------------------------
def span_exporter(env: dict[str, str] | None = None) -> Any:
    """The SDK's span exporter the environment asks for (None: ``none``)."""
    env = dict(os.environ) if env is None else env
    kind, protocol = _exporter_choice(env)
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout...: from OTEL_EXPORTER_OTLP_*


#: where a span comes from: (config, ring); START_UP for the exporter's own trace
Source = tuple[str, str]
START_UP: Source = ("", "")


class _CountingExporter:
    """The SDK's exporter as the batch processor sees it, telling the pipeline
    how each batch ended: sent, or not (a failure result or an exception)."""

    def __init__(self, inner: Any, pipeline: SpanPipeline) -> None:
        self.inner = inner
        self._pipeline = pipeline

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self.inner.export(spans)
        except Exception as err:  # the SDK would log a traceback and forget the batch
            self._pipeline.done(spans, f"{type(err).__name__}: {err}")
            return SpanExportResult.FAILURE
        failure = None if result == SpanExportResult.SUCCESS else f"the exporter said {result.name}"
        self._pipeline.done(spans, failure)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


class SpanPipeline:
    """One batch span processor and exporter for every span ring of the
    process (ebpf_exporter has one), and a resource per service.

    The hand-off to the SDK is bounded by the processor's queue size
    (``OTEL_BSP_MAX_QUEUE_SIZE``): spans handed over and not yet through the
    exporter never exceed it, so the SDK's queue (which would drop the oldest
    span unseen) never fills; what is not sent is counted in :attr:`dropped`."""

    def __init__(self, exporter: Any, env: dict[str, str] | None = None) -> None:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.queue_size, batch = batch_sizes(env)
        self.processor = (
            BatchSpanProcessor(
                _CountingExporter(exporter, self),
                max_queue_size=self.queue_size,
                max_export_batch_size=batch,
            )
            if exporter is not None
            else None
        )
        self._scope = InstrumentationScope(SCOPE)
        self._resources: dict[str, Any] = {}
        self.users = 0
        self._lock = threading.Lock()
        #: spans handed to the SDK and not yet through its exporter, per source
        self._in_flight: dict[Source, int] = {}
        self._in_flight_all = 0
        #: spans sent, per source; spans not sent, per (source, reason)
        self.exported: dict[Source, int] = {}
        self.dropped: dict[tuple[Source, str], int] = {}
        self.last_failure = ""
        self._closed = False
        self._said = ThrottledCount(DROP_LOG_EVERY_S)

    def resource(self, service: str) -> Any:
        """``service.name`` over OTEL_RESOURCE_ATTRIBUTES, as Go's
        ``sdk.WithResource`` merges a resource with the environment's."""
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource

        service = service or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE
        found = self._resources.get(service)
        if found is None:
            env = OTELResourceDetector().detect()
            found = self._resources[service] = env.merge(Resource({"service.name": service}))
        return found

    def emit(self, record: SpanRecord, service: str, source: Source = START_UP) -> bool:
        """Hand one finished span to the batch processor; False when it was
        not (``queue_full``, counted; or the ``none`` exporter)."""
        if self.processor is None:
            return False
        with self._lock:
            if self._closed or self._in_flight_all >= self.queue_size:
                self._count_drop(source, QUEUE_FULL, 1)
                return False
            self._in_flight_all += 1
            self._in_flight[source] = self._in_flight.get(source, 0) + 1
        self.processor.on_end(self._readable(record, service, source))
        return True

    def _readable(self, record: SpanRecord, service: str, source: Source) -> Any:
        from opentelemetry.sdk.trace import Event
        from opentelemetry.trace import SpanContext, TraceFlags
        from opentelemetry.trace.status import Status, StatusCode

        sampled = TraceFlags(TraceFlags.SAMPLED)
        context = SpanContext(record.trace_id, record.span_id, False, sampled)
        parent = (
            SpanContext(record.trace_id, record.parent_span_id, False, sampled)
            if record.parent_span_id
            else None
        )
        return _sourced_span_class()(
            source,
            record.name,
            context=context,
            parent=parent,
            resource=self.resource(service),
            attributes=record.attributes,
            instrumentation_scope=self._scope,
            start_time=record.start_ns,
            end_time=record.end_ns,
            events=[Event(name, attrs, ns) for name, ns, attrs in record.events],
            status=Status(StatusCode.ERROR, record.error) if record.error else Status(),
        )

    def done(self, spans: Any, failure: str | None) -> None:
        """A batch is through the exporter: sent (``failure`` None) or not."""
        with self._lock:
            if self._closed and not self._in_flight_all:
                return  # counted at exit already (shutdown gave up waiting for it)
            for span in spans:
                source = getattr(span, "kernmlops_source", START_UP)
                left = self._in_flight.get(source, 0)
                if left <= 0:
                    continue  # not one of ours
                self._in_flight[source] = left - 1
                self._in_flight_all -= 1
                if failure is None:
                    self.exported[source] = self.exported.get(source, 0) + 1
                else:
                    self._count_drop(source, EXPORT_FAILED, 1)
            if failure is not None:
                self.last_failure = failure

    def _count_drop(self, source: Source, reason: str, n: int) -> None:
        key = (source, reason)
        self.dropped[key] = self.dropped.get(key, 0) + n

    def dropped_of(self, source: Source) -> dict[str, int]:
        """Spans of ``source`` not sent, per reason (every reason, 0 included)."""
        with self._lock:
            return {reason: self.dropped.get((source, reason), 0) for reason in REASONS}

    def report(self, now: float) -> None:
        """One line on stderr when spans were not sent, at most once a minute."""
        with self._lock:
            by_reason = {r: 0 for r in REASONS}
            for (_source, reason), n in self.dropped.items():
                by_reason[reason] += n
            total = sum(by_reason.values())

            def line(grown: int) -> str:
                parts = []
                if by_reason[QUEUE_FULL]:
                    parts.append(
                        f"{by_reason[QUEUE_FULL]} over the queue of {self.queue_size} "
                        "(OTEL_BSP_MAX_QUEUE_SIZE)"
                    )
                if by_reason[EXPORT_FAILED]:
                    last = f": {self.last_failure}" if self.last_failure else ""
                    parts.append(f"{by_reason[EXPORT_FAILED]} failed to export{last}")
                if by_reason[AT_EXIT]:
                    parts.append(f"{by_reason[AT_EXIT]} unsent at exit")
                return (
                    f"kernmlops export: tracing: {grown} spans not sent "
                    f"({total} in all: {'; '.join(parts)})"
                )

            self._said.say(total, now, line)

    def shutdown(self) -> None:
        """Send what is queued (as ebpf_exporter flushes at exit), then stop;
        what could not be sent by then counts as ``at_exit``."""
        if self.processor is None:
            return
        with self._lock:
            self._closed = True
        self.processor.force_flush()
        self.processor.shutdown()
        with self._lock:
            for source, n in self._in_flight.items():
                if n:
                    self._count_drop(source, AT_EXIT, n)
            self._in_flight.clear()
            self._in_flight_all = 0
        self.report(float("inf"))


@functools.cache
def _sourced_span_class() -> type:
    """The SDK's ReadableSpan, knowing the source the pipeline counts it under."""
    from opentelemetry.sdk.trace import ReadableSpan

    class SourcedSpan(ReadableSpan):
        def __init__(self, source: Source, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.kernmlops_source = source

    return SourcedSpan


def startup_records(phases: list[Any], rng: random.Random | None = None) -> list[SpanRecord]:
    """The spans of the exporter's start-up (``core.Phase`` each, parents by
    index), one trace, as ebpf_exporter sends its own: names, ``config`` of
    each ``attach_config``, ``prog_attach`` {SEC} and ``kaddr`` {symbol}
    events, an error status where a step failed."""
    rng = rng or _RNG
    trace_id = _random_id(rng, 128)
    ids = [_random_id(rng, 64) for _ in phases]
    return [
        SpanRecord(
            phase.name,
            trace_id,
            ids[i],
            ids[phase.parent] if phase.parent is not None else 0,
            phase.start_ns,
            max(phase.end_ns, phase.start_ns),
            dict(phase.attributes),
            list(phase.events),
            phase.error,
        )
        for i, phase in enumerate(phases)
    ]


def send_startup(pipeline: SpanPipeline, phases: list[Any]) -> int:
    """Send the start-up trace (the service: OTEL_SERVICE_NAME, else
    ebpf_exporter, as its own tracer's); the spans handed over."""
    return sum(pipeline.emit(record, "", START_UP) for record in startup_records(phases))


_pipeline: SpanPipeline | None = None
_pipeline_lock = threading.Lock()


def acquire_pipeline() -> SpanPipeline:
    """The process's pipeline, made on first use (its thread starts then:
    after the capability drop, when span rings start)."""
    global _pipeline
    with _pipeline_lock:
        if _pipeline is None:
            _pipeline = SpanPipeline(span_exporter())
        _pipeline.users += 1
        return _pipeline


def hold_pipeline(pipeline: SpanPipeline) -> SpanPipeline:
    """One more user of ``pipeline`` (released with :func:`release_pipeline`)."""
    with _pipeline_lock:
        pipeline.users += 1
        return pipeline


def release_pipeline(pipeline: SpanPipeline) -> None:
    """The last user flushes and stops the pipeline."""
    global _pipeline
    with _pipeline_lock:
        pipeline.users -= 1
        if pipeline.users > 0:
            return
        if _pipeline is pipeline:
            _pipeline = None
    pipeline.shutdown()


# --- a ring of spans ---------------------------------------------------------------
class SpanRing:
    """Reads one span ring from a thread of its own (:meth:`start`) until
    :meth:`close`, and sends each record as a span."""

    def __init__(
        self, config: str, spec: SpanSpec, bpf_map: Map, ctx: DecoderContext, *, where: str = ""
    ) -> None:
        self.config = config
        self.spec = spec
        self.where = where or f"span ring {spec.ringbuf}"
        self._decoders = label_decoders(spec.labels, ctx, flavor=EBPF_EXPORTER_FORMAT)
        _warm(spec, ctx)  # kernel symbols are read now, while privileged
        self.ring = RingBuffer(bpf_map.fd, bpf_map.max_entries, name=spec.ringbuf)
        #: records read, spans handed to the SDK, records that could not be decoded
        self.received = 0
        self.sent = 0
        self.errors = 0
        #: the pipeline counts this ring's spans under this (dropped_tracing_spans_total)
        self.source: Source = (config, spec.ringbuf)
        self._said_errors = ThrottledCount(ERROR_LOG_EVERY_S)
        self._last_error = ""
        self._pipeline: SpanPipeline | None = None
        self._released: SpanPipeline | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Poll from a thread of its own until :meth:`close`."""
        if self._thread is None:
            self._pipeline = acquire_pipeline()
            self._thread = threading.Thread(
                target=self._run, name=f"spans-{self.spec.ringbuf}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        poller = select.epoll()
        try:
            poller.register(self.ring.fd, select.EPOLLIN)
            while not self._stop.is_set():
                poller.poll(POLL_MS / 1000)
                self.poll_now()
                now = time.monotonic()
                self._report_errors(now)
                if self._pipeline is not None:
                    self._pipeline.report(now)
        finally:
            poller.close()

    def poll_now(self) -> None:
        """Send what the ring holds now."""
        with self._lock:
            for raw in self.ring.take_records():
                self.received += 1
                record = self.decode(raw)
                if record is not None and self._pipeline is not None:
                    self.sent += self._pipeline.emit(record, self.spec.service, self.source)

    def dropped(self, source: Source | None = None) -> dict[str, int]:
        """This ring's spans not sent (or ``source``'s, in the same pipeline),
        per reason (zeros before :meth:`start`)."""
        pipeline = self._pipeline or self._released
        if pipeline is None:
            return {reason: 0 for reason in REASONS}
        return pipeline.dropped_of(self.source if source is None else source)

    @property
    def pipeline(self) -> SpanPipeline | None:
        """The pipeline this ring sends to, once started."""
        return self._pipeline

    def decode(self, raw: bytes) -> SpanRecord | None:
        """The span of one record; None when a decoder drops it or it cannot
        be decoded (counted in :attr:`errors`)."""
        try:
            return decode_record(raw, self.spec, self._decoders, self.config)
        except DropLabelSet:
            return None
        except (LabelDecodeError, SpanError) as err:
            self.errors += 1
            self._last_error = str(err)
            return None

    def _report_errors(self, now: float) -> None:
        """One line on stderr when spans could not be decoded, at most once a minute."""
        self._said_errors.say(
            self.errors,
            now,
            lambda n: (
                f"kernmlops export: {self.where}: {n} spans could not be decoded "
                f"({self.errors} in all); the last: {self._last_error}"
            ),
        )

    def close(self) -> None:
        """Stop polling, send what is left, flush the spans (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self.poll_now()
            self._report_errors(float("inf"))
        if self._pipeline is not None:
            pipeline, self._pipeline = self._pipeline, None
            self._released = pipeline  # its counts stay readable (dropped())
            release_pipeline(pipeline)
        if not self._closed:
            self._closed = True
            self.ring.close()


def _warm(spec: SpanSpec, ctx: DecoderContext) -> None:
    """Read the system tables the span's decoders need now (as the exporter
    core does for metrics), not in the first span after privileges are dropped."""
    used = {d.name for label in spec.labels for d in label.decoders}
    if "syscall" in used:
        _ = ctx.syscall_names
    # Failures are not raised here: each span they spoil counts as an error.
    if "cgroup" in used:
        with contextlib.suppress(DecodeError):
            ctx.cgroups.scan()
    if used & _KALLSYMS_DECODERS:
        with contextlib.suppress(DecodeError):
            ctx.kallsyms.load()


__all__ = [
    "AT_EXIT",
    "CONFIG_ATTRIBUTE",
    "EXPORT_FAILED",
    "QUEUE_FULL",
    "REASONS",
    "START_UP",
    "SpanError",
    "SpanLabelSpec",
    "SpanPipeline",
    "SpanRecord",
    "SpanRing",
    "SpanSpec",
    "batch_sizes",
    "check_available",
    "decode_record",
    "hold_pipeline",
    "send_startup",
    "span_exporter",
    "span_from_labels",
    "startup_records",
]
