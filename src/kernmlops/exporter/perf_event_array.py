"""Counters fed by a perf event array (ebpf_exporter's ``perf_event_array:
true``): the program sends one sample per event, whose leading bytes are the
counter's labels laid out as a map key; each sample adds 1 to the counter with
those labels.

:class:`PerfEventCounts` keeps a count per distinct key, so a scrape reads it as
it reads a map (``MapReader.read``) and the label decoders, their caches and
``max_label_sets`` work unchanged. As in ebpf_exporter, the counts start again
from zero every ``flush_interval`` (an hour unless the config says), which
forgets label sets no longer seen (a removed cgroup's). A CPU brought online
after the start gets a ring of its own at the next poll (PerfBuffer.refresh);
one that cannot is said on stderr once and served as a gauge. A sample whose labels
do not decode is a decoder error each time, as ebpf_exporter counts it (a map's
key counts once): the samples of keys the metric has not yet decoded are kept
apart until its next scrape takes them (``maps.EventCounts``), so a flush
between two scrapes loses none of them.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from kernmlops.ebpf.objects import Map
from kernmlops.ebpf.perfbuf import DEFAULT_PAGES, PerfBuffer
from kernmlops.exporter.throttled import ThrottledCount

#: ebpf_exporter's default flush interval
DEFAULT_FLUSH_S = 3600.0
#: how long a poll waits for samples (ebpf_exporter polls with 300 ms)
POLL_MS = 300
#: at most one line about lost samples per this many seconds
LOST_LOG_EVERY_S = 60.0


def _never(_key: bytes) -> bool:
    return False


_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0}
_GO_UNITS |= {"m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def go_duration_s(value: object) -> float:
    """Seconds of a Go ``time.Duration`` as YAML gives one to ebpf_exporter: a
    string such as ``30s``, ``1m30s`` or ``1.5h`` (``time.ParseDuration``), or
    an integer of nanoseconds. Raises ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int):
        return value / 1e9
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a duration (e.g. 30s, 5m, 1h)")
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body == "0":
        return 0.0
    parts = _GO_PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"{value!r} is not a duration (e.g. 30s, 5m, 1h)")
    return sign * sum(float(n) * _GO_UNITS[u] for n, u in parts)


class PerfEventCounts:
    """Samples of one perf event array, counted per key (their first
    ``key_bytes`` bytes). :meth:`start` polls from a thread; :meth:`read`
    gives the counts as ``MapReader.read`` gives a map's values."""

    def __init__(
        self,
        bpf_map: Map,
        key_bytes: int,
        *,
        flush_interval_s: float = DEFAULT_FLUSH_S,
        pages: int = DEFAULT_PAGES,
        where: str = "",
    ) -> None:
        self.name = bpf_map.name
        self.where = where or f"perf event array {self.name}"
        self.key_bytes = key_bytes
        self.flush_interval_s = flush_interval_s if flush_interval_s > 0 else DEFAULT_FLUSH_S
        self.max_entries = 0  # for MetricReader's key cache: no map bound
        self._counts: dict[bytes, int] = {}
        self._lock = threading.Lock()
        #: samples the kernel dropped (a CPU's ring was full), since the start
        self.lost = 0
        #: samples counted, since the start (flushes do not reset it)
        self.received = 0
        #: set by the metric (maps.EventCounts): keys whose fate it knows
        self.settled: Callable[[bytes], bool] = _never
        #: samples per key not settled, since the metric last took them
        self._unsettled: dict[bytes, int] = {}
        self._said_lost = ThrottledCount(LOST_LOG_EVERY_S)
        self._said_cpus: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._buffer = PerfBuffer(
            bpf_map, self._on_sample, self._on_lost, pages=pages, keep=key_bytes
        )

    def _on_sample(self, _cpu: int, data: bytes) -> None:
        with self._lock:
            self._counts[data] = self._counts.get(data, 0) + 1
            self.received += 1
            if not self.settled(data):  # new or undecodable: the metric checks each event
                self._unsettled[data] = self._unsettled.get(data, 0) + 1

    def take_unsettled(self) -> dict[bytes, int]:
        """The samples of keys not settled since the last call, per key: those
        of a key that does not decode are decoder errors, one per sample."""
        with self._lock:
            taken, self._unsettled = self._unsettled, {}
        return taken

    def _on_lost(self, _cpu: int, count: int) -> None:
        with self._lock:
            self.lost += count

    def start(self) -> None:
        """Poll from a thread of its own until :meth:`close`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"perf-{self.name}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        flush_at = time.monotonic() + self.flush_interval_s
        while not self._stop.is_set():
            self._buffer.poll(POLL_MS)  # -EINTR: a signal came; poll again
            self.refresh_cpus()
            now = time.monotonic()
            if now >= flush_at:
                with self._lock:
                    self._counts.clear()
                flush_at = now + self.flush_interval_s
            self._report_lost(now)

    @property
    def unread_cpus(self) -> dict[int, str]:
        """Online CPUs whose samples are not seen (no ring could be opened), and why."""
        return dict(self._buffer.unread_cpus)

    def refresh_cpus(self, online: list[int] | None = None) -> None:
        """Give a CPU brought online since the last look a ring of its own
        (PerfBuffer.refresh); say each CPU that cannot have one, once."""
        self._buffer.refresh(online)
        for cpu, why in self._buffer.unread_cpus.items():
            if cpu not in self._said_cpus:
                self._said_cpus.add(cpu)
                print(
                    f"kernmlops export: {self.where}: CPU {cpu} came online after the start "
                    f"and its ring cannot be opened ({why}): its events are not seen",
                    file=sys.stderr,
                )
        self._said_cpus &= set(self._buffer.unread_cpus)  # said again if it happens again

    def _report_lost(self, now: float) -> None:
        """One line on stderr when samples were lost, at most once a minute."""
        self._said_lost.say(
            self.lost,
            now,
            lambda n: (
                f"kernmlops export: {self.where}: {n} events lost (a CPU's perf ring "
                f"was full), {self.lost} in all"
            ),
        )

    def poll_now(self) -> None:
        """Count what the rings hold now (without the thread: tests, --check)."""
        self._buffer.consume()

    def read(self) -> tuple[list[bytes], np.ndarray]:
        """Every key seen since the last flush and its count, as ``(n, 1)`` u64."""
        with self._lock:
            keys = list(self._counts)
            values = np.fromiter(self._counts.values(), np.uint64, count=len(keys))
        return keys, values.reshape(-1, 1)

    def close(self) -> None:
        """Stop polling and close the perf events (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._buffer.close()


__all__ = ["DEFAULT_FLUSH_S", "DEFAULT_PAGES", "PerfEventCounts", "go_duration_s"]
