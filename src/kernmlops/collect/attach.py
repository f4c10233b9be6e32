"""The hooks of one collection, from attach to their last row.

Each hook is started with the collection's context (the process filter, the spool and
its memory, the pacer that says when spooled records may become rows); one that cannot
attach is named with its reason, and with ``--strict`` that is the collection's error.
One whose start raises a bug (not HookUnavailable: what this machine lacks) is detached,
named in one line and marked failed (exit 1); the others are collected all the same,
and what it spooled before its bug becomes rows at the stop, as a hook's whose poll
fails (kernmlops.collect.loop). Wherever a hook fails, :func:`mark_failed` marks it.
At the end every hook is stopped in the order that loses nothing: all programs detached
first, then what the spools hold made into rows on every core where it is much
(kernmlops.collect.rowmaking), then each drained into the sink (or, with no room
left, parked in its spool for ``kernmlops recover``) and closed. A spool's failed
write is the output's error (kernmlops.collect.space); any other error a hook raises
there is a bug in it, which costs that hook alone, as in the poll loop: it is named
in one line and marked failed, and what it leaves in its spool stays for ``recover``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.collect.disk import human_bytes
from kernmlops.collect.rowmaking import MIN_PARALLEL_RAW, make_spooled_rows
from kernmlops.collect.sinks import ThreadedSink
from kernmlops.collect.tuning import trim_as_usual
from kernmlops.errors import NOT_A_HOOKS_BUG, CollectionError, HookUnavailable, KernmlopsError
from kernmlops.hooks.base import Hook, HookContext
from kernmlops.host.cpus import SpareCpu
from kernmlops.spool.memory import spool_memory
from kernmlops.spool.pacing import Pacer
from kernmlops.tables import Rows, Sink

if TYPE_CHECKING:
    from kernmlops.collect.benchmark import Step
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.collect.space import SpaceGuard
    from kernmlops.config import CollectorConfig

__all__ = [
    "DRAIN_QUEUE_BYTES",
    "LeftInSpool",
    "RowMakingError",
    "StrictError",
    "check_writes",
    "detach_all",
    "drain",
    "hook_context",
    "let_go",
    "mark_failed",
    "settle_failed",
    "spooled_bytes",
    "spooling",
    "start_hooks",
    "write_all",
]

#: the sink's queue once the programs are detached: no ring needs the loop any more
DRAIN_QUEUE_BYTES = 4 << 20


class StrictError(KernmlopsError):
    """--strict and a hook could not attach."""


class RowMakingError(CollectionError):
    """The collector's own bug while the stop made the spooled rows on every core: the
    spool is kept for ``kernmlops recover`` (exit 1: a bug, not the output's error)."""

    exit_code = 1


def hook_context(
    collection_id: str,
    cfg: CollectorConfig,
    flt: ProcessFilter | None,
    bpf_dir: Path | None,
    spool_dir: Path | None,
    sink: ThreadedSink,
    self_tgid: int,
) -> HookContext:
    """What every hook of the collection is started with."""
    return HookContext(
        collection_id,
        flt,
        self_tgid,
        bpf_dir,
        spool_dir=spool_dir,
        copier_priority=cfg.copier_priority,
        copier_workers=cfg.copier_workers,
        spool_runway_s=cfg.spool_runway_s,
        # the space guard stops the collection below min_free_mb: a runway must not
        spool_keep_free=int((2 * cfg.min_free_mb + 64) * 2**20),
        poll_interval_ms=cfg.poll_interval_ms,
        poll_max_interval_ms=cfg.poll_max_interval_ms,
        spool_memory=(
            spool_memory(spool_dir, collection_id, cfg.spool_memory)
            if spool_dir is not None
            else None
        ),
        spare=(
            Pacer(
                SpareCpu(need=cfg.spool_spare_cpus),
                lambda: sink.behind,
            )
            if spool_dir is not None
            else None
        ),
    )


def start_hooks(
    hooks: list[Hook],
    new: Iterable[Hook],
    ctx: HookContext,
    *,
    strict: bool,
    failed: list[Hook] | None = None,
    spooled: list[Hook] | None = None,
    on_message: Callable[[str], None] | None = None,
) -> None:
    """Start each of ``new`` and add it to ``hooks`` (first, so that one whose start
    fails is still detached). One started by the caller is not started again. Each
    one's notes are said through ``on_message`` first, before any probe attaches. A
    hook that cannot run here (HookUnavailable) is not attached, with its reason; one
    whose notes or start raise what no hook should (a bug: not the output's OSError or
    a KernmlopsError) is detached, marked failed (the exit code is 1), named in one
    line and added to ``failed`` (left out of the loop); the others go on. What it
    spooled before its bug is no loss, as for a hook whose poll fails: every record it
    holds is moved into its spool, and one that holds any there is left open and added
    to ``spooled`` too (the stop makes their rows and closes it), else it is closed."""
    new = list(new)
    broken: list[Hook] = []
    if on_message is not None:
        for hook in new:  # e.g. more ring groups than CPUs
            try:
                lines = hook.notes()
            except NOT_A_HOOKS_BUG:
                raise
            except Exception as err:
                broken.append(hook)  # never started
                _failed_at_start(hook, "notes", err, strict, failed, spooled, on_message)
                continue
            for line in lines:
                on_message(line)
    for hook in new:
        hooks.append(hook)
        if hook.status.attached or hook in broken:  # started by the caller, or its bug
            continue
        try:
            hook.start(ctx)
        except HookUnavailable as err:
            hook.status.reason = str(err).removeprefix(f"{hook.name}: ")
            if strict:
                raise StrictError(f"--strict: hook {err}") from err
        except NOT_A_HOOKS_BUG:
            raise
        except Exception as err:
            _failed_at_start(hook, "start", err, strict, failed, spooled, on_message)


def mark_failed(
    hook: Hook,
    reason: str,
    line: str | None,
    on_message: Callable[[str], None] | None,
    *,
    attached: bool | None = None,
) -> None:
    """Mark ``hook`` failed, wherever it failed (its start, the poll loop, the stop):
    its status (what the manifest and the exit code read: failed, ``attached`` where
    given) says ``reason``, and ``line`` (None: none, the error says it) is said
    through ``on_message``. The callers word what failed and what became of it."""
    hook.status.failed = True
    hook.status.reason = reason
    if attached is not None:
        hook.status.attached = attached
    if line is not None and on_message:
        on_message(line)


def let_go(hook: Hook) -> tuple[bool, str]:
    """(A hook whose bug was just caught, at its start or in the poll loop) detach it
    and move every record it still holds into its spool (:func:`settle_failed`):
    whether records wait there (the hook is left open: the stop makes their rows and
    closes it; else it is closed now), and what its detach or close raised, as a note
    for its reason ('' where nothing did)."""
    try:
        hook.detach()
        if settle_failed(hook):
            return True, ""
        hook.close()
        return False, ""
    except Exception as again:  # named; the others go on all the same
        note = f" (its close raised {type(again).__name__}: {again})"
        if spooling(hook):
            return True, note  # the stop closes it and names what stays
        with contextlib.suppress(Exception):
            hook.close()
        return False, note


def _failed_at_start(
    hook: Hook,
    what: str,
    err: Exception,
    strict: bool,
    failed: list[Hook] | None,
    spooled: list[Hook] | None,
    on_message: Callable[[str], None] | None,
) -> None:
    why = f"its {what} raised {type(err).__name__}: {err}"
    held, note = let_go(hook)  # what it started before its bug: programs, copier threads
    if failed is not None:
        failed.append(hook)
    if held and spooled is not None:
        spooled.append(hook)
    line = (
        f"hook {hook.name} failed ({why}): not attached; the collection goes on "
        "without it and exits with 1"
    )
    reason = f"{why}; not attached, the other hooks went on{note}"
    mark_failed(hook, reason, None if strict else line, on_message, attached=False)
    if strict:
        raise StrictError(f"--strict: hook {hook.name} failed ({why})") from err


def write_all(sink: Sink, rows: Iterable[tuple[str, Rows]]) -> None:
    for table, frame in rows:
        sink.write(table, frame)


def drain(hook: Hook, sink: Sink, space: SpaceGuard, final: bool = False) -> None:
    """Rows of what ``hook`` holds into ``sink`` (``final``: all of it, at its stop)."""
    space.spool_call(lambda: write_all(sink, hook.stop() if final else hook.poll()))


def check_writes(each: Callable[[str, Callable[[Hook], object]], None], sink: ThreadedSink) -> None:
    """Raise a spool's failed write (the ring copier's, as an OSError) and the sink
    writer's error now, not when the run ends or rows are next written. ``each``:
    calls into each hook still collecting (the poll loop's: a hook's bug detaches it)."""
    each("spooled_bytes", lambda h: h.spooled_bytes())
    sink.check()


def spooled_bytes(hook: Hook) -> int:
    """A hook's spooled bytes; 0 where its spool failed (the error was reported)."""
    try:
        return hook.spooled_bytes()
    except OSError:
        return 0


def spooling(hook: Hook) -> bool:
    """Whether ``hook`` holds records in a spool (a failed spool counts: what it
    wrote stays)."""
    try:
        return hook.spooled_bytes() > 0
    except OSError:
        return True


def settle_failed(hook: Hook) -> bool:
    """(A hook whose poll failed, detached) every record it still holds moved into its
    spool, its rings let go: whether it holds any there, to be made into rows at the
    stop as every hook's are. Its bug was in its Python, not in what it spooled."""
    settle = getattr(hook, "spool_work", None)  # a ring hook's: every record spooled
    if settle is not None:
        settle()
    return spooling(hook)


#: per hook (its id), the bugs it showed at the stop: "its <what> raised <error>"
Faults = dict[int, list[str]]


def guarded(hook: Hook, what: str, fn: Callable[[], object], faults: Faults) -> Callable[[], None]:
    """``fn``, a call into ``hook`` at the stop: the output's errors (an OSError, a
    KernmlopsError) are raised, as every step's; any other is a bug in the hook,
    noted in ``faults`` and said once the hook is closed (:func:`_failed_at_stop`)."""

    def call() -> None:
        try:
            fn()
        except NOT_A_HOOKS_BUG:
            raise
        except Exception as err:
            _note(faults, hook, what, err)

    return call


def _note(faults: Faults, hook: Hook, what: str, err: Exception) -> None:
    faults.setdefault(id(hook), []).append(f"its {what} raised {type(err).__name__}: {err}")


def _failed_at_stop(
    hook: Hook, whys: list[str], shown: Path, on_message: Callable[[str], None] | None
) -> None:
    """``hook`` raised ``whys`` at the stop: marked failed (the exit code is 1), named
    in one line; records left in its spool stay there for ``kernmlops recover``."""
    why = "; ".join(whys)
    again = hook.status.failed  # its poll failed before: said then
    reason = f"at the stop, {why}"
    if again:
        reason = f"{hook.status.reason}; {reason}"
    line = f"hook {hook.name} failed{' again' if again else ''} at the stop ({why})"
    if spooling(hook):
        left = spooled_bytes(hook)
        kept = f"its {human_bytes(left) + ' of ' if left else ''}spooled records are kept"
        reason += f"; {kept} for `kernmlops recover`"
        line += f": {kept}: `kernmlops recover {shown}` makes their rows"
    elif not again:
        line += ": the other hooks' rows are kept; the collection exits with 1"
    mark_failed(hook, reason, line, on_message)


class LeftInSpool(KeyboardInterrupt):
    """Ctrl+C asked again while the stop made rows from the spool: what the spools
    still held stays there for ``kernmlops recover`` (an interrupt, not an error);
    its text says so in the manifest."""


class _Interrupt:
    """Ctrl+C while the stop makes rows from the spool (``asked``: the stop signals
    since the stop began, kernmlops.collect.loop.StopSignals): the first one says what
    goes on and what another does; from the second on, :meth:`__call__` is True and
    what the spools hold stays there. Checked between the rows' batches: the hooks'
    and the sink's state is never cut in the middle, as an exception raised from the
    signal handler would."""

    def __init__(
        self,
        hooks: Sequence[Hook],
        asked: Callable[[], int] | None,
        shown: Path,
        on_message: Callable[[str], None] | None,
    ) -> None:
        self.hooks = hooks
        self.asked = asked
        self.shown = shown
        self.on_message = on_message
        self.noted = False
        #: set once the rest was left in the spool: its line, for the manifest
        self.left: LeftInSpool | None = None

    def __call__(self) -> bool:
        if self.left is not None:
            return True
        n = self.asked() if self.asked is not None else 0
        if not n:
            return False
        held = sum(spooled_bytes(h) for h in self.hooks)
        if not held and not any(spooling(h) for h in self.hooks):
            return False  # nothing to leave: the stop goes on, it is short
        say = self.on_message or (lambda _line: None)
        if n >= 2:
            self.left = LeftInSpool(
                f"interrupted while making rows: {human_bytes(held)} of spooled records "
                f"left in the spool; `kernmlops recover {self.shown}` makes their rows"
            )
            say(str(self.left))
            return True
        if not self.noted:
            self.noted = True
            say(f"note: making rows from {human_bytes(held)} of spooled records; Ctrl+C "
                "again leaves the rest in the spool for `kernmlops recover`")  # fmt: skip
        return False


def _park(hook: Hook) -> None:
    """Stop a spooling hook without making rows from its spool: they stay for
    ``kernmlops recover``. The final drain's first step moves what the rings and the
    CPUs' batches still hold into the spool; the rows it then yields are dropped (they
    are in the spool too), and closing it closes the hook."""
    final = iter(hook.stop())
    try:
        next(final, None)
    finally:
        close = getattr(final, "close", None)
        if close is not None:
            close()


def detach_all(
    hooks: Sequence[Hook],
    sink: ThreadedSink,
    space: SpaceGuard,
    step: Step,
    *,
    full: bool,
    on_message: Callable[[str], None] | None,
    row_workers: int | None = None,
    faults: Faults | None = None,
    asked: Callable[[], int] | None = None,
) -> LeftInSpool | None:
    """Detach every hook, then drain each into ``sink`` and close it; ``full``: the
    output is out of room, and spooled records stay in the spool. ``row_workers``:
    collector.spool_row_workers. A hook's bug here (not the output's error) costs
    that hook alone: it is named and marked failed (``faults``: what it raised before,
    in the same stop). ``asked``: the stop signals since the stop began; from the
    second, the rows not yet made stay in the spool (returned: what says so)."""
    faults = {} if faults is None else faults
    interrupt = _Interrupt(hooks, asked, space.path, on_message)
    for hook in hooks:
        # every program stops before any final drain: a ring still being filled
        # while the others' rows are made would overflow
        step(guarded(hook, "detach", hook.detach, faults))
    sink.max_queued_bytes = min(sink.max_queued_bytes, DRAIN_QUEUE_BYTES)
    trim_as_usual()  # no ring to keep up with: heaps trimmed again in the drain
    # Out of space, spooled records stay in the spool for `kernmlops recover`: their
    # rows would take the room the disk no longer has.
    parked = [h for h in hooks if full and spooling(h)]
    if space.parquet is not None:
        # No workload runs now: the rows made from here on are encoded compactly at
        # once, and compaction keeps their parts instead of reading them back.
        step(lambda: sink.flush(durable=True))
        step(space.parquet.write_whole_parts)
        _rows_on_all_cores(hooks, sink, space, parked, step, on_message, row_workers, faults,
                           interrupt)  # fmt: skip
    spooled = sum(spooled_bytes(h) for h in hooks if h not in parked)
    if spooled >= 64 << 20 and on_message and not interrupt():
        on_message(f"note: making rows from {human_bytes(spooled)} of spooled records")
    for hook in hooks:
        park = hook in parked or (interrupt() and spooling(hook))
        last = functools.partial(_last_drain, hook, sink, space, park=park, until=interrupt)
        step(guarded(hook, "final drain", last, faults))
        step(guarded(hook, "close", hook.close, faults))  # idempotent: detaches even so
        if id(hook) in faults:
            _failed_at_stop(hook, faults[id(hook)], space.path, on_message)
    return interrupt.left


def _last_drain(
    hook: Hook, sink: Sink, space: SpaceGuard, *, park: bool, until: Callable[[], bool]
) -> None:
    if park:
        space.spool_call(lambda: _park(hook))
        return
    # Only a spooling hook's drain may end early: the rest of its rows stay in the
    # spool (every record is there before its first rows come). Another's are in
    # memory alone.
    stoppable = spooling(hook)

    def run() -> None:
        final = iter(hook.stop())
        try:
            for table, frame in final:
                sink.write(table, frame)
                if stoppable and until():
                    break
        finally:
            close = getattr(final, "close", None)
            if close is not None:
                close()  # an early end closes the hook, as a whole drain does

    space.spool_call(run)


def _rows_on_all_cores(
    hooks: Sequence[Hook],
    sink: ThreadedSink,
    space: SpaceGuard,
    parked: list[Hook],
    step: Step,
    on_message: Callable[[str], None] | None,
    count: int | None,
    faults: Faults,
    interrupt: Callable[[], bool] | None = None,
) -> None:
    """The spooled rows made on every core the collector may use, where there are
    enough of them (kernmlops.collect.rowmaking); if their parts could not all be
    taken in, the hooks are parked (the rest stays for ``kernmlops recover``).
    ``count``: collector.spool_row_workers (null: as many as the CPUs allow, from
    MIN_PARALLEL_RAW of records; a number asked for has no minimum). A hook's bug
    there is noted in ``faults`` and parks that hook alone; any other error that is
    not the output's (the collector's own bug) parks them all, said in one line."""
    candidates = [h for h in hooks if h not in parked and hasattr(h, "spool_work")]
    parquet = space.parquet
    if not candidates or count in (0, 1) or parquet is None:
        return
    min_raw = MIN_PARALLEL_RAW if count is None else 0

    def faulty(hook: Hook, what: str, err: Exception) -> None:
        _note(faults, hook, what, err)
        parked.append(hook)  # what it spooled stays there, as the final drain finds it

    def run() -> None:
        try:
            make_spooled_rows(
                candidates,
                parquet,
                lambda: sink.flush(durable=True),
                on_message,
                min_raw=min_raw,
                workers=count,
                faulty=faulty,
                interrupt=interrupt,
            )
        except Exception as err:
            parked.extend(h for h in candidates if h not in parked and spooling(h))
            if isinstance(err, NOT_A_HOOKS_BUG):
                raise
            raise RowMakingError(
                f"making the spooled rows failed ({type(err).__name__}: {err}): the spool "
                f"is kept; `kernmlops recover {space.path}` makes their rows"
            ) from err

    step(lambda: space.spool_call(run))
