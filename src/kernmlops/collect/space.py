"""Running out of room while a collection runs: when it must stop, and how it says so.

The collection's filesystem and the tmpfs of the spool's first MiB are watched while
the benchmark runs (:class:`SpaceWatch`, a thread of its own); a spool's failed write is
turned into the user's one line (:meth:`SpaceGuard.spool_error`). Either way the
collection ends as ``disk_full``, the benchmark is stopped, and what was flushed and
spooled is kept for ``kernmlops recover``. :class:`SpaceGuard` holds that verdict
(``disk_full``) for the session, the running manifest and the poll loop alike.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.collect.disk import free_bytes, human_bytes, is_disk_full
from kernmlops.collect.output import filesystem
from kernmlops.errors import OutputError
from kernmlops.spool.collection import SPOOL_DIR

if TYPE_CHECKING:
    from kernmlops.collect.gated import GatedProcess
    from kernmlops.collect.parquet import ParquetSink
    from kernmlops.spool.memory import SpoolMemory

__all__ = ["SPACE_CHECK_S", "SPACE_STOP_GRACE_S", "OutOfSpace", "SpaceGuard", "SpaceWatch"]

#: how often, while the benchmark runs, a thread of its own looks at the free space of
#: the collection's filesystem and of the spool's tmpfs (a statvfs each, microseconds),
#: and the poll loop asks the spools and the sink for a failed write: a filling disk
#: stops the benchmark well within 2 s, not at its end
SPACE_CHECK_S = 0.25
#: SIGTERM's grace for a benchmark stopped because the space ran out (5 s otherwise):
#: its rows can no longer be kept
SPACE_STOP_GRACE_S = 1.0


class OutOfSpace(OutputError):
    """The collection's filesystem, or the spool's tmpfs, filled during the run: the
    message names it, its free space, and the recover command."""


class SpaceGuard:
    """Whether a collection's output has room, and what it says when it has none.

    ``parquet`` (the run's sink) and ``memory`` (the tmpfs folder of the spool's first
    MiB) are set by the session once they exist."""

    def __init__(self, path: Path, min_free_mb: float) -> None:
        self.path = path
        self.min_free_mb = min_free_mb
        #: the collection's disk or the spool's tmpfs filled: it ends as disk_full
        self.disk_full = False
        #: the run ended with room left: a lack of it from now on is the stop's (the
        #: rows made from the spool, the parts), not the benchmark's to be stopped for
        self.stopping = False
        self.parquet: ParquetSink | None = None
        self.memory: SpoolMemory | None = None

    def spool_call(self, fn: Callable[[], object]) -> None:
        """Run ``fn``; a spool that cannot be written is the output's error (one line,
        a full disk ends the collection as disk_full). Sink errors are already so."""
        try:
            fn()
        except OutputError:
            raise
        except OSError as err:
            raise self.spool_error(err) from None

    def spool_error(self, err: OSError) -> OutputError:
        """A spool's failed write as the user's one line; a full disk ends the
        collection as disk_full."""
        full = is_disk_full(err)
        self.disk_full = self.disk_full or full
        # The filesystem that failed: the collection's, or the tmpfs of the spool's
        # first MiB. A segment's path says which; a bare write's error (no path) is
        # the fuller of the two's.
        if err.filename:
            where = Path(err.filename).parent
        else:
            folders = [self.path, *([self.memory.folder] if self.memory else [])]
            where = min(folders, key=lambda f: _free_or_inf(f))
        what = "the disk is full" if full else f"a write failed ({err.strerror or err})"
        # another writer in the collection (its manifest, a part) may meet it first;
        # outside the collection only the spool's memory is written
        failed = Path(err.filename) if err.filename else None
        ours = (
            failed is None
            or not failed.is_relative_to(self.path)
            or failed.is_relative_to(self.path / SPOOL_DIR)
        )
        return (OutOfSpace if full else OutputError)(
            f"cannot write {'the spool in' if ours else 'to'} {where}: {what}; "
            f"{human_bytes(free_bytes(where))} free on {filesystem(where)}. {self.kept()}"
        )

    def kept(self) -> str:
        """What a collection stopped by its output says it kept, and how to get it."""
        when = (
            "It filled during the stop, the benchmark ended"
            if self.stopping
            else "The benchmark was stopped"
        )
        return (
            f"{when}; finished parts and the spool are kept "
            f"(kernmlops recover {self.path}, once there is room)."
        )

    def out_of_space(self) -> bool:
        """Whether the run ends because the collection's disk or the spool's tmpfs
        filled (or fell below collector.min_free_mb)."""
        failure = self.parquet.failure if self.parquet is not None else None
        return self.disk_full or (failure is not None and is_disk_full(failure))

    def error(self) -> OutOfSpace | None:
        """Why the collection must stop for want of space, or None: the collection's
        filesystem has less than collector.min_free_mb free (or none), or the spool's
        tmpfs less than that and than what the spool may still put there, or the sink
        failed on a full disk. (The space watch's thread: it only reads.)"""
        least = self.min_free_mb * 2**20
        free = free_bytes(self.path)
        if free is not None and (free < least or free == 0):
            self.disk_full = True
            fs = f"{filesystem(self.path)}, the filesystem of {self.path}"
            why = (
                f"the disk is full: 0 B free on {fs}"
                if free == 0
                else f"only {human_bytes(free)} free on {fs}: below collector.min_free_mb "
                f"({self.min_free_mb:g} MiB)"
            )
            return OutOfSpace(f"{why}. {self.kept()}")
        memory = self.memory
        left = memory.limit - memory.used if memory is not None else 0
        if memory is not None and left > 0:
            # Taken by a neighbour: the spool itself keeps within its budget (and, that
            # spent, writes on the disk: the tmpfs may fill then).
            free = free_bytes(memory.folder)
            if free is not None and free < min(max(least, 1), left):
                self.disk_full = True
                return OutOfSpace(
                    f"only {human_bytes(free)} free on {filesystem(memory.folder)}, the "
                    f"filesystem of the spool's memory {memory.folder}: less than "
                    f"collector.min_free_mb and the {human_bytes(left)} the spool may "
                    f"still put there. {self.kept()}"
                )
        failure = self.parquet.failure if self.parquet is not None else None
        if failure is not None and is_disk_full(failure):
            where = self.path
            return OutOfSpace(
                f"cannot write to {where}: the disk is full; {human_bytes(free_bytes(where))} "
                f"free on {filesystem(where)}. {self.kept()}"
            )
        return None


def _free_or_inf(path: Path) -> float:
    free = free_bytes(path)
    return math.inf if free is None else free


class SpaceWatch:
    """While the benchmark runs, a thread that asks ``check`` every SPACE_CHECK_S
    whether the collection must stop for want of space, apart from the poll loop: a
    hook's work can hold the loop for seconds (a library's first import under a storm
    took 7 s). Once it must, the thread keeps the reason (``error``), wakes the loop
    (``wake``) and stops the benchmark itself."""

    def __init__(
        self,
        check: Callable[[], OutOfSpace | None],
        wake: Callable[[], None],
        proc: GatedProcess | None,
    ) -> None:
        self.error: OutOfSpace | None = None
        self._check = check
        self._wake = wake
        self._proc = proc
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kernmlops-space", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(SPACE_CHECK_S):
            error = self._check()
            if error is None:
                continue
            self.error = error
            self._wake()
            if self._proc is not None and self._proc.poll() is None:
                with contextlib.suppress(Exception):  # the session's stop says what failed
                    self._proc.stop(SPACE_STOP_GRACE_S)
            return

    def close(self) -> None:
        self._done.set()
        self._thread.join()
