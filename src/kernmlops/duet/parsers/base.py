"""What every result-file parser shares: the iteration schema, the anchor, the
error and the Parser record. The parsers import it from here, not from the
package, which imports them (``parse_file`` tries each)."""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import polars as pl

from kernmlops.confined import MIB, UnsafePathError
from kernmlops.errors import KernmlopsError
from kernmlops.host.pinned import open_regular, read_bounded

#: the largest result file read by default: a parser holds it whole in memory
MAX_FILE_BYTES = 256 * MIB
LIMIT_HINT = " (duet process --max-file-mb raises the limit)"

ITERATION_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "epoch_start_ms": pl.Int64(),
    "iteration_start_ns": pl.Int64(),
    "iteration_end_ns": pl.Int64(),
    "iteration_time_ns": pl.Int64(),
    "timing": pl.String(),
}


class ParseError(KernmlopsError):
    """A result file that no parser understands, or a malformed one."""


@dataclass(frozen=True)
class Anchor:
    """When the side was released (for tools that report durations only)."""

    monotonic_ns: int | None = None
    epoch_ms: int | None = None
    #: the run's ``artifacts/date`` (Unix ns): the original tool's anchor for
    #: result files that carry times relative to an unknown start
    date_ns: int | None = None


def read_result(path: Path, limit: int = MAX_FILE_BYTES, *, what: str = "result file") -> bytes:
    """The bytes of the plain file ``path``, at most ``limit``, from one descriptor
    (kernmlops.host.pinned.open_regular: a FIFO put at its name, even after a look at
    it, would wait for a writer for ever); UnsafePathError, naming it, for anything else
    or a file over the limit (also one that grows past it while read); OSError when it
    cannot be opened."""
    try:
        fd = open_regular(path)
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise
        raise UnsafePathError(f"{path}: {what} is not a plain file: not read") from None
    with open(fd, "rb") as f:
        return read_open(f, path, limit, what=what)


def read_open(f: BinaryIO, path: Path, limit: int, *, what: str, hint: str = LIMIT_HINT) -> bytes:
    """The bytes of ``f`` (the plain file ``path``, already opened once), at most
    ``limit`` (kernmlops.host.pinned.read_bounded); UnsafePathError in one line
    (``hint``: how to raise it) for a file over the limit, also one that grows past it
    while read."""
    try:
        return read_bounded(f, limit, path)
    except OSError as err:
        if err.errno != errno.EFBIG:
            raise
        raise UnsafePathError(f"{path}: {what} of {err.strerror}{hint}") from None


def frame(rows: dict[str, list]) -> pl.DataFrame:
    """Rows in ITERATION_SCHEMA; missing columns are null."""
    n = len(rows["iteration_time_ns"])
    data = {k: rows.get(k, [None] * n) for k in ITERATION_SCHEMA}
    return pl.DataFrame(data, schema=ITERATION_SCHEMA)


def derived(times_ns: list[int], anchor: Anchor, gaps_ns: list[int] | None = None) -> pl.DataFrame:
    """Iterations back to back from the anchor (release time of the side)."""
    if anchor.monotonic_ns is None:
        raise ParseError("the tool reports durations only and the side's start is unknown")
    starts, ends, epochs = [], [], []
    t = anchor.monotonic_ns
    e = anchor.epoch_ms
    for i, d in enumerate(times_ns):
        t += (gaps_ns or [0] * len(times_ns))[i]
        starts.append(t)
        epochs.append(None if e is None else e + (t - anchor.monotonic_ns) // 1_000_000)
        t += d
        ends.append(t)
    return frame(
        {
            "iteration": list(range(len(times_ns))),
            "epoch_start_ms": epochs,
            "iteration_start_ns": starts,
            "iteration_end_ns": ends,
            "iteration_time_ns": list(times_ns),
            "timing": ["derived"] * len(times_ns),
        }
    )


@dataclass(frozen=True)
class Parser:
    name: str
    #: whether the file looks like this tool's (cheap: the first 64 KiB)
    sniff: Callable[[Path, str], bool]
    #: the iterations of ``path``, given its bytes as parse_file read them (from one
    #: descriptor, never the name again: b"" for a folder, which its parser reads)
    parse: Callable[[Path, bytes, Anchor], pl.DataFrame]
