"""A pair of clock readings that ties the tables' clock to the wall clock.

Every table is timed in CLOCK_MONOTONIC µs (``ts_uptime_us``). ``boot_time_unix``
(``btime`` of /proc/stat) converts that to wall-clock time only to the whole second,
and is read again by whoever converts, after any NTP step since. A pair of
CLOCK_MONOTONIC and CLOCK_REALTIME read back to back at a known moment converts to
the microsecond what was timed near it: monotonic, realtime, monotonic, several
times, keeping the read whose two monotonic reads are closest (the least
interrupted), with the realtime taken as at their midpoint.
"""

from __future__ import annotations

import time
from typing import TypedDict

__all__ = ["ClockPair", "clock_pair"]


class ClockPair(TypedDict):
    #: CLOCK_MONOTONIC (the tables' clock), ns: the midpoint of the two reads
    monotonic_ns: int
    #: CLOCK_REALTIME (Unix time), ns, read between them
    realtime_ns: int
    #: the two monotonic reads' distance, ns: how far apart the pair can be
    uncertainty_ns: int


def clock_pair(reads: int = 16) -> ClockPair:
    """The tightest of ``reads`` back-to-back readings of both clocks."""
    mono, real = time.CLOCK_MONOTONIC, time.CLOCK_REALTIME
    best: ClockPair | None = None
    for _ in range(max(reads, 1)):
        before = time.clock_gettime_ns(mono)
        wall = time.clock_gettime_ns(real)
        after = time.clock_gettime_ns(mono)
        if best is None or after - before < best["uncertainty_ns"]:
            best = ClockPair(
                monotonic_ns=(before + after) // 2, realtime_ns=wall, uncertainty_ns=after - before
            )
    assert best is not None
    return best
