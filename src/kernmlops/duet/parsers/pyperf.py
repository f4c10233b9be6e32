"""pyperf JSON (``-o FILE`` of any pyperf benchmark or ``pyperf command``).

Each benchmark has runs (one worker process each) with ``warmups`` (pairs of
loops and value) and ``values`` (seconds per loop). A value measures ``loops``
x ``inner_loops`` executions, so it spans value x loops x inner_loops seconds.
A run's ``date`` metadata (local time) is when it started; starts are derived
from it: the run's warm-ups, then its values back to back (``timing`` =
derived, Unix-epoch nanoseconds).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import polars as pl

from kernmlops.duet.parsers.base import Anchor, ParseError, Parser, frame
from kernmlops.jsonfile import loads


def _sniff(path: Path, head: str) -> bool:
    s = head.lstrip()
    return s.startswith("{") and '"benchmarks"' in head and '"runs"' in head


def _loops(*metas: dict) -> int:
    loops, inner = 1, 1
    for meta in metas:  # innermost last wins
        loops = int(meta.get("loops", loops))
        inner = int(meta.get("inner_loops", inner))
    return loops * inner


def _parse(path: Path, data: bytes, anchor: Anchor) -> pl.DataFrame:
    doc = loads(data.decode())
    benches = doc.get("benchmarks")
    if not isinstance(benches, list) or not benches:
        raise ParseError("no benchmarks")
    top = doc.get("metadata", {})
    cols: dict[str, list] = {k: [] for k in ("iteration", "epoch_start_ms", "iteration_start_ns",
                                              "iteration_end_ns", "iteration_time_ns")}  # fmt: skip
    i = 0
    for bench in benches:
        bmeta = bench.get("metadata", {})
        for run in bench.get("runs", []):
            values = run.get("values") or []
            if not values:
                continue  # a calibration run
            rmeta = run.get("metadata", {})
            date = rmeta.get("date") or bmeta.get("date") or top.get("date")
            if date is None:
                raise ParseError("a run without date metadata: its start is unknown")
            t = int(datetime.fromisoformat(str(date)).timestamp() * 1e9)
            n = _loops(top, bmeta, rmeta)
            for w in run.get("warmups") or []:
                t += int(float(w[1]) * int(w[0]) * 1e9)
            for v in values:
                span = int(float(v) * n * 1e9)
                cols["iteration"].append(i)
                cols["epoch_start_ms"].append(t // 1_000_000)
                cols["iteration_start_ns"].append(t)
                cols["iteration_end_ns"].append(t + span)
                cols["iteration_time_ns"].append(round(float(v) * 1e9))
                t += span
                i += 1
    return frame({**cols, "timing": ["derived"] * i})


PARSER = Parser("pyperf", _sniff, _parse)
