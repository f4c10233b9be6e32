"""Result-file parsers: each turns one tool's output into iteration rows.

Every parser returns a polars DataFrame with the columns of ``ITERATION_SCHEMA``:

- ``iteration``: 0-based, in the order the tool ran them
- ``iteration_start_ns``/``iteration_end_ns``: on a clock shared by both sides
  of a trial (CLOCK_MONOTONIC for the built-in harness, Unix epoch ns for tools
  that report wall-clock times)
- ``iteration_time_ns``: the tool's own measurement of the iteration
- ``epoch_start_ms``: wall-clock start, where known
- ``timing``: ``measured`` (the tool gave the start), or ``derived`` (the tool
  gave durations only: starts are the side's release time plus the durations
  before it, so overlap pairing is approximate)

``parse_file`` picks the parser by content, never by name alone, and raises
ParseError with the reason when none fits.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

# defined below the parsers, which import them from base, not from here
from kernmlops.duet.parsers.base import ITERATION_SCHEMA, Anchor, ParseError, Parser
from kernmlops.duet.parsers.base import derived as derived
from kernmlops.duet.parsers.base import frame as frame


def _registry() -> list[Parser]:
    from kernmlops.duet.parsers import dacapo, harness, hyperfine, pyperf, renaissance, spec

    return [m.PARSER for m in (harness, renaissance, pyperf, hyperfine, dacapo, spec)]


def _head(path: Path) -> str:
    if path.is_dir():
        return ""
    with path.open("rb") as f:
        return f.read(65536).decode("utf-8", errors="replace")


def parse_file(path: str | Path, anchor: Anchor | None = None) -> tuple[str, pl.DataFrame]:
    """(parser name, iteration rows) of one result file or folder."""
    path = Path(path)
    if not path.exists():
        raise ParseError(f"{path}: no such file")
    try:
        head = _head(path)
    except OSError as err:
        raise ParseError(f"{path}: cannot read: {err.strerror}") from err
    for parser in _registry():
        if parser.sniff(path, head):
            try:
                rows = parser.parse(path, anchor or Anchor())
            except ParseError as err:
                raise ParseError(f"{path.name}: {parser.name}: {err}") from None
            except (ValueError, KeyError, TypeError, IndexError, OSError) as err:
                raise ParseError(f"{path.name}: {parser.name}: malformed ({err!r})") from None
            if rows.height == 0:
                raise ParseError(f"{path.name}: {parser.name}: no iterations in the file")
            return parser.name, rows
    names = ", ".join(p.name for p in _registry())
    what = "folder" if path.is_dir() else "file"
    raise ParseError(f"{path.name}: not a result {what} of any known tool ({names})")


PARSER_NAMES = ("harness", "renaissance", "pyperf", "hyperfine", "dacapo", "spec")
__all__ = ["ITERATION_SCHEMA", "PARSER_NAMES", "Anchor", "ParseError", "parse_file"]
