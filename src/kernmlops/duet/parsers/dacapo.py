"""DaCapo and ScalaBench CSV, as the duet callback of those harnesses writes it.

A header line, then one row per iteration; the column ``iteration_time_ns``
is required. Starts come from the first of these that the file has:

- ``iteration_start_ns`` (and ``iteration_end_ns``)
- ``start_unix`` (what the original asynchronous-duet's DaCapo and ScalaBench
  write), ``wallclock_start_ms``, ``epoch_start_ms``, ``start_unix_ms``: Unix ms
- ``total_ms`` (older DaCapo/ScalaBench files): ms since the harness started.
  In a ``duet run`` folder it is the end of the iteration, anchored on the
  side's release time; in an original results folder it is anchored as the
  original anchors it: start = the run's ``artifacts/date`` + total_ms

Repeated header lines (one per JVM invocation appended to the same file) are
skipped. ``iteration``/``index`` columns are not needed: rows are in order.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import polars as pl

from kernmlops.duet.parsers.base import Anchor, ParseError, Parser, frame

_EPOCH = ("start_unix", "wallclock_start_ms", "epoch_start_ms", "start_unix_ms")


def _sniff(path: Path, head: str) -> bool:
    first = head.lstrip().split("\n", 1)[0]
    cols = [c.strip() for c in first.split(",")]
    return "iteration_time_ns" in cols and "exit_code" not in cols


def _parse(path: Path, data: bytes, anchor: Anchor) -> pl.DataFrame:
    reader = csv.reader(io.StringIO(data.decode()))
    header = [c.strip() for c in next(reader)]
    col = {name: i for i, name in enumerate(header)}
    durs: list[int] = []
    starts: list[int | None] = []
    epochs: list[int | None] = []
    for row in reader:
        if not row or [c.strip() for c in row] == header:
            continue
        try:
            dur = int(float(row[col["iteration_time_ns"]]))
        except ValueError:
            continue  # another header
        durs.append(dur)
        start = epoch = None
        if "iteration_start_ns" in col:
            start = int(float(row[col["iteration_start_ns"]]))
        for name in _EPOCH:
            if name in col:
                epoch = int(float(row[col[name]]))
                start = start if start is not None else epoch * 1_000_000
                break
        if start is None and "total_ms" in col:
            total_ns = int(float(row[col["total_ms"]]) * 1_000_000)
            if anchor.monotonic_ns is not None:
                start = anchor.monotonic_ns + total_ns - dur
                if anchor.epoch_ms is not None:
                    epoch = anchor.epoch_ms + (start - anchor.monotonic_ns) // 1_000_000
            elif anchor.date_ns is not None:
                start = anchor.date_ns + total_ns
                epoch = start // 1_000_000
            else:
                raise ParseError(
                    "total_ms is relative and the run's start is unknown (no artifacts/date "
                    "beside an original results folder, no release time in duet-run.json)"
                )
        if start is None:
            raise ParseError(
                "no start column (iteration_start_ns, wallclock_start_ms, epoch_start_ms, "
                "start_unix_ms or total_ms)"
            )
        starts.append(start)
        epochs.append(epoch)
    timing = "measured" if "total_ms" not in col or any(c in col for c in _EPOCH) else "derived"
    return frame(
        {
            "iteration": list(range(len(durs))),
            "epoch_start_ms": epochs,
            "iteration_start_ns": starts,
            "iteration_end_ns": [s + d for s, d in zip(starts, durs, strict=True)],
            "iteration_time_ns": durs,
            "timing": [timing] * len(durs),
        }
    )


PARSER = Parser("dacapo", _sniff, _parse)
