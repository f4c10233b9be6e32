"""What takes part in a session besides its configured hooks.

A :class:`~kernmlops.collect.session.Session` runs extra hook instances (``hooks=``,
e.g. ``lb collect``'s decision hooks) exactly like the configured ones: started,
drained into the same sink, stopped, in the manifest. A :class:`Participant` is
everything else that runs beside them: it starts once the hooks are attached (with
the same context: process filter, own tgid), closes after the hooks and the
benchmark have stopped, and adds its part to the manifest just before the final
write (the live exporter of ``collector.export``; ``lb collect``'s ``lb`` section).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmlops.hooks.base import HookContext

if TYPE_CHECKING:
    from kernmlops.collect.manifest import Manifest
    from kernmlops.config import CollectorConfig
    from kernmlops.exporter.webconfig import WebConfig


class Participant:
    """Runs beside the hooks; every method is optional."""

    def start(self, ctx: HookContext) -> None:
        """Called once every hook has started, before the benchmark is released."""

    def close(self) -> None:
        """Called last: after the hooks and the benchmark have stopped and the
        collection's Parquet is written (and compacted); idempotent."""

    def contribute(self, manifest: Manifest, path: Path) -> None:
        """Add to the final manifest (its tables, rows and hooks are final; the
        collection's Parquet in ``path`` is complete). Not called for a session
        writing to a caller's sink (no manifest)."""


class ExporterParticipant(Participant):
    """``collector.export``: the collection's programs served as live Prometheus
    metrics, counting the same processes as the hooks; what was served goes into the
    manifest's ``exporter``. ``web_config``: ``collector.export_web_config`` as the
    caller loaded and checked it (``collect`` does, before any BPF work): served as it
    was checked, whatever is put at the file's name since; None: loaded when the
    exporter starts."""

    def __init__(
        self,
        collector: CollectorConfig,
        bpf_dir: Path | None = None,
        on_message: Callable[[str], None] | None = None,
        web_config: WebConfig | None = None,
    ) -> None:
        self.collector = collector
        self.bpf_dir = bpf_dir
        self.on_message = on_message
        self.web_config = web_config
        self._running: Any = None  # kernmlops.exporter.RunningExporter
        self.summary: dict[str, Any] | None = None

    def start(self, ctx: HookContext) -> None:
        from kernmlops.exporter import load_web_config, start_exporter

        assert self.collector.export is not None
        flt = ctx.process_filter
        web = self.web_config
        if web is None and self.collector.export_web_config:  # not loaded by the caller
            web = load_web_config(self.collector.export_web_config)
        self._running = start_exporter(
            self.collector.export,
            configs=self.collector.export_sets,
            process_filter_fd=flt.fd if flt is not None else None,
            self_tgid=ctx.self_tgid,
            bpf_dir=self.bpf_dir,
            strict=self.collector.strict,
            web_config=web,
        )
        if self.on_message is not None:
            # served without them (not --strict): their metrics stay empty, said here
            from kernmlops.exporter.service import label_problems, not_attached

            statuses = self._running.statuses
            for line in [*not_attached(statuses), *label_problems(statuses)]:
                self.on_message(f"exporter: {line}")  # said as a warning

    def close(self) -> None:
        # The job's final values are served until a scrape took them (or
        # collector.export_grace_s passed), then the exporter stops.
        if self._running is None:
            return
        running, self._running = self._running, None
        try:
            running.hold_final(self.collector.export_grace_s, self.on_message)
        finally:
            self.summary = running.summary()
            running.close()

    def contribute(self, manifest: Manifest, path: Path) -> None:
        manifest.exporter = self.summary


def configured(
    collector: CollectorConfig,
    bpf_dir: Path | None = None,
    on_message: Callable[[str], None] | None = None,
    web_config: WebConfig | None = None,
) -> list[Participant]:
    """The participants the configuration asks for (``web_config``: the exporter's,
    loaded: see :class:`ExporterParticipant`)."""
    if not collector.export:
        return []
    return [ExporterParticipant(collector, bpf_dir, on_message, web_config)]
