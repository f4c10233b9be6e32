"""SPEC CPU 2017 logs (``CPU2017.NNN.log``) or a result folder holding them.

runcpu logs each benchmark run's times as::

    Benchmark Times:
      Run Start:    2022-06-01 14:04:52 (1654092292)
      Rate Start:   2022-06-01 14:04:52 (1654092292.28303)
      Rate End:     2022-06-01 14:12:37 (1654092757.17651)
      Run Stop:     2022-06-01 14:12:37 (1654092757)

The Unix times in parentheses of ``Rate Start``/``Rate End`` (``Speed`` for
the speed suites) bound one iteration.
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import polars as pl

from kernmlops.duet.parsers.base import Anchor, ParseError, Parser, frame, read_result

_LINE = re.compile(r"^\s*(Rate|Speed) (Start|End):.*\((\d+(?:\.\d+)?)\)\s*$", re.M)


def _logs(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*.log") if p.is_file())


def _text(log: Path) -> str:
    # a folder's log read by one descriptor, never by its name after the look at it:
    # one made a FIFO since would wait for a writer for ever
    return read_result(log, what="log").decode(errors="replace")


def _texts(path: Path, data: bytes) -> list[str]:
    if path.is_dir():
        return [_text(p) for p in _logs(path)]
    return [data.decode(errors="replace")]


def _sniff(path: Path, head: str) -> bool:
    if path.is_dir():
        return any(_LINE.search(_text(p)) for p in _logs(path))
    return bool(_LINE.search(head))


def _parse(path: Path, data: bytes, _anchor: Anchor) -> pl.DataFrame:
    starts: list[int] = []
    ends: list[int] = []
    for text in _texts(path, data):
        open_start: int | None = None
        for m in _LINE.finditer(text):
            t = int(Decimal(m.group(3)) * 1_000_000_000)  # exact: floats lose ns
            if m.group(2) == "Start":
                open_start = t
            elif open_start is not None:
                starts.append(open_start)
                ends.append(t)
                open_start = None
    if not starts:
        raise ParseError("no complete Rate/Speed Start .. End pair")
    order = sorted(range(len(starts)), key=starts.__getitem__)
    starts = [starts[i] for i in order]
    ends = [ends[i] for i in order]
    return frame(
        {
            "iteration": list(range(len(starts))),
            "epoch_start_ms": [s // 1_000_000 for s in starts],
            "iteration_start_ns": starts,
            "iteration_end_ns": ends,
            "iteration_time_ns": [e - s for s, e in zip(starts, ends, strict=True)],
            "timing": ["measured"] * len(starts),
        }
    )


PARSER = Parser("spec", _sniff, _parse)
