"""Start the exporter beside other work: load the sets, serve from a thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernmlops.exporter.config import resolve_sets
from kernmlops.exporter.core import Exporter, ExporterError, JobFilter, SetStatus
from kernmlops.exporter.server import DEFAULT_LISTEN, MetricsServer, parse_listen
from kernmlops.exporter.webconfig import WebConfig

#: seconds the final values are served when no scrape interval was seen: two
#: intervals of 15 s, the scrape interval of Prometheus' example configuration
DEFAULT_GRACE_S = 30.0


@dataclass
class RunningExporter:
    """Loaded sets and the server serving them; ``close()`` stops both."""

    exporter: Exporter
    server: MetricsServer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def statuses(self) -> list[SetStatus]:
        return self.exporter.statuses

    def summary(self) -> dict:
        """For a collection's manifest: ``scrapes`` are the pages of metrics served
        in full to a GET (what a scraper received; not a 401, a 404, a HEAD, a failed
        render), ``renders`` the reads of the maps, which concurrent scrapes share
        (kernmlops_exporter_scrapes_total counts these)."""
        return {
            "url": self.url,
            "sets": {
                s.name: {
                    "loaded": s.loaded,
                    "error": s.error,
                    "variant": s.variant,
                    "attached": s.attached,
                    "not_attached": {p.name: p.error for p in s.missed},
                }
                for s in self.statuses
            },
            "scrapes": self.server.scrapes.count,
            "renders": self.exporter.renders,
        }

    def hold_final(
        self, grace_s: float | None = None, on_message: Callable[[str], None] | None = None
    ) -> bool:
        """The job has ended: keep serving its final values until a scrape
        that began from now on has been answered (True), or ``grace_s`` passed
        (False). ``None``: two of the scraper's intervals (as seen so far) and a
        second, or :data:`DEFAULT_GRACE_S` before two scrapes were seen. Ctrl+C
        ends the wait."""
        since = time.monotonic()
        if grace_s is None:
            interval = self.server.scrapes.interval_s()
            grace_s = DEFAULT_GRACE_S if interval is None else 2 * interval + 1.0
        if grace_s <= 0:
            return False
        if on_message:
            on_message(
                f"serving the final values at {self.url} until a scrape takes them "
                f"(at most {grace_s:.0f} s)"
            )
        try:
            return self.server.scrapes.wait_after(since, grace_s)
        except KeyboardInterrupt:
            return False

    def close(self) -> None:
        self.server.stop()
        self.exporter.close()


def start_exporter(
    listen: str = DEFAULT_LISTEN,
    *,
    configs: list[str] | tuple[str, ...] = (),
    job: JobFilter | None = None,
    process_filter_fd: int | None = None,
    self_tgid: int | None = None,
    bpf_dir: Path | None = None,
    strict: bool = False,
    bpf_stats: bool = False,
    web_config: WebConfig | None = None,
) -> RunningExporter:
    """Load the sets (``configs``: files or built-in names; none: the default
    built-in sets) and serve them at ``listen`` from a thread.

    A set that cannot load is an error; a program that cannot attach is one
    only when ``strict``. ``process_filter_fd`` (a ``kmo_tracked`` map, as a
    collection's ProcessFilter has) restricts the sets to its processes.
    """
    sets = resolve_sets(configs)
    host, port = parse_listen(listen)
    exporter = Exporter(
        sets,
        job=job,
        process_filter_fd=process_filter_fd,
        self_tgid=self_tgid,
        bpf_dir=bpf_dir,
        bpf_stats=bpf_stats,
    )
    try:
        exporter.start()
        problems = failures(exporter.statuses, strict=strict)
        if problems:
            raise ExporterError("exporter: " + "; ".join(problems))
        server = MetricsServer(exporter.render, host, port, web_config=web_config).start()
    except BaseException:
        exporter.close()
        raise
    return RunningExporter(exporter, server)


def failures(statuses: list[SetStatus], *, strict: bool) -> list[str]:
    """What makes a start (or --check) fail: sets that did not load, and with
    ``strict`` programs that did not attach and labels that cannot decode."""
    out = [f"set {s.name}: {s.error}" for s in statuses if s.error]
    if strict:
        out += not_attached(statuses)
        out += label_problems(statuses)
    return out


def not_attached(statuses: list[SetStatus]) -> list[str]:
    """Programs of loaded sets that did not attach (a warning when serving, a
    failure with --check or --strict)."""
    return [
        f"set {s.name}: program {p.name} ({p.section}) not attached: {p.error}"
        for s in statuses
        if not s.error
        for p in s.missed
    ]


def label_problems(statuses: list[SetStatus]) -> list[str]:
    """Loaded sets whose labels can never decode here (a warning when serving,
    a failure with --check or --strict)."""
    return [f"set {s.name}: {p}" for s in statuses if not s.error for p in s.label_problems]
