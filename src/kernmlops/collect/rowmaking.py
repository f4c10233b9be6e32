"""Rows made from the spool on several cores at stop.

Under a storm the collector only copies records into the spool (kernmlops.spool)
while the workload has the CPUs; their rows are made once it ends. One core makes
about 2.3-3.1M records' rows a second (bench/README.md, `capacity`), so one core
alone would keep a 16-core storm's collection (~8M records a second) unreadable for
about three times the storm's length. Once the hooks are
detached, what the spools still hold is cut in jobs of whole frames, in order, and
processes of their own (one per CPU the collector may use) each turn one job into
compactly encoded Parquet parts in a hidden folder of the collection. The session
then takes the parts into the tables, in spool order, after the parts of the run
(ParquetSink.adopt: a rename), and compaction keeps them as they are.

Anything that goes wrong in a worker (a frame failing its checksum, a hook that is
not registered, a process that dies) costs only time: its parts are deleted and the
rows are made in the collector as before, which names any damage. Once parts are
taken in, the spool is read to its end; a collector killed in between leaves a
spool that ``kernmlops recover`` finishes (it skips the rows finished parts hold).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmlops.collect.disk import human_bytes
from kernmlops.errors import NOT_A_HOOKS_BUG, CollectionError
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from kernmlops.collect.parquet import ParquetSink
    from kernmlops.hooks.base import Hook
    from kernmlops.spool.jobs import SpoolPiece, SpoolWork
else:
    np = lazy_import("numpy")
    pa = lazy_import("pyarrow")

__all__ = ["MIN_PARALLEL_RAW", "Job", "Made", "make_rows", "make_spooled_rows"]

#: spooled record bytes below which the rows are made in the collector: starting
#: the processes (an interpreter, numpy, pyarrow, the hook) costs about a second
MIN_PARALLEL_RAW = 96 << 20
#: usable CPUs from which the rows are made in workers by default: each worker's start
#: (an interpreter, numpy, pyarrow, the hook) costs 1-2 s of CPU, more than a second
#: core gives back (2-vCPU VM, `python -m bench storm-tree --row-workers 1 null`: a
#: 10-s storm's 5M records readable 2.7 s after its end in the collector, 3.9 s with
#: two workers, medians of 3)
MIN_WORKER_CPUS = 4
#: record bytes a job has at least (fewer jobs than CPUs for a small spool)
MIN_JOB_RAW = 32 << 20
#: processes at most, and the memory a machine has per process at least (each holds
#: the libraries and a Parquet writer's buffers: ~100-200 MB)
MAX_WORKERS = 64
WORKER_RAM = 1 << 30
#: the hidden folder of the collection where the workers write their parts
STAGING_PREFIX = ".rows-"


@dataclass(frozen=True)
class Job:
    """Frames of one ring's spool, in order, for one worker."""

    folder: str
    key: str
    pieces: list[SpoolPiece]
    out: str
    collection_id: str
    row_group_rows: int
    rows_per_file: int
    compression: str


@dataclass
class Made:
    """What a worker made of its job: per table its schema and its finished parts
    (path relative to the job's ``out``, rows), and the records it read."""

    parts: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    schemas: dict[str, Any] = field(default_factory=dict)
    records: int = 0


def make_rows(job: Job) -> Made:
    """(In a worker process) the job's frames as Parquet parts under ``job.out``."""
    from kernmlops.collect.parquet import ParquetSink
    from kernmlops.ebpf.btf import unbatch
    from kernmlops.ebpf.ringbuf import decode
    from kernmlops.ebpf.spec import object_spec
    from kernmlops.hooks import get_hook
    from kernmlops.spool.frames import SegmentFormat, iter_segment

    info = json.loads((Path(job.folder) / f"{job.key}.json").read_text())
    cls = get_hook(info["hook"])
    hook = cls(cls.Options.model_validate(info["options"]))
    layout = object_spec(Path(info["object"])).ring_layouts()[info["ring"]]
    dtype = layout.batch if layout.batch is not None else layout.dtype
    formats = {None: SegmentFormat(None), "zstd": SegmentFormat(pa.Codec("zstd"))}
    sink = ParquetSink(
        Path(job.out),
        job.collection_id,
        row_group_rows=job.row_group_rows,
        rows_per_file=job.rows_per_file,
        compression=job.compression,
    )
    made = Made()
    fds: dict[str, int] = {}
    try:
        for piece in job.pieces:
            if piece.path not in fds:
                fds[piece.path] = os.open(piece.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            data = os.pread(fds[piece.path], piece.end - piece.start, piece.start)
            for frame in iter_segment(data, formats[piece.codec]):
                if frame.raw is None:
                    raise CollectionError(f"{piece.path}: {frame.reason} at byte "
                                          f"{piece.start + frame.start:,}")  # fmt: skip
                raw = np.frombuffer(frame.raw, np.uint8)
                records = decode(raw, 1, 0, len(raw), dtype).records
                if layout.batch is not None:
                    records = unbatch(records, layout)
                made.records += len(records)
                for table, rows in hook.rows_from(job.key, records, layout):
                    sink.write(table, rows)
        sink.close()
    finally:
        for fd in fds.values():
            os.close(fd)
    out = Path(job.out)
    for table, files in sink.files_written().items():
        made.parts[table] = [(name, _rows_of(out / name)) for name in files]
        made.schemas[table] = sink.table_schema(table)
    return made


def _rows_of(part: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(part).metadata.num_rows


def plan(
    work: Sequence[SpoolWork], workers: int, min_job: int = MIN_JOB_RAW
) -> list[tuple[SpoolWork, list[SpoolPiece]]]:
    """Each spool's pieces cut in runs of about equal record bytes (never across
    spools), in order: about ``workers`` jobs over all, none under ``min_job``."""
    total = sum(w.raw for w in work)
    share = max(min_job, -(-total // max(1, workers)), 1)
    jobs: list[tuple[SpoolWork, list[SpoolPiece]]] = []
    for w in work:
        run: list[SpoolPiece] = []
        held = 0
        for piece in w.pieces:
            run.append(piece)
            held += piece.raw
            if held >= share:
                jobs.append((w, run))
                run, held = [], 0
        if run:
            jobs.append((w, run))
    return jobs


def workers_for(raw: int, cpus: int | None = None, ram: int | None = None) -> int:
    """Processes for ``raw`` spooled bytes: one per usable CPU (none under
    MIN_WORKER_CPUS), one per MIN_JOB_RAW, one per WORKER_RAM of the machine's memory."""
    cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
    if cpus < MIN_WORKER_CPUS:
        return 1
    if ram is None:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(1, min(cpus, MAX_WORKERS, ram // WORKER_RAM, -(-raw // MIN_JOB_RAW)))


def make_spooled_rows(
    hooks: Sequence[Hook],
    parquet: ParquetSink,
    flush: Callable[[], None],
    on_message: Callable[[str], None] | None = None,
    *,
    min_raw: int = MIN_PARALLEL_RAW,
    workers: int | None = None,
    faulty: Callable[[Hook, str, Exception], None] | None = None,
    interrupt: Callable[[], bool] | None = None,
) -> list[Hook]:
    """(The hooks detached) make the rows of what the hooks' spools hold in worker
    processes and take their parts into ``parquet`` (``flush`` first finishes the
    run's parts); the hooks whose spools are then read to their end. Nothing is done
    (and [] returned) under ``min_raw`` bytes or with one usable CPU; a failure
    says so in one line, and the caller's final drain makes the rows instead.
    ``faulty``: told of a hook's bug (``spool_work`` or ``spool_made`` raising what
    no hook should), which leaves that hook out, its spool as it is; without it,
    the bug is raised. ``interrupt``: True once the user asked to leave the rest in
    the spool (a second Ctrl+C): the workers are stopped, nothing is taken in.

    Raises:
        CollectionError: parts were taken in and then one could not be: the rest
            stays in the spool for ``kernmlops recover``.
    """
    found: list[tuple[Hook, SpoolWork]] = []
    bad: list[Hook] = []

    def fault(hook: Hook, what: str, err: Exception) -> None:
        if faulty is None or isinstance(err, NOT_A_HOOKS_BUG):
            raise err
        bad.append(hook)
        faulty(hook, what, err)

    try:
        for hook in hooks:
            spool_work = getattr(hook, "spool_work", None)
            if spool_work is None:
                continue
            try:
                found += [(hook, w) for w in spool_work()]
            except (OSError, ValueError):
                raise
            except Exception as err:  # that hook's bug: the others' rows are made
                fault(hook, "spool_work", err)
    except (OSError, ValueError) as err:  # e.g. a spool file gone: said by the final drain
        if on_message:
            on_message(f"cannot cut the spool in jobs ({_why(err)}): making the rows here")
        return []
    raw = sum(w.raw for _, w in found)
    n = workers if workers is not None else workers_for(raw)
    if raw < min_raw or n < 2:
        return []
    if on_message:
        on_message(f"note: making rows from {human_bytes(raw)} of spooled records on {n} cores")
    planned = plan([w for _, w in found], n, MIN_JOB_RAW if workers is None else 0)
    staging = parquet.collection_dir / f"{STAGING_PREFIX}{os.getpid()}"
    jobs = [
        Job(
            _shared(w.folder),
            w.key,
            [p._replace(path=_shared(p.path)) for p in pieces],
            _shared(staging / str(i)),
            parquet.collection_id,
            parquet.row_group_rows,
            parquet.rows_per_file,
            parquet.compression,
        )
        for i, (w, pieces) in enumerate(planned)
    ]
    try:
        made = _run(jobs, n, interrupt)
    except _Interrupted:  # the final drain finds it asked too: the spool stays
        shutil.rmtree(staging, ignore_errors=True)
        return []
    except Exception as err:  # any failure costs time only: the rows are made here
        shutil.rmtree(staging, ignore_errors=True)
        if on_message:
            why = str(err) if isinstance(err, _WorkerError) else _why(err)
            on_message(f"making rows on {n} cores failed ({why}): making them here")
        return []
    rows: dict[int, dict[str, int]] = {}  # per spool (id of its work): rows per table
    records: dict[int, int] = {}
    try:
        flush()
        for job, (w, _), result in zip(jobs, planned, made, strict=True):
            made_rows = rows.setdefault(id(w), {})
            for table, parts in result.parts.items():
                for name, count in parts:
                    parquet.adopt(table, Path(job.out) / name, count, result.schemas[table])
                    made_rows[table] = made_rows.get(table, 0) + count
            records[id(w)] = records.get(id(w), 0) + result.records
    except (OSError, RuntimeError, CollectionError) as err:
        raise CollectionError(
            f"taking in the rows made on {n} cores failed ({_why(err)}): the spool is "
            "kept; run `kernmlops recover` on the collection"
        ) from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    done: list[Hook] = []
    for hook, w in found:
        if hook in bad:
            continue  # its spool stays: a recovery skips the rows taken in
        try:
            hook.spool_made(w.key, rows.get(id(w), {}), records.get(id(w), 0))  # type: ignore[attr-defined]
        except Exception as err:  # that hook's bug: the others' spools are read
            fault(hook, "spool_made", err)
            continue
        if hook not in done:
            done.append(hook)
    return [h for h in done if h not in bad]


def _run(jobs: list[Job], workers: int, interrupt: Callable[[], bool] | None = None) -> list[Made]:
    """The jobs' results in order, each from a fresh process (``python -m
    kernmlops.collect.rowmaking``, the job on its stdin, what it made on its stdout),
    at most ``workers`` at a time. Plain processes, not multiprocessing's: a fork would
    copy the collector's threads' locks, and a spawn pool leaves its resource tracker
    running in a process that goes on (a notebook, a test run)."""
    import subprocess
    import sys

    import kernmlops

    env = dict(os.environ)
    # the package as this process has it (a checkout on PYTHONPATH, a venv, a wheel)
    home = str(Path(kernmlops.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (home, env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "kernmlops.collect.rowmaking"]
    results: list[Made | None] = [None] * len(jobs)
    running: dict[int, subprocess.Popen[bytes]] = {}
    todo = list(range(len(jobs)))
    try:
        while todo or running:
            while todo and len(running) < workers:
                i = todo.pop(0)
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env)  # fmt: skip
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(asdict(jobs[i])).encode())
                proc.stdin.close()
                proc.stdin = None  # communicate() then only reads
                running[i] = proc
            i, proc = next(iter(running.items()))
            out, err = _wait(proc, interrupt)
            del running[i]
            if proc.returncode != 0:
                lines = err.decode(errors="replace").strip().splitlines()
                raise _WorkerError(lines[-1] if lines else f"a worker exited {proc.returncode}")
            results[i] = _made_from(json.loads(out))
    finally:
        for proc in running.values():  # a failed job, or a second Ctrl+C: not waited for
            proc.kill()
            proc.wait()
    return [r for r in results if r is not None]


#: how often a wait for a worker looks whether the user asked to leave the rest (s)
INTERRUPT_CHECK_S = 0.2


def _wait(proc: Any, interrupt: Callable[[], bool] | None) -> tuple[bytes, bytes]:
    """A worker's stdout and stderr once it exits; raises _Interrupted as soon as
    ``interrupt`` says so (the caller kills the workers)."""
    import subprocess

    if interrupt is None:
        return proc.communicate()
    while True:
        try:
            return proc.communicate(timeout=INTERRUPT_CHECK_S)
        except subprocess.TimeoutExpired:
            if interrupt():
                raise _Interrupted from None


class _Interrupted(Exception):
    """The user asked to leave the rest of the spool while workers made rows."""


class _WorkerError(Exception):
    """A worker's own one line (its error's type and message)."""


def _made_to(made: Made) -> dict[str, Any]:
    schemas = {t: s.serialize().to_pybytes() for t, s in made.schemas.items()}
    return {
        "parts": made.parts,
        "schemas": {t: base64.b64encode(b).decode() for t, b in schemas.items()},
        "records": made.records,
    }


def _made_from(data: dict[str, Any]) -> Made:
    import pyarrow.ipc

    schemas = {t: pyarrow.ipc.read_schema(pa.py_buffer(base64.b64decode(s)))
               for t, s in data["schemas"].items()}  # fmt: skip
    parts = {t: [(name, int(n)) for name, n in files] for t, files in data["parts"].items()}
    return Made(parts, schemas, int(data["records"]))


def _job_from(data: dict[str, Any]) -> Job:
    from kernmlops.spool.jobs import SpoolPiece

    return Job(**{**data, "pieces": [SpoolPiece(*p) for p in data["pieces"]]})


def main() -> int:
    """A worker: a job (JSON) on stdin, what it made (JSON) on stdout. It leaves
    Ctrl+C to the collector (the terminal sends it to the whole process group),
    which decides whether the rows are still made; and, as the collector, never
    loads what it does not use (pyarrow's first numpy array would import pandas: a
    second of CPU)."""
    import signal
    import sys

    from kernmlops.collect.tuning import UNUSED_LIBRARIES
    from kernmlops.lazy import keep_out

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_out(*UNUSED_LIBRARIES)
    try:
        made = make_rows(_job_from(json.loads(sys.stdin.buffer.read())))
    except Exception as err:  # the collector says it in one line, and makes the rows
        print(_why(err), file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(_made_to(made)))
    return 0


def _shared(path: str | Path) -> str:
    """``path`` as another process names it: a folder the collector holds open is
    ``/proc/self/fd/N/...`` here (kernmlops.host.pinned), ``/proc/<its pid>/fd/N/...``
    there."""
    text = str(path)
    return (
        text.replace("/proc/self/", f"/proc/{os.getpid()}/", 1)
        if text.startswith("/proc/self/")
        else text
    )


def _why(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


if __name__ == "__main__":
    raise SystemExit(main())
