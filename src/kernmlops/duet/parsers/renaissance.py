"""Renaissance JSON (``--json FILE``).

``environment.vm.start_unix_ms`` is when the JVM started; each entry of
``data.<benchmark>.results`` has ``uptime_ns`` (JVM uptime at the start of the
repetition) and ``duration_ns``. Starts are Unix-epoch nanoseconds.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from kernmlops.duet.parsers.base import Anchor, ParseError, Parser, frame
from kernmlops.jsonfile import loads


def _sniff(path: Path, head: str) -> bool:
    s = head.lstrip()
    return s.startswith("{") and '"data"' in head and '"environment"' in head


def _parse(path: Path, data: bytes, _anchor: Anchor) -> pl.DataFrame:
    doc = loads(data.decode())
    try:
        vm_start_ms = int(doc["environment"]["vm"]["start_unix_ms"])
    except (KeyError, TypeError):
        raise ParseError("no environment.vm.start_unix_ms") from None
    data = doc.get("data")
    if not isinstance(data, dict) or not data:
        raise ParseError("no benchmark under data")
    rows: dict[str, list] = {k: [] for k in ("iteration", "epoch_start_ms", "iteration_start_ns",
                                              "iteration_end_ns", "iteration_time_ns")}  # fmt: skip
    i = 0
    for bench in data.values():  # one benchmark per duet side, usually
        for rep in bench.get("results", []):
            start = vm_start_ms * 1_000_000 + int(rep["uptime_ns"])
            dur = int(rep["duration_ns"])
            rows["iteration"].append(i)
            rows["epoch_start_ms"].append(start // 1_000_000)
            rows["iteration_start_ns"].append(start)
            rows["iteration_end_ns"].append(start + dur)
            rows["iteration_time_ns"].append(dur)
            i += 1
    return frame({**rows, "timing": ["measured"] * i})


PARSER = Parser("renaissance", _sniff, _parse)
