"""The built-in harness's CSV or JSON lines (kernmlops.duet.harness)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from kernmlops.duet.harness import COLUMNS
from kernmlops.duet.parsers.base import Anchor, ParseError, Parser, frame
from kernmlops.jsonfile import loads

_HEADER = ",".join(COLUMNS)


def _sniff(path: Path, head: str) -> bool:
    first = head.lstrip().split("\n", 1)[0].strip()
    if first == _HEADER:
        return True
    if first.startswith("{"):
        try:
            return set(COLUMNS) <= set(loads(first))
        except ValueError:
            return False
    return False


def _parse(path: Path, data: bytes, _anchor: Anchor) -> pl.DataFrame:
    text = data.decode()
    rows: dict[str, list] = {c: [] for c in COLUMNS}
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and lines[0].strip() == _HEADER:
        for n, line in enumerate(lines[1:], start=2):
            parts = line.split(",")
            if len(parts) != len(COLUMNS):
                # a run killed mid-write leaves a partial last line: drop it only there
                if n == len(lines):
                    break
                raise ParseError(f"line {n}: {len(parts)} fields, expected {len(COLUMNS)}")
            for c, v in zip(COLUMNS, parts, strict=True):
                rows[c].append(int(v))
    else:
        for n, line in enumerate(lines, start=1):
            try:
                obj = loads(line)
            except ValueError:
                if n == len(lines):
                    break
                raise ParseError(f"line {n}: not JSON") from None
            for c in COLUMNS:
                rows[c].append(int(obj[c]))
    ok = [i for i, code in enumerate(rows["exit_code"]) if code == 0]
    keep = {c: [rows[c][i] for i in ok] for c in COLUMNS}
    return frame({**keep, "timing": ["measured"] * len(ok)})


PARSER = Parser("harness", _sniff, _parse)
