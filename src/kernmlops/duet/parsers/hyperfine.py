"""hyperfine JSON (``--export-json FILE``).

``results[].times`` are the timed runs in seconds, after the warm-ups, back to
back. hyperfine records no start times: starts are derived from the side's
release time (``timing`` = derived, on the runner's monotonic clock). A run that
failed (``exit_codes``, with ``--ignore-failure``) is no iteration, and the
next run starts after its time.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from kernmlops.duet.parsers.base import Anchor, ParseError, Parser, derived
from kernmlops.jsonfile import loads


def _sniff(path: Path, head: str) -> bool:
    s = head.lstrip()
    return s.startswith("{") and '"results"' in head and '"times"' in head


def _parse(path: Path, data: bytes, anchor: Anchor) -> pl.DataFrame:
    doc = loads(data.decode())
    results = doc.get("results")
    if not isinstance(results, list) or not results:
        raise ParseError("no results")
    times: list[int] = []
    # A failed run (--ignore-failure) is left out, but it took its time: the runs
    # after it start that much later, or they would be paired with the wrong ones.
    gaps: list[int] = []
    failed = 0
    for res in results:
        codes = res.get("exit_codes") or [0] * len(res.get("times") or [])
        for t, code in zip(res.get("times") or [], codes, strict=False):
            ns = round(float(t) * 1e9)
            if code in (0, None):
                times.append(ns)
                gaps.append(failed)
                failed = 0
            else:
                failed += ns
    if not times:
        raise ParseError("no successful timed run in results[].times")
    return derived(times, anchor, gaps)


PARSER = Parser("hyperfine", _sniff, _parse)
