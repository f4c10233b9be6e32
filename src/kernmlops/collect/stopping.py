"""The steps of a collection's stop, after the poll loop returned or raised.

:class:`~kernmlops.collect.session.Session` runs them in order, each whatever the
earlier ones did: the benchmark stopped and every hook detached and drained
(:func:`stop_collection`), the sink closed (:func:`close_sink`), the spool removed once
its rows are all in finished parts (:func:`remove_spent_spool`), the parts compacted
(:func:`compact`), and last the participants closed (:func:`close_participants`). A
step that fails adds its error to the run's list instead of raising: one broken hook
or a full disk must not lose the rows the other steps still save; the session
reports the errors once everything is down. A hook's own bug there (not the output's
error) is no error of the run: that hook is named and marked failed, as in the poll
loop (kernmlops.collect.attach).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.collect.attach import Faults, LeftInSpool, detach_all, guarded, spooling
from kernmlops.collect.space import SPACE_STOP_GRACE_S
from kernmlops.collect.tuning import release_free_memory
from kernmlops.spool.recovery import pending_spools, remove_spool

if TYPE_CHECKING:
    from kernmlops.collect.benchmark import RunningBenchmark
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.collect.parquet import ParquetSink
    from kernmlops.collect.participants import Participant
    from kernmlops.collect.running import RunningManifest
    from kernmlops.collect.sinks import ThreadedSink
    from kernmlops.collect.space import SpaceGuard
    from kernmlops.hooks.base import Hook
    from kernmlops.host.environment import Environment
    from kernmlops.tables import Sink

__all__ = ["close_participants", "close_sink", "compact", "remove_spent_spool", "stop_collection"]

#: seconds the benchmark has to exit once asked, when the output still has room
BENCHMARK_STOP_GRACE_S = 5.0


def stop_collection(
    hooks: list[Hook],
    sink: ThreadedSink,
    bench: RunningBenchmark,
    flt: ProcessFilter | None,
    bench_exit: int | None,
    errors: list[BaseException],
    *,
    space: SpaceGuard,
    environment: Environment,
    on_message: Callable[[str], None] | None,
    row_workers: int | None,
    asked: Callable[[], int] | None = None,
) -> int | None:
    """Stop the benchmark, drain and detach every hook, keep the results, tear
    down; return the benchmark's exit status. Each step runs even if an earlier one
    failed (errors are collected): one broken hook must not lose the others' rows.
    ``hooks`` may hold hooks that failed in the poll loop with records in their spool
    (kernmlops.collect.loop): drained too, not told of the benchmark's end.
    ``row_workers``: collector.spool_row_workers. ``asked``: the stop signals since
    the stop began (kernmlops.collect.loop.StopSignals): from the second, the rows not
    yet made stay in the spool, and a LeftInSpool in ``errors`` says so."""

    def step(fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as err:  # collected, reported after cleanup
            errors.append(err)

    full = space.out_of_space()
    space.stopping = not full
    faults: Faults = {}
    for hook in hooks:  # before the stop kills what the benchmark left running
        if not hook.status.failed:
            step(guarded(hook, "benchmark_ending", hook.benchmark_ending, faults))
    bench_exit = bench.stop(
        step, SPACE_STOP_GRACE_S if full else BENCHMARK_STOP_GRACE_S, bench_exit
    )
    left = detach_all(hooks, sink, space, step, full=full, on_message=on_message,
                      row_workers=row_workers, faults=faults, asked=asked)  # fmt: skip
    if left is not None:
        errors.append(left)
    bench.finish(step, sink, bench_exit)
    if flt is not None:
        step(flt.close)
    step(environment.restore)  # THP as it was, even after Ctrl+C or a failure
    return bench_exit


def close_sink(sink: Sink, errors: list[BaseException]) -> dict[str, int]:
    """Close the sink (the last rows written, parts finished); rows per table."""
    try:
        return sink.close()
    except Exception as err:  # the manifest still says what happened
        errors.append(err)
        return {}


def remove_spent_spool(
    spool: Path | None,
    parquet: ParquetSink | None,
    errors: Sequence[BaseException],
    hooks: Sequence[Hook] = (),
) -> None:
    """Once every spooled row is in finished parts, the spool goes; otherwise it
    stays for ``kernmlops recover``: after an error, or where one of ``hooks`` failed
    and left records in it (its bug raised again while their rows were made)."""
    if spool is None or not spool.exists() or parquet is None or parquet.failure:
        return
    failed = any(
        isinstance(e, LeftInSpool) or not isinstance(e, KeyboardInterrupt) for e in errors
    ) or any(h.status.failed and spooling(h) for h in hooks)
    folder = spool.parent  # the collection, held open
    if failed and any(seg.exists() and seg.stat().st_size for seg in pending_spools(folder)):
        return  # records a recovery can still turn into rows
    remove_spool(spool)


def compact(
    parquet: ParquetSink,
    running: RunningManifest,
    on_message: Callable[[str], None] | None,
    errors: list[BaseException],
) -> None:
    """One file per table instead of one per flush (see ParquetSink.compact); the
    outcome goes to the manifest."""
    parts = sum(len(f) for f in parquet.files_written().values())
    if parts >= 100 and on_message:
        on_message(f"note: compacting {parts} flushed parts into one file per table")
    release_free_memory()
    try:
        running.compaction = parquet.compact()
    except KeyboardInterrupt as err:  # a second Ctrl+C: the parts stay as they were
        errors.append(err)


def close_participants(participants: Sequence[Participant], errors: list[BaseException]) -> None:
    """Last, once the collection is written: the exporter serves the job's final
    values until a scrape took them (or collector.export_grace_s passed)."""
    for participant in participants:
        try:
            participant.close()
        except Exception as err:  # reported; the collection is already written
            errors.append(err)
