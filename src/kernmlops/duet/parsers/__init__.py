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
ParseError with the reason when none fits. It reads nothing over ``max_bytes``
(a file, or a result folder's files together) and no link that leaves a result
folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from kernmlops.confined import UnsafePathError, confined, human_size
from kernmlops.duet.parsers.base import (
    ITERATION_SCHEMA,
    LIMIT_HINT,
    MAX_FILE_BYTES,
    Anchor,
    ParseError,
    Parser,
    read_open,
    read_result,
)
from kernmlops.duet.parsers.base import derived as derived
from kernmlops.duet.parsers.base import frame as frame


def _registry() -> list[Parser]:
    from kernmlops.duet.parsers import dacapo, harness, hyperfine, pyperf, renaissance, spec

    return [m.PARSER for m in (harness, renaissance, pyperf, hyperfine, dacapo, spec)]


def _check_folder(path: Path, max_bytes: int) -> None:
    """A result folder: no link out of it, its files together within ``max_bytes``."""
    total = 0
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            entry = os.path.join(top, name)
            rel = os.path.relpath(entry, path)
            if os.path.islink(entry):
                confined(path, rel, what="entry")  # a link must stay inside
            if name in files and os.path.isfile(entry):
                total += os.stat(entry).st_size
            elif name in files and os.path.exists(entry):  # a FIFO, a device, a socket
                raise UnsafePathError(f"{path}: {rel} is not a plain file: not read")
        if total > max_bytes:
            raise UnsafePathError(
                f"{path}: result folder of over {human_size(max_bytes)}: not read{LIMIT_HINT}"
            )


def parse_file(
    path: str | Path, anchor: Anchor | None = None, *, max_bytes: int = MAX_FILE_BYTES
) -> tuple[str, pl.DataFrame]:
    """(parser name, iteration rows) of one result file or folder.

    ParseError when no parser fits; UnsafePathError (one line, naming the
    file) when it is over ``max_bytes`` or a result folder holds a link out of
    itself."""
    path = Path(path)
    if not path.exists():
        raise ParseError(f"{path}: no such file")
    try:
        if path.is_dir():
            _check_folder(path, max_bytes)
            data = b""
        else:  # read once, from one descriptor: the parser gets these bytes, not the name
            data = read_result(path, max_bytes)
    except OSError as err:
        raise ParseError(f"{path}: cannot read: {err.strerror}") from err
    head = data[:65536].decode("utf-8", errors="replace")
    for parser in _registry():
        try:  # a folder's parser reads its files here: one may be gone since
            fits = parser.sniff(path, head)
        except OSError as err:
            raise ParseError(f"{path}: cannot read: {err.strerror}") from err
        if fits:
            try:
                rows = parser.parse(path, data, anchor or Anchor())
            except ParseError as err:
                raise ParseError(f"{path.name}: {parser.name}: {err}") from None
            except (ValueError, KeyError, TypeError, IndexError, AttributeError, ArithmeticError,
                    OSError) as err:  # fmt: skip
                raise ParseError(f"{path.name}: {parser.name}: malformed ({_said(err)})") from None
            if rows.height == 0:
                raise ParseError(f"{path.name}: {parser.name}: no iterations in the file")
            return parser.name, rows
    names = ", ".join(p.name for p in _registry())
    what = "folder" if path.is_dir() else "file"
    raise ParseError(f"{path.name}: not a result {what} of any known tool ({names})")


PARSER_NAMES = ("harness", "renaissance", "pyperf", "hyperfine", "dacapo", "spec")
__all__ = [
    "ITERATION_SCHEMA",
    "MAX_FILE_BYTES",
    "PARSER_NAMES",
    "Anchor",
    "ParseError",
    "parse_file",
    "read_open",
]


def _said(err: BaseException) -> str:
    """An error's words for a warning line: its message, else its kind (a KeyError's
    message is the key alone: named as such)."""
    if isinstance(err, KeyError):
        return f"no {err.args[0]!r}" if err.args else "a key is missing"
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
