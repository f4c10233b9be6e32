"""The poll loop: from the release of the benchmark to the moment the collection stops.

The loop sleeps until a hook is due, and whatever cannot wait wakes it: the benchmark's
exit (a pidfd), a stop signal (an eventfd the handler writes, :class:`StopSignals`), a
ring passing a quarter full (its map fd, see common.h), the space watch. Each round it
drains the hooks into the sink (or, while the decoding libraries load or the sink is
behind, spills their rings into memory), does a durable flush every
``collector.flush_interval_s`` with a checkpoint of the manifest once its parts are
finished, asks the spools, the sink and the manifest's writer for a failed write, and
reports progress. It returns how the collection ended.

A hook that raises what no hook should (a bug: not the output's OSError or a
KernmlopsError) is detached there and then, named (its status, a message), and the
loop goes on with the others: one broken hook costs its own rows from then on, not the
benchmark's run or the other hooks' rows. What it had spooled is no loss: its records
are moved into its spool, and their rows are made at the stop as every hook's are.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernmlops.collect.attach import (
    check_writes,
    drain,
    let_go,
    mark_failed,
    spooled_bytes,
    write_all,
)
from kernmlops.collect.gated import exit_status
from kernmlops.collect.space import SPACE_CHECK_S, SpaceWatch
from kernmlops.errors import NOT_A_HOOKS_BUG
from kernmlops.hooks.base import Hook

if TYPE_CHECKING:
    from kernmlops.collect.gated import GatedProcess
    from kernmlops.collect.parquet import ParquetSink
    from kernmlops.collect.running import RunningManifest
    from kernmlops.collect.sinks import ThreadedSink
    from kernmlops.collect.space import SpaceGuard
    from kernmlops.config import Config

__all__ = ["MAX_SPILLED_BYTES", "PollLoop", "Progress", "StopSignals"]

#: ring records held in memory while the sink is behind; past it the loop blocks on the
#: sink again and a long stall overflows the rings (counted as drops)
MAX_SPILLED_BYTES = 256 << 20


@dataclass
class Progress:
    """What the session reports while it runs (the CLI draws it)."""

    elapsed_s: float
    events: dict[str, int]
    drops: dict[str, int]
    rows: dict[str, int]
    benchmark: str
    #: bytes of records waiting in each hook's spool (rows made later)
    spooled: dict[str, int] = field(default_factory=dict)


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP (its terminal closed: an ssh session lost), while a
    collection runs: the signal that came (``signal``) and, while the poll loop runs,
    an eventfd (``fd``) that ends its sleep at once. Each stops the collection as
    Ctrl+C does, what was collected kept (a hangup's default action would end the
    process with the rows still in its spool)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.fd: int | None = None
        #: set once the stop began (:meth:`stopping`): what came since counts here
        #: instead, 1 per Ctrl+C or hangup, 2 for a SIGTERM (nobody asks it twice)
        self.in_stop: int | None = None

    def install(self) -> dict[int, Any]:
        """Take the signals (from the main thread only); the handlers they had."""

        def handler(signum: int, _frame: object) -> None:
            if self.in_stop is not None:  # the stop decides what it does (asked_in_stop)
                self.in_stop += 2 if signum == signal.SIGTERM else 1
                self.signal = self.signal or signum
                return
            self.signal = signum
            if self.fd is not None:
                with contextlib.suppress(OSError):
                    os.eventfd_write(self.fd, 1)  # wakes the poll loop's sleep

        old = {}
        if sys.platform != "win32" and _is_main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                old[sig] = signal.signal(sig, handler)
        return old

    def stopping(self) -> None:
        """The stop began: a signal from now on is counted (:meth:`asked_in_stop`), the
        stop's steps go on."""
        self.in_stop = 0

    def asked_in_stop(self) -> int:
        """Stop signals since :meth:`stopping` (a SIGTERM counts 2)."""
        return self.in_stop or 0

    @staticmethod
    def restore(old: dict[int, Any]) -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    def wake(self) -> None:
        """End the poll loop's sleep (as a stop signal does)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.eventfd_write(self.fd, 1)


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class PollLoop:
    """One collection's loop over its started ``hooks`` into ``sink`` (the writer
    thread), while ``proc`` (the benchmark, if it has a process) runs; ``parquet`` is
    the sink's Parquet writer (None with a caller's sink). A hook that fails is
    appended to ``failed`` (detached and closed: the session's stop leaves it be) and
    said through ``on_message``; one that holds spooled records is left open, in
    ``spooled`` too: the stop makes their rows."""

    def __init__(
        self,
        config: Config,
        hooks: list[Hook],
        sink: ThreadedSink,
        proc: GatedProcess | None,
        *,
        parquet: ParquetSink | None,
        space: SpaceGuard,
        running: RunningManifest,
        stop: StopSignals,
        describe: Callable[[], str],
        on_progress: Callable[[Progress], None] | None = None,
        on_message: Callable[[str], None] | None = None,
        failed: list[Hook] | None = None,
        spooled: list[Hook] | None = None,
    ) -> None:
        self.config = config
        self.hooks = hooks
        self.sink = sink
        self.proc = proc
        self.parquet = parquet
        self.space = space
        self.running = running
        self.stop = stop
        self.describe = describe
        self.on_progress = on_progress
        self.on_message = on_message
        self.failed: list[Hook] = [] if failed is None else failed
        #: of them, those whose spooled records wait for the stop (detached, not closed)
        self.spooled: list[Hook] = [] if spooled is None else spooled
        #: the hooks still collecting: a failed one leaves this list (_fail)
        self.active: list[Hook] = [h for h in hooks if h not in self.failed]

    def run(self, libraries: threading.Event | None = None) -> tuple[str, int | None]:
        """Poll until the benchmark exits, a signal comes or the duration passes: how
        it ended (completed, failed, interrupted, duration) and the benchmark's exit
        status. Until ``libraries`` is set, the rings are only kept from filling."""
        sink, proc = self.sink, self.proc
        cfg = self.config.collector
        period = cfg.poll_interval_ms / 1000
        limit = self.config.benchmark.duration_s
        #: when the time the duration limit counts began (the session's run_s)
        self.started = start = time.monotonic()
        next_flush = start + cfg.flush_interval_s
        next_progress = start
        next_check = start
        # The loop sleeps until a hook is due (next_poll), and whatever cannot wait
        # wakes it: the benchmark's exit (a pidfd), a stop signal (an eventfd the
        # handler writes), a ring passing a quarter full (its map fd, see
        # common.h). Only hooks whose buffers cannot tell cap the sleep.
        # The running manifest is written (and synced) by a thread: behind a storm's
        # writeback an fsync waited seconds, and the rings overflowed meanwhile. It is
        # joined once the hooks are detached (run), before the final manifest.
        self.running.write_in_background()
        exited: int | None = None
        # --tgid N with a benchmark of no process (faux): nothing is left to trace once
        # N exits, so the collection ends then (as `perf record -p N` does)
        target = cfg.tgid if proc is None and cfg.filter == "tgid" else None
        target_fd: int | None = None
        #: asks target_fd each tick without waiting (made once, not per tick)
        target_exit: select.poll | None = None
        waker: select.epoll | None = None
        watch: SpaceWatch | None = None
        try:
            exited = _pidfd(proc.pid) if proc is not None else None
            target_fd = _pidfd(target) if target is not None else None
            if target_fd is not None:
                target_exit = select.poll()
                target_exit.register(target_fd, select.POLLIN)
            self.stop.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            wakes: list[Sequence[int] | None] = []
            self._each("wake_fds", lambda h: wakes.append(h.wake_fds()))
            waker, capped = _waker(wakes, exited, self.stop.fd, target_fd)
            longest = max(period, cfg.poll_max_interval_ms / 1000) if capped else math.inf
            if self.parquet is not None:
                watch = SpaceWatch(self.space.error, self.stop.wake, proc)
            while True:
                tick = time.monotonic()
                if watch is not None and watch.error is not None:
                    raise watch.error  # the benchmark is stopped already
                loading = libraries is not None and not libraries.is_set()
                behind = sink.behind
                spilled = self._total("spilled_bytes", lambda h: h.spilled_bytes())
                can_spill = spilled < MAX_SPILLED_BYTES
                if (loading or behind) and can_spill:
                    # Rows cannot be built (libraries loading) or handed over (the sink's
                    # queue is full) without stalling: keep the rings from overflowing.
                    self._each("spill", lambda h: h.spill())
                else:
                    # A round's rows that pass the queue's room go in anyway while the
                    # next round can spill: waiting here for a stalled writer (its
                    # fsync, a slow disk) let the rings overflow for as long.
                    sink.wait_when_full = not can_spill
                    self._each("poll", lambda h: drain(h, sink, self.space))
                if tick >= next_flush:
                    # what hooks hold back goes into this flush
                    self._each(
                        "flush",
                        lambda h: self.space.spool_call(lambda: write_all(sink, h.flushing())),
                    )
                    # Finish the open parts in the writer thread (the loop goes on
                    # draining); once they are finished, that thread has the manifest
                    # rewritten with them (rows, files, the flush's time) and the hooks'
                    # counts as they are now.
                    checkpoint = functools.partial(
                        self.running.flushed, self.running.hook_records(self.hooks)
                    )
                    sink.flush(durable=True, wait=False, then=checkpoint)
                    if self.parquet is not None:
                        finished = self.parquet.checkpoint()[1]
                        self._each(
                            "spool checkpoint",
                            lambda h, f=finished: self.space.spool_call(
                                lambda: h.checkpoint_spool(f)
                            ),
                        )
                    next_flush = tick + cfg.flush_interval_s
                if tick >= next_check:
                    self.space.spool_call(lambda: check_writes(self._each, sink))
                    self.running.check()  # the manifest's last rewrite
                    next_check = tick + SPACE_CHECK_S
                if self.on_progress and tick >= next_progress:
                    self.on_progress(self._progress(tick - start))
                    next_progress = tick + 0.25
                if proc is not None and proc.exited():
                    # before it is reaped: its zombie and what it left are still there
                    self._each("benchmark_ending", lambda h: h.benchmark_ending())
                if proc is not None and proc.poll() is not None:
                    if watch is not None and watch.error is not None:
                        raise watch.error  # it was stopped for that
                    code = exit_status(proc.returncode or 0)
                    return ("completed" if code == 0 else "failed"), code
                if self.stop.signal is not None:
                    return "interrupted", None
                if target is not None and _gone(target, target_exit):
                    if self.on_message:
                        self.on_message(
                            f"note: process {target} (--tgid) exited: the collection ends"
                        )
                    return "completed", None
                if limit is not None and tick - start >= limit:
                    return "duration", None
                now = time.monotonic()
                wake = _next_wake(self._dues(now), tick + period, now + longest)
                wake = min(wake, next_flush, start + limit if limit is not None else wake)
                if self.on_progress:
                    wake = min(wake, next_progress)
                _sleep(max(tick + period, wake) - now, waker)
        finally:
            sink.wait_when_full = True  # the stop's drain waits: no ring to keep up with
            if watch is not None:
                watch.close()  # before the eventfd it writes is closed
            if waker is not None:
                waker.close()
            interrupt, self.stop.fd = self.stop.fd, None
            if interrupt is not None:
                os.close(interrupt)
            if exited is not None:
                os.close(exited)
            if target_fd is not None:
                os.close(target_fd)

    def benchmark_started(self, pid: int) -> None:
        """Tell each hook still collecting that ``pid`` runs the benchmark's command
        (before :meth:`run`); a bug there detaches that hook alone."""
        self._each("benchmark_started", lambda h: h.benchmark_started(pid))

    def _each(self, what: str, fn: Callable[[Hook], object]) -> None:
        """``fn`` on each hook still collecting. The output's errors (an OSError, a
        KernmlopsError: a full disk, a failed write) end the collection as before; any
        other error is a bug in that hook, which is detached (:meth:`_fail`)."""
        for hook in list(self.active):  # _fail takes a hook out of it
            try:
                fn(hook)
            except NOT_A_HOOKS_BUG:
                raise
            except Exception as err:
                self._fail(hook, what, err)

    def _fail(self, hook: Hook, what: str, err: Exception) -> None:
        """Detach and close ``hook``, whose ``what`` raised ``err``; its rows so far
        stay, its status and the manifest say what failed, the others go on. One with
        records in its spool is closed at the stop, once their rows are made."""
        self.failed.append(hook)
        self.active.remove(hook)
        why = f"its {what} raised {type(err).__name__}: {err}"
        held, note = let_go(hook)
        if held:
            self.spooled.append(hook)
        mark_failed(
            hook,
            f"{why}; detached, the other hooks went on{note}",
            f"hook {hook.name} failed ({why}): detached; the collection goes on without it "
            "and exits with 1",
            self.on_message,
        )

    def _dues(self, now: float) -> list[float | None]:
        """Each hook's next_poll, as :meth:`_each` calls it."""
        dues: list[float | None] = []
        self._each("next_poll", lambda h: dues.append(h.next_poll(now)))
        return dues

    def _total(self, what: str, fn: Callable[[Hook], int]) -> int:
        """The sum of ``fn`` over the hooks still collecting, as :meth:`_each` calls it."""
        got: list[int] = []
        self._each(what, lambda h: got.append(fn(h)))
        return sum(got)

    def _progress(self, elapsed: float) -> Progress:
        # calls into the hooks as a poll is: a bug in one detaches it alone
        drops: dict[str, int] = {}
        spooled: dict[str, int] = {}
        self._each("drops", lambda h: drops.__setitem__(h.name, _drops(h)))
        # a spool's failed write is said by check_writes: 0 here
        self._each("spooled_bytes", lambda h: spooled.__setitem__(h.name, spooled_bytes(h)))
        hooks = self.active  # without one that failed meanwhile
        events = {h.name: h.status.events for h in hooks}
        drops = {h.name: drops[h.name] for h in hooks}
        spooled = {h.name: spooled[h.name] for h in hooks}
        return Progress(elapsed, events, drops, {}, self.describe(), spooled)


def _drops(hook: Hook) -> int:
    drops_fn = getattr(hook, "drops", None)
    return drops_fn() if drops_fn else 0


def _next_wake(dues: Sequence[float | None], soonest: float, latest: float) -> float:
    """When the next poll is due: the earliest time a hook asks for (``dues``: each
    hook's next_poll), between ``soonest`` (a hook that polls every interval: None)
    and ``latest``."""
    wake = latest
    for due in dues:
        if due is None:
            return soonest
        wake = min(wake, due)
    return wake


def _sleep(seconds: float, waker: select.epoll) -> None:
    if seconds > 0:
        waker.poll(seconds)


def _waker(wakes: Sequence[Sequence[int] | None], *fds: int | None) -> tuple[select.epoll, bool]:
    """An epoll of what ends the poll loop's sleep: ``fds`` when readable, and each
    hook's wake fds (``wakes``, edge-triggered: a ring that holds records is readable
    until it is drained, but only a program's wake-up is news); whether some hook
    cannot tell (None), so the sleep must be capped."""
    waker = select.epoll()
    capped = False
    try:
        for fd in fds:
            if fd is not None:
                waker.register(fd, select.EPOLLIN)
        for wake in wakes:
            if wake is None:
                capped = True
                continue
            for fd in wake:
                with contextlib.suppress(FileExistsError):  # a map two hooks share
                    waker.register(fd, select.EPOLLIN | select.EPOLLET)
    except BaseException:
        waker.close()
        raise
    return waker, capped


def _gone(pid: int, exits: select.poll | None) -> bool:
    """Whether process ``pid`` has exited: ``exits`` polls its pidfd (readable once it
    exits); without one (it had exited already, or no pidfd_open), whether /proc
    lacks it."""
    if exits is None:
        return not os.path.exists(f"/proc/{pid}")
    return bool(exits.poll(0))


def _pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when ``pid`` exits (Linux 5.3+)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None  # then the loop notices the exit at its next poll
