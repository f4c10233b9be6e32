"""The sinks beside Parquet's: the writer thread and the memory sink.

:class:`ThreadedSink` runs another sink's writes (a :class:`~kernmlops.collect.parquet.ParquetSink`)
in a thread of its own, so the poll loop hands rows over and goes back to the rings;
:class:`MemorySink` keeps frames in memory for tests. What a sink is: kernmlops.tables.Sink.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from kernmlops.lazy import lazy_import
from kernmlops.tables import Rows, Sink, row_count, rows_nbytes

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy_import("polars")

__all__ = ["MemorySink", "ThreadedSink"]

_DURABLE = 1  # the size slot of a flush marker: 1 asks for a durable flush


class MemorySink:
    """A sink that keeps every frame in memory; for tests."""

    def __init__(self) -> None:
        self.frames: dict[str, list[Rows]] = {}
        self.flushes = 0
        self.closed = False

    def write(self, table: str, frame: Rows) -> None:
        if self.closed:
            raise RuntimeError("MemorySink is closed")
        self.frames.setdefault(table, []).append(frame)

    def flush(self, *, durable: bool = False) -> None:
        self.flushes += 1

    def close(self) -> dict[str, int]:
        self.closed = True
        return {name: sum(row_count(f) for f in frames) for name, frames in self.frames.items()}

    def table(self, name: str) -> pl.DataFrame:
        """All rows written to ``name``, in order (an empty DataFrame if none)."""
        frames = self.frames.get(name)
        if not frames:
            return pl.DataFrame()
        return pl.concat(
            [f if isinstance(f, pl.DataFrame) else pl.from_arrow(f) for f in frames],
            how="vertical",
        )

    def tables(self) -> list[str]:
        return sorted(self.frames)


class ThreadedSink:
    """Runs another sink's writes in a background thread.

    The poll loop hands frames over and goes back to draining ring buffers
    while Parquet encodes (pyarrow and polars release the GIL). Frames waiting
    are bounded in bytes: when ``max_queued_bytes`` is reached, ``write``
    blocks, and the rings, not memory, absorb the backlog (and count drops).
    Unless ``wait_when_full`` is off: the poll loop turns it off while it can
    still spill the rings into memory, so that rows it already holds are queued
    past the bound (``behind`` then makes it spill from its next round) instead
    of waiting out a stalled writer while the rings overflow. The queue then
    passes its bound by at most one round's rows, which the loop held anyway.
    An error in the writer is raised by the next call.

    The writer is woken only by a flush, or by ``wake_bytes`` queued: small
    frames wait for the next flush. Waking it for every frame cost more CPU
    (two threads passing the GIL a hundred times a second) than writing them.
    """

    def __init__(
        self,
        inner: Sink,
        max_queued_bytes: int = 32 * 2**20,
        wake_bytes: int = 2**20,
    ) -> None:
        self.inner = inner
        self.max_queued_bytes = max_queued_bytes
        self.wake_bytes = min(wake_bytes, max_queued_bytes)
        #: whether a write past ``max_queued_bytes`` waits for the writer (see above)
        self.wait_when_full = True
        # (table, frame, bytes); table None is a flush marker (bytes _DURABLE: durable),
        # its frame what to call once the flush is done (or None)
        self._queue: list[tuple[str | None, Rows | Callable[[], None] | None, int]] = []
        self._queued_bytes = 0
        self._cond = threading.Condition()
        self._busy = False
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="kernmlops-sink", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                table, frame, size = self._queue.pop(0)
                self._busy = True
            try:
                if self._error is None:
                    if table is None:
                        self.inner.flush(durable=size == _DURABLE)
                        if callable(frame):
                            frame()  # the flush is done: what it finished is on disk
                    else:
                        self.inner.write(table, frame)  # type: ignore[arg-type]
            except BaseException as err:  # handed to the caller
                self._error = err
            finally:
                with self._cond:
                    self._queued_bytes -= size if table is not None else 0
                    self._busy = False
                    self._cond.notify_all()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def check(self) -> None:
        """Raise the writer's error now (a full disk), not at the next call."""
        self._raise()

    def write(self, table: str, frame: Rows) -> None:
        self._raise()
        size = rows_nbytes(frame)
        with self._cond:
            while (
                self.wait_when_full
                and self._queued_bytes
                and self._queued_bytes + size > self.max_queued_bytes
            ):
                self._cond.notify_all()  # the writer may be waiting for wake_bytes
                self._cond.wait()
            self._queue.append((table, frame, size))
            self._queued_bytes += size
            if self._queued_bytes >= self.wake_bytes:
                self._cond.notify_all()

    def _wait_idle(self) -> None:
        with self._cond:
            while self._queue or self._busy:
                self._cond.notify_all()
                self._cond.wait()

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    @property
    def behind(self) -> bool:
        """Whether a write soon could block: the queue is half way to its bound (the writer is
        stalled, e.g. in an fsync of a slow disk, or starved of CPU)."""
        return self._queued_bytes >= self.max_queued_bytes // 2

    def flush(
        self,
        *,
        durable: bool = False,
        wait: bool | None = None,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Queue a flush after what is queued; ``durable`` finishes the open parts.

        ``wait`` (default: ``durable``) blocks until it is done; the poll loop passes
        ``wait=False`` and goes on draining while the writer finishes the parts, and
        ``then``, which the writer thread calls once the flush is done (not after a
        write or the flush failed): the running manifest's rewrite, which describes
        the parts this flush finished.
        """
        self._raise()
        with self._cond:
            self._queue.append((None, then, _DURABLE if durable else 0))
            self._cond.notify_all()
        if durable if wait is None else wait:
            self._wait_idle()
            self._raise()

    def close(self) -> dict[str, int]:
        self._wait_idle()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        rows = self.inner.close()  # close even after an error: finish the parts
        self._raise()
        return rows
