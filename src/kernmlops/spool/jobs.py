"""What a spool holds unread, described for other processes: at stop the collector
hands a ring's unread frames to row workers (kernmlops.collect.rowmaking) as pieces
of whole frames, in order, found from the frames' headers alone (their checksums
are checked where they are read). RingSpool.unread gives them, RingSpool.read_to_end
takes them back once their rows are in finished parts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kernmlops.spool.frames import FRAME, RAW_FRAME, claims_too_much, header_sizes

__all__ = ["PIECE_RAW", "SpoolPiece", "SpoolWork", "frame_spans", "pieces"]

#: record bytes of a piece at most (frames side by side: a ring copy may be one frame)
PIECE_RAW = 8 << 20


class SpoolPiece(NamedTuple):
    """Whole frames of a segment file, side by side, not read back yet."""

    path: str
    #: their bytes in the file, headers included
    start: int
    end: int
    #: "zstd" for compressed frames, None for raw ones (CRC32C)
    codec: str | None
    #: their records' bytes
    raw: int


@dataclass(frozen=True)
class SpoolWork:
    """What one ring's spool holds that has no rows yet; ``<folder>/<key>.json`` says
    how to decode it and whose rows they are (hooks.bpf.BpfHook.spool_work)."""

    folder: Path
    key: str
    pieces: list[SpoolPiece]

    @property
    def raw(self) -> int:
        return sum(p.raw for p in self.pieces)


def frame_spans(
    fd: int, start: int, end: int, compressed: bool
) -> list[tuple[int, int, int]] | None:
    """(start, end, record bytes) of each frame of a segment file from ``start`` to
    ``end``, from their headers; None where a header is not sound."""
    spans = []
    head_size = FRAME.size if compressed else RAW_FRAME.size
    at = start
    while at < end:
        found = header_sizes(os.pread(fd, head_size, at), compressed)
        if found is None:
            return None
        size, raw, _ = found
        nxt = at + head_size + size
        if nxt > end or claims_too_much(size, raw) is not None:  # the collector names it
            return None
        spans.append((at, nxt, raw))
        at = nxt
    return spans


def pieces(path: Path, spans: list[tuple[int, int, int]], codec: str | None) -> list[SpoolPiece]:
    """A segment's frames joined in pieces of about PIECE_RAW record bytes."""
    out: list[SpoolPiece] = []
    first = last = held = 0
    for a, b, raw in spans:
        if held and held + raw > PIECE_RAW:
            out.append(SpoolPiece(str(path), first, last, codec, held))
            held = 0
        if not held:
            first = a
        last, held = b, held + raw
    if held:
        out.append(SpoolPiece(str(path), first, last, codec, held))
    return out
