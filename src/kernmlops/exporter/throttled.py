"""A growing count said on stderr at most once a while: the exporter's background
readers (perf event arrays, span rings) report losses and errors this way, so a
storm of them is one line a minute, not a line each."""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["ThrottledCount"]


class ThrottledCount:
    """Says a cumulative count's growth at most every ``every_s`` seconds."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self._said = 0
        self._at = float("-inf")

    def say(self, count: int, now: float, line: Callable[[int], str]) -> None:
        """Print ``line(growth since last said)`` if ``count`` grew and ``every_s``
        passed since the last line (``now``: monotonic seconds; ``inf`` says it now)."""
        if count > self._said and now - self._at >= self.every_s:
            print(line(count - self._said), file=sys.stderr)
            self._said, self._at = count, now
