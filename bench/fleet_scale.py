"""How a fleet dataset's cost grows: the per-collection summaries over 10, 100 and 1,000
published collections with polars, DuckDB and Spark, and `kernmlops fleet ls`.

One real collection is made by ``kernmlops collect`` (root and BPF; or given with
``--source``): system-wide scheduler quanta, page faults and block I/O for a few
seconds while ``dd`` writes with O_DIRECT. It is copied with new collection ids, host
names and start times into a dataset in the fleet's Hive layout, each copy published
as a push publishes (parts, then the manifest, then its row of ``_index/``, written by
kernmlops.fleet's own functions). The dataset grows 10 -> 100 -> 1,000 collections and
at each size every engine computes the summaries of ``kernmlops spark-job``
(``collections``: quanta, switches/s, faults/s, block I/O latency mean/p50/p99;
``quanta_by_comm``: quanta and queued wake-ups per command, run and queue time
mean/p50/p99) over the published collections and writes them as Parquet:

* polars: one lazy plan over ``scan_parquet(..., hive_partitioning=True)``;
* DuckDB: SQL over ``read_parquet(..., hive_partitioning=true)``;
* Spark: the shipped job (``kernmlops.fleet.spark_job.run``) in a warm session on
  ``local[*]``, and on a standalone cluster on this machine (a master and two one-core
  workers, kernmlops.fleet.local_cluster, as tests/fleet starts it) at
  ``--standalone-sizes``; each session in a process of its own;
* ``kernmlops fleet ls DATASET`` as a user runs it (a new process: start-up included).

Rounds are interleaved, all engines in each (the machine's load drifts: the drift falls
on every engine alike); each engine's median is its time per size. The engines'
outputs must agree (same rows, integers equal, floats within 1e-9 relative) and Spark
must read every column of every table with its natural type (no ``decimal(20,0)``),
or the run fails. A line t = start-up + N x per-collection is fitted to each engine's
medians; beside it the cost of starting the engine itself (imports; the JVM and the
session; the cluster). The source is system-wide, so its rows depend on what else ran;
the results file records them. Data is private to the run (a temporary folder, removed).

    sudo python -m bench fleet-scale                       # 10, 100, 1,000
    python -m bench fleet-scale --source data/curated/benchmark=faux/collection_id=<id>
    python -m bench fleet-scale --sizes 10,100 --rounds 2 --standalone-sizes ''
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import save

#: what this benchmark is held to (python -m bench list shows it)
TARGET = (
    "the engines agree and Spark reads natural types; at 1,000 collections `fleet ls` "
    "≤ 2 s and the summaries ≤ 10 s with one engine (interactive)"
)

ID = "collection_id"
BENCH = "benchmark"
#: the tables the summaries read (the job's inputs but lb_decisions: `lb collect` only)
TABLES = ("quanta_runtime", "quanta_queued_time", "process_trace", "page_faults", "block_io")
HOOKS = "process_trace,quanta_runtime,page_faults,block_io,system_info"
#: the summaries' keys, for putting every engine's rows in one order
KEYS = {"collections": [ID], "quanta_by_comm": [ID, BENCH, "comm"]}
OUTPUTS = tuple(KEYS)
REL_TOL = 1e-9
#: the target's figures (TARGET), at 1,000 collections
TARGET_LS_S = 2.0
TARGET_SUMMARIES_S = 10.0
#: every engine timed, and those that compute the summaries (``ls`` lists the index)
ENGINES = ("polars", "duckdb", "spark", "spark-standalone", "ls")
SUMMARY_ENGINES = ["polars", "duckdb", "spark", "spark-standalone"]


# --- the dataset ----------------------------------------------------------------------------
def make_source(workdir: Path, seconds: float) -> Path:
    """A real collection: ``kernmlops collect`` system-wide while ``dd`` writes with
    O_DIRECT (block I/O) for ``seconds``; run from ``workdir`` so that no overrides.yaml
    of the caller's folder changes it."""
    target = workdir / "dd.bin"
    loops = max(1, int(seconds * 4))
    # O_DIRECT reaches the disk at once; a tmpfs refuses it (then no block I/O: no error)
    script = (
        f"i=0; while [ $i -lt {loops} ]; do dd if=/dev/zero of={target} bs=64k count=8 "
        "oflag=direct conv=fsync status=none 2>/dev/null; sleep 0.25; i=$((i+1)); done"
    )
    out = workdir / "source"
    cmd = [sys.executable, "-m", "kernmlops", "collect", "--system-wide", "--hooks", HOOKS,
           "--no-progress", "-o", str(out), "--", "sh", "-c", script]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=workdir, env=harness.child_env(), capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        sys.exit(f"kernmlops collect failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    found = sorted(out.glob(f"curated/{BENCH}=*/{ID}=*/manifest.json"))
    if len(found) != 1:
        sys.exit(f"kernmlops collect wrote {len(found)} collections under {out}")
    return found[0].parent


class Copier:
    """Copies of one collection published into a dataset: the parts with the new id in
    their ``collection_id`` column, a manifest naming the new id, host and start, the
    index row from the published parts' footers (kernmlops.fleet.index)."""

    def __init__(self, source: Path, dataset_root: Path) -> None:
        import pyarrow.parquet as pq

        from kernmlops.fleet import open_dataset

        self.manifest: dict[str, Any] = json.loads((source / "manifest.json").read_text())
        self.parts = {
            p.relative_to(source).as_posix(): pq.read_table(p)
            for p in sorted(source.glob("*/*.parquet"))
        }
        self.source = source
        self.benchmark = source.parent.name  # benchmark=<b>, as on the collector's disk
        self.source_id = str(self.manifest.get(ID) or source.name.split("=", 1)[1])
        self.dataset = open_dataset(dataset_root)
        self.root = dataset_root
        self.count = 0

    def collection_id(self, i: int) -> str:
        # ids shaped as the collector's (uuid4 text), reproducible from the source's id
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.source_id}/{i}"))

    def add(self, i: int) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from kernmlops.collect.manifest import Manifest
        from kernmlops.fleet.index import index_row, write_index_row
        from kernmlops.fleet.push import collection_files
        from kernmlops.fleet.store import put

        cid = self.collection_id(i)
        prefix = f"{self.benchmark}/{ID}={cid}"
        folder = self.root / prefix
        for rel, table in self.parts.items():
            if ID in table.column_names:
                k = table.column_names.index(ID)
                column = pa.array([cid] * table.num_rows, table.schema.field(k).type)
                table = table.set_column(k, table.schema.field(k), column)
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, folder / rel, compression="zstd")
        manifest = dict(self.manifest, **{ID: cid})
        manifest["system"] = dict(manifest.get("system") or {}, hostname=f"node-{i:04d}")
        for key in ("started_at", "stopped_at", "updated_at"):
            if manifest.get(key):
                when = datetime.fromisoformat(manifest[key]) + timedelta(minutes=i)
                manifest[key] = when.isoformat()
        text = json.dumps(manifest, indent=2).encode()
        # as a push: the manifest after the parts, then the index row
        put(self.dataset, text, f"{prefix}/manifest.json")
        row = index_row(Manifest.model_validate_json(text), prefix, collection_files(folder))
        write_index_row(self.dataset, row, cid)
        self.count += 1

    def grow(self, size: int) -> float:
        """Publish copies until the dataset holds ``size``; the seconds it took."""
        t = time.perf_counter()
        while self.count < size:
            self.add(self.count)
        return time.perf_counter() - t

    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())


# --- the engines ----------------------------------------------------------------------------
def _glob(root: Path, table: str) -> str:
    return f"{root}/{BENCH}=*/{ID}=*/{table}/*.parquet"


def present(root: Path, tables: tuple[str, ...] = TABLES) -> set[str]:
    """The tables some collection has (every engine is given the same answer)."""
    return {t for t in tables if next(root.glob(f"{BENCH}=*/{ID}=*/{t}/*.parquet"), None)}


def polars_summaries(root: Path, out: Path, tables: set[str]) -> None:
    """The job's two summaries as one lazy polars plan, written as Parquet (rows counted
    in 64 bits, as Spark's count: a collection's quanta pass pl.len()'s 2^32 - 1)."""
    import polars as pl

    from kernmlops.data import len64

    hive = {BENCH: pl.String, ID: pl.String}
    index = pl.scan_parquet(f"{root}/_index/*.parquet")
    ids = index.select(ID)

    def scan(table: str) -> pl.LazyFrame | None:
        if table not in tables:
            return None
        frame = pl.scan_parquet(
            _glob(root, table), hive_partitioning=True, hive_schema=hive,
            hidden_file_prefix=(".", "_"),
        )  # fmt: skip
        return frame.join(ids, on=ID, how="semi")  # published collections only

    def pcts(column: str, prefix: str) -> list[pl.Expr]:
        # equiprobable: the smallest value with at least p of the values at or below it,
        # what Spark's percentile_approx gives below its accuracy (10,000 values)
        col = pl.col(column)
        return [
            col.mean().alias(f"{prefix}_mean_us"),
            col.quantile(0.5, "equiprobable").alias(f"{prefix}_p50_us"),
            col.quantile(0.99, "equiprobable").alias(f"{prefix}_p99_us"),
        ]

    quanta, queued = scan("quanta_runtime"), scan("quanta_queued_time")
    faults, block_io, trace = scan("page_faults"), scan("block_io"), scan("process_trace")
    names = None
    if trace is not None:
        names = (
            trace.filter(pl.col("comm").is_not_null())
            .sort("ts_uptime_us")
            .group_by(ID, "pid")
            .agg(pl.col("comm").last())
        )

    def named(frame: pl.LazyFrame) -> pl.LazyFrame:
        if names is not None:
            frame = frame.join(names, on=[ID, "pid"], how="left")
        else:
            frame = frame.with_columns(comm=pl.lit(None, pl.String))
        return frame.with_columns(comm=pl.coalesce("comm", pl.format("pid {}", pl.col("pid"))))

    frames: dict[str, pl.LazyFrame] = {}
    if quanta is not None:
        by_comm = (
            named(quanta)
            .group_by(ID, BENCH, "comm")
            .agg(len64().alias("quanta"), *pcts("quanta_run_length_us", "runtime"))
        )
        if queued is not None:
            waits = (
                named(queued)
                .group_by(ID, BENCH, "comm")
                .agg(len64().alias("queued"), *pcts("quanta_queued_time_us", "queue"))
            )
            by_comm = by_comm.join(waits, on=[ID, BENCH, "comm"], how="full", coalesce=True)
        frames["quanta_by_comm"] = by_comm

    summary = index.select(
        ID, BENCH, "host", "kernel", "cpu_model", "logical_cpus", "started_at", "state",
        "duration_s",
    )  # fmt: skip
    if quanta is not None:
        per = quanta.group_by(ID).agg(
            len64().alias("quanta"),
            ((pl.col("ts_uptime_us").max() - pl.col("ts_uptime_us").min()) / 1e6).alias("_span_s"),
        )
        summary = summary.join(per, on=ID, how="left")
    else:
        summary = summary.with_columns(quanta=pl.lit(None, pl.Int64), _span_s=None)
    seconds = pl.coalesce("duration_s", "_span_s")
    summary = summary.with_columns(switches_per_s=pl.col("quanta") / seconds)
    if faults is not None:
        summary = summary.join(faults.group_by(ID).agg(len64().alias("faults")), on=ID, how="left")
    else:
        summary = summary.with_columns(faults=pl.lit(None, pl.Int64))
    summary = summary.with_columns(faults_per_s=pl.col("faults") / seconds)
    if block_io is not None:
        per = block_io.group_by(ID).agg(
            len64().alias("block_ios"), *pcts("issue_to_complete_us", "block_io")
        )
        summary = summary.join(per, on=ID, how="left")
    else:
        summary = summary.with_columns(
            block_ios=pl.lit(None, pl.Int64), block_io_mean_us=None, block_io_p50_us=None,
            block_io_p99_us=None,
        )  # fmt: skip
    frames["collections"] = summary.drop("_span_s").sort("started_at", ID)
    # one collect: the plans share their scans (quanta_runtime is read once)
    done = pl.collect_all(list(frames.values()))
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in zip(frames, done, strict=True):
        frame.write_parquet(out / f"{name}.parquet")


def duckdb_summaries(con: Any, root: Path, out: Path, tables: set[str]) -> None:
    """The job's two summaries in DuckDB's SQL, written as Parquet (COPY)."""
    hive = "hive_partitioning=true, hive_types={'benchmark': VARCHAR, 'collection_id': VARCHAR}"

    def scan(table: str) -> str | None:
        if table not in tables:
            return None
        return (
            f"(select * from read_parquet('{_glob(root, table)}', {hive}) "
            f"where {ID} in (select {ID} from idx))"
        )

    def pcts(column: str, prefix: str) -> str:
        # quantile_disc: the smallest value with at least p at or below it (as Spark's)
        return (
            f"avg({column}) as {prefix}_mean_us, quantile_disc({column}, 0.5) as "
            f"{prefix}_p50_us, quantile_disc({column}, 0.99) as {prefix}_p99_us"
        )

    quanta, queued = scan("quanta_runtime"), scan("quanta_queued_time")
    faults, block_io, trace = scan("page_faults"), scan("block_io"), scan("process_trace")
    ctes = [f"idx as (select * from read_parquet('{root}/_index/*.parquet'))"]
    if trace is not None:
        ctes.append(
            f"names as (select {ID}, pid, arg_max(comm, ts_uptime_us) as comm from {trace} t "
            f"where comm is not null group by all)"
        )
        join = f"left join names using ({ID}, pid)"
        comm = "coalesce(names.comm, 'pid ' || pid::varchar)"
    else:
        join, comm = "", "'pid ' || pid::varchar"
    out.mkdir(parents=True, exist_ok=True)
    with_ = "with " + ", ".join(ctes)
    if quanta is not None:
        runs = (
            f"select {ID}, {BENCH}, {comm} as comm, count(*) as quanta, "
            f"{pcts('quanta_run_length_us', 'runtime')} from {quanta} q {join} group by all"
        )
        query = runs
        if queued is not None:
            waits = (
                f"select {ID}, {BENCH}, {comm} as comm, count(*) as queued, "
                f"{pcts('quanta_queued_time_us', 'queue')} from {queued} w {join} group by all"
            )
            query = f"select * from ({runs}) full outer join ({waits}) using ({ID}, {BENCH}, comm)"
        con.execute(
            f"copy ({with_} {query}) to '{out / 'quanta_by_comm.parquet'}' (format parquet)"
        )
    seconds = "coalesce(idx.duration_s, q.span_s)"
    select = [f"idx.{c}" for c in (ID, BENCH, "host", "kernel", "cpu_model", "logical_cpus",
                                   "started_at", "state", "duration_s")]  # fmt: skip
    joins = []
    if quanta is not None:
        joins.append(
            f"left join (select {ID}, count(*) as quanta, (max(ts_uptime_us) - "
            f"min(ts_uptime_us)) / 1e6 as span_s from {quanta} group by all) q using ({ID})"
        )
        select += ["q.quanta", f"q.quanta / {seconds} as switches_per_s"]
    else:
        seconds = "idx.duration_s"
        select += ["null::bigint as quanta", "null::double as switches_per_s"]
    if faults is not None:
        joins.append(
            f"left join (select {ID}, count(*) as faults from {faults} group by all) f using ({ID})"
        )
        select += ["f.faults", f"f.faults / {seconds} as faults_per_s"]
    else:
        select += ["null::bigint as faults", "null::double as faults_per_s"]
    if block_io is not None:
        joins.append(
            f"left join (select {ID}, count(*) as block_ios, "
            f"{pcts('issue_to_complete_us', 'block_io')} from {block_io} group by all) b "
            f"using ({ID})"
        )
        select += ["b.block_ios", "b.block_io_mean_us", "b.block_io_p50_us", "b.block_io_p99_us"]
    else:
        nulls = {"block_ios": "bigint", "block_io_mean_us": "double",
                 "block_io_p50_us": "bigint", "block_io_p99_us": "bigint"}  # fmt: skip
        select += [f"null::{kind} as {name}" for name, kind in nulls.items()]
    query = (
        f"{with_} select {', '.join(select)} from idx {' '.join(joins)} "
        f"order by idx.started_at, idx.{ID}"
    )
    con.execute(f"copy ({query}) to '{out / 'collections.parquet'}' (format parquet)")


def spark_summaries(spark: Any, root: Path, out: Path) -> None:
    """The shipped job, as ``kernmlops spark-job`` runs it."""
    from kernmlops.fleet.spark_job import run

    run(spark, str(root), str(out))


def fleet_ls(root: Path) -> None:
    """``kernmlops fleet ls DATASET`` in a new process, as a user runs it."""
    subprocess.run(
        [sys.executable, "-m", "kernmlops", "fleet", "ls", str(root)],
        env=harness.child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        check=True, timeout=600,
    )  # fmt: skip


# --- Spark ----------------------------------------------------------------------------------
#: quiet consoles; every other setting as ``kernmlops spark-job`` leaves it
SPARK_CONF = {"spark.ui.showConsoleProgress": "false"}
#: the start of a line the Spark child says to this process (the JVM shares its stdout)
MARK = "@@fleet-scale "


def spark_session(master: str) -> Any:
    from kernmlops.fleet.spark_job import session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return session(master, app="kernmlops-fleet-scale", **SPARK_CONF)


def serve_spark(master: str) -> None:
    """The Spark child: one session on ``master``, then commands from stdin (JSON lists:
    ``["run", root, out]``, ``["types", root, source]``, ``["quit"]``), each answered
    with a MARK line (``["ready", session_s]``, ``["done"]``, ``["types", {...}]``,
    ``["error", text]``)."""
    import traceback

    def say(*message: Any) -> None:
        print(MARK + json.dumps(message), flush=True)

    t = time.perf_counter()
    spark = spark_session(master)
    spark.range(1).count()
    say("ready", time.perf_counter() - t)
    try:
        for line in sys.stdin:
            command, *rest = json.loads(line)
            try:
                if command == "run":
                    spark_summaries(spark, Path(rest[0]), Path(rest[1]))
                    say("done")
                elif command == "types":
                    say("types", spark_types(spark, Path(rest[0]), Path(rest[1])))
                else:
                    break
            except Exception:  # the parent stops the run with the child's traceback
                say("error", traceback.format_exc())
    finally:
        spark.stop()


class SparkChild:
    """A Spark session in a process of its own: PySpark holds one session per process,
    and the rounds interleave the local and the cluster sessions with the other engines
    (the machine's load drifts; interleaving puts the drift on every engine alike)."""

    def __init__(self, master: str, log: Path) -> None:
        code = "import sys; from bench.fleet_scale import serve_spark; serve_spark(sys.argv[1])"
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, master], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, text=True, env=harness.child_env(),
            )  # fmt: skip
        self.log = log
        self.session_s = float(self._answer("ready")[0])

    def _answer(self, kind: str) -> list[Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                message = json.loads(line[len(MARK) :])
                if message[0] == "error":
                    raise RuntimeError(f"the Spark child failed: {message[1]}")
                if message[0] == kind:
                    return list(message[1:])
        tail = self.log.read_text()[-2000:]
        raise RuntimeError(f"the Spark child exited ({self.proc.wait()}): {tail}")

    def call(self, command: str, *args: str) -> list[Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([command, *args]) + "\n")
        self.proc.stdin.flush()
        return self._answer({"run": "done"}.get(command, command))

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps(["quit"]) + "\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


#: the Spark type each Parquet physical type of a collection should arrive as
NATURAL = {
    "int8": "tinyint", "int16": "smallint", "int32": "int", "int64": "bigint",
    "uint8": "smallint", "uint16": "int", "uint32": "bigint", "uint64": "bigint",
    "float": "float", "double": "double", "bool": "boolean", "string": "string",
    "large_string": "string",
}  # fmt: skip


def spark_types(spark: Any, root: Path, source: Path) -> dict[str, Any]:
    """Each table as Spark reads it (read_table) against the type its Parquet schema
    calls for: {table: {column: spark type}} of the columns that differ (none is right)."""
    import pyarrow.parquet as pq

    from kernmlops.fleet.spark_job import read_table

    wrong: dict[str, dict[str, str]] = {}
    checked = 0
    for part in sorted(source.glob("*/*.parquet")):
        table = part.parent.name
        schema = pq.read_schema(part)
        frame = read_table(spark, str(root), table)
        if frame is None:
            wrong[table] = {"*": "not read"}
            continue
        got = dict(frame.dtypes)
        for field in schema:
            want = NATURAL.get(str(field.type), str(field.type))
            checked += 1
            if got.get(field.name) != want:
                wrong.setdefault(table, {})[field.name] = f"{got.get(field.name)} (want {want})"
        for key in (BENCH, ID):
            checked += 1
            if got.get(key) != "string":
                wrong.setdefault(table, {})[key] = f"{got.get(key)} (want string)"
    return {"columns_checked": checked, "wrong": wrong}


# --- agreement ------------------------------------------------------------------------------
def compare(outs: dict[str, Path]) -> dict[str, Any]:
    """Every engine's summaries against the first's: the same rows by key, every column
    of the first present, numbers within REL_TOL of each other (integers equal), nulls
    alike, instants and text equal. {"agree", "max_rel_diff", "problems" (20 at most)}."""
    import numpy as np
    import polars as pl

    def read(path: Path, name: str) -> pl.DataFrame:
        # polars and DuckDB write one file, Spark a folder of parts
        where = path / f"{name}.parquet"
        frame = pl.read_parquet(where if where.exists() else path / name / "*.parquet")
        return frame.sort(KEYS[name])

    problems: list[str] = []
    worst = 0.0
    base_name, base_dir = next(iter(outs.items()))
    for name in OUTPUTS:
        base = read(base_dir, name)
        for engine, folder in list(outs.items())[1:]:
            other = read(folder, name)
            if other.height != base.height:
                problems.append(f"{name}: {engine} {other.height} rows, {base_name} {base.height}")
                continue
            for column in base.columns:
                if column not in other.columns:
                    problems.append(f"{name}: {engine} has no {column}")
                    continue
                a, b = base[column], other[column]
                where = f"{name}.{column}"
                if a.dtype.is_numeric() and b.dtype.is_numeric():
                    x, y = a.cast(pl.Float64).to_numpy(), b.cast(pl.Float64).to_numpy()
                    if (np.isnan(x) != np.isnan(y)).any():
                        problems.append(f"{where}: {engine}'s nulls differ")
                    both = ~(np.isnan(x) | np.isnan(y))
                    x, y = x[both], y[both]
                    scale = np.maximum(np.abs(x), np.abs(y))
                    rel = np.abs(x - y) / np.where(scale > 0, scale, 1.0)
                    diff = float(rel.max()) if len(rel) else 0.0
                    worst = max(worst, diff)
                    if diff > REL_TOL:
                        problems.append(f"{where}: {engine} differs by {diff:.3g} (relative)")
                elif isinstance(a.dtype, pl.Datetime) and isinstance(b.dtype, pl.Datetime):
                    if _instants(a) != _instants(b):
                        problems.append(f"{where}: {engine} differs")
                elif a.cast(pl.String).to_list() != b.cast(pl.String).to_list():
                    problems.append(f"{where}: {engine} differs")
    return {"agree": not problems, "max_rel_diff": worst, "problems": problems[:20]}


def _instants(series: Any) -> list[int | None]:
    """Microseconds since the epoch, UTC: Spark writes naive timestamps in its session's
    zone (UTC), polars and DuckDB keep the index's UTC zone."""
    import polars as pl

    if series.dtype.time_zone is not None:
        series = series.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
    return series.cast(pl.Datetime("us")).cast(pl.Int64).to_list()


# --- cost lines -----------------------------------------------------------------------------
def fit(sizes: list[int], seconds: list[float]) -> dict[str, float]:
    """t = fixed + N x per_collection through the sizes' medians, least squares on
    relative residuals (weights 1/t^2): the noise of a shared machine grows with the time,
    and plain least squares would be the largest size alone."""
    w = [1 / y**2 for y in seconds]
    sw, sx = sum(w), sum(wi * x for wi, x in zip(w, sizes, strict=True))
    sy = sum(wi * y for wi, y in zip(w, seconds, strict=True))
    sxx = sum(wi * x * x for wi, x in zip(w, sizes, strict=True))
    sxy = sum(wi * x * y for wi, x, y in zip(w, sizes, seconds, strict=True))
    det = sw * sxx - sx * sx
    b = (sw * sxy - sx * sy) / det if det else 0.0
    return {"fixed_s": (sy - b * sx) / sw, "per_collection_ms": b * 1e3}


def where_wrong(
    lines: dict[str, dict[str, float]], budgets: tuple[float, ...], summaries: list[str]
) -> dict[str, Any]:
    """From the fitted lines: the most collections each engine answers within each of
    ``budgets`` (s); for the engines that compute the summaries, the size above which
    one is cheaper than another (None: never) and each one's per-collection cost as a
    multiple of the cheapest's."""
    reach: dict[str, dict[str, int | None]] = {}
    for engine, line in lines.items():
        per = line["per_collection_ms"] / 1e3
        reach[engine] = {
            f"{budget:g}s": None
            if per <= 0
            else max(0, math.floor((budget - line["fixed_s"]) / per))
            for budget in budgets
        }
    cross: dict[str, int | None] = {}
    names = sorted(e for e in summaries if e in lines)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            la, lb = lines[a], lines[b]
            dper = (la["per_collection_ms"] - lb["per_collection_ms"]) / 1e3
            at = (lb["fixed_s"] - la["fixed_s"]) / dper if dper else None
            cross[f"{a} vs {b}"] = None if at is None or at <= 0 else round(at)
    cheapest = min((lines[e]["per_collection_ms"] for e in names), default=0.0)
    ratio = {
        e: round(lines[e]["per_collection_ms"] / cheapest, 1) if cheapest > 0 else None
        for e in names
    }
    return {"largest_within": reach, "crossover_n": cross, "per_collection_vs_cheapest": ratio}


def verdict(sizes: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The target at the largest size: ``fleet ls`` and the fastest engine's summaries."""
    n = max(sizes)
    medians = sizes[n]["median_s"]
    fastest = min((e for e in medians if e != "ls"), key=lambda e: medians[e])
    return {
        "collections": n,
        "ls_s": medians["ls"],
        "ls_met": medians["ls"] <= TARGET_LS_S,
        "fastest": fastest,
        "fastest_s": medians[fastest],
        "summaries_met": medians[fastest] <= TARGET_SUMMARIES_S,
        "agree": all(e["agreement"]["agree"] for e in sizes.values()),
    }


# --- start-up costs -------------------------------------------------------------------------
def import_seconds(module: str, rounds: int) -> float:
    """The median wall time of a new Python importing ``module`` minus one importing
    nothing: what each use of the engine from a new process pays first."""

    def once(code: str) -> float:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=harness.child_env(), check=True)
        return time.perf_counter() - t

    bare = sorted(once("pass") for _ in range(rounds))[rounds // 2]
    full = sorted(once(f"import {module}") for _ in range(rounds))[rounds // 2]
    return max(0.0, full - bare)


# --- main -----------------------------------------------------------------------------------
def _sizes(text: str) -> list[int]:
    return sorted({int(s) for s in text.split(",") if s.strip()})


def _seconds(text: str) -> tuple[float, ...]:
    return tuple(float(s) for s in text.split(",") if s.strip())


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__name__, __doc__, defaults_in_help=True)
    ap.add_argument("--source", type=Path, help="a collection folder (default: collect one)")
    ap.add_argument("--collect-s", type=float, default=3.0, help="seconds of the collection")
    ap.add_argument("--sizes", type=_sizes, default=[10, 100, 1000], help="collections")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per size")
    ap.add_argument(
        "--standalone-sizes", type=_sizes, default=[10, 100],
        help="sizes also run on a standalone cluster ('' for none)",
    )  # fmt: skip
    ap.add_argument(
        "--budgets", type=_seconds, default=(2.0, 10.0, 60.0),
        help="answer times (s): the most collections each engine answers within each",
    )  # fmt: skip
    ap.add_argument("--workdir", type=Path, help="where the dataset goes (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    ap.add_argument("--out", type=Path, default=harness.result_path("fleet-scale"))
    args = ap.parse_args(argv)
    if args.source is None and os.geteuid() != 0:
        ap.error("collecting the source collection needs root (BPF); or give --source")
    if args.source is not None and not (args.source / "manifest.json").is_file():
        ap.error(f"--source {args.source}: not a collection folder (no manifest.json)")
    if shutil.which("java") is None:
        ap.error("Spark needs Java 17 (make interop)")
    work = Path(tempfile.mkdtemp(prefix="kmo-fleet-scale-", dir=args.workdir))
    try:
        return _run(args, work)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _run(args: Any, work: Path) -> int:
    source = args.source or make_source(work, args.collect_s)
    copier = Copier(source, work / "dataset")
    source_bytes = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    rows = {rel.split("/")[0]: t.num_rows for rel, t in copier.parts.items()}
    print(f"source: {source_bytes / 1024:.0f} KiB, rows {rows}", file=sys.stderr)
    startup = {
        "polars_import_s": import_seconds("polars", 3),
        "duckdb_import_s": import_seconds("duckdb", 3),
    }
    measured = measure(args, copier, work, startup)
    sizes = measured["sizes"]
    ns = sorted(sizes)
    lines = {}
    for engine in ENGINES:
        have = [n for n in ns if engine in sizes[n]["median_s"]]
        if len(have) > 1:
            lines[engine] = fit(have, [sizes[n]["median_s"][engine] for n in have])
    result = {
        "settings": {
            "sizes": args.sizes, "rounds": args.rounds, "budgets_s": list(args.budgets),
            "standalone_sizes": args.standalone_sizes,
            "standalone": {"workers": 2, "cores_per_worker": 1},
            "source": "given" if args.source else f"collected ({args.collect_s:g} s)",
        },
        "source": {"bytes": source_bytes, "rows": rows, "files": len(copier.parts) + 1},
        "startup": {k: round(v, 3) for k, v in startup.items()},
        "first_use_s": measured["first_use_s"],
        "sizes": {str(k): v for k, v in sizes.items()},
        "spark_types": measured["spark_types"],
        "lines": {e: {k: round(v, 4) for k, v in line.items()} for e, line in lines.items()},
        "where_wrong": where_wrong(lines, args.budgets, SUMMARY_ENGINES),
        "target": verdict(sizes),
    }  # fmt: skip
    save(args.out, result)
    shown = ("startup", "lines", "where_wrong", "target")
    print(json.dumps({k: result[k] for k in shown}, indent=1))
    bad = [str(n) for n, e in sizes.items() if not e["agreement"]["agree"]]
    wrong = measured["spark_types"]["wrong"]
    if bad or wrong:
        print(f"FAILED: engines disagree at {bad}; wrong Spark types {wrong}", file=sys.stderr)
        return 1
    return 0


def measure(args: Any, copier: Copier, work: Path, startup: dict[str, float]) -> dict[str, Any]:
    """Grow the dataset through ``--sizes``; at each size every engine in interleaved
    rounds (the standalone cluster at ``--standalone-sizes`` only), then their outputs
    compared; Spark's types checked at the end."""
    import duckdb

    from kernmlops.fleet.local_cluster import standalone_cluster

    root = copier.root

    def outdir(engine: str) -> Path:
        return work / "out" / engine

    with contextlib.ExitStack() as stack:
        local = SparkChild("local[*]", work / "spark-local.log")
        stack.callback(local.close)
        startup["spark_local_session_s"] = local.session_s
        cluster = None
        if args.standalone_sizes:
            t = time.perf_counter()
            master = stack.enter_context(standalone_cluster(work / "cluster"))
            startup["spark_standalone_cluster_s"] = time.perf_counter() - t
            cluster = SparkChild(master, work / "spark-standalone.log")
            stack.callback(cluster.close)
            startup["spark_standalone_session_s"] = cluster.session_s
        con = stack.enter_context(duckdb.connect())
        tasks: dict[str, Callable[[set[str]], object]] = {
            "polars": lambda tables: polars_summaries(root, outdir("polars"), tables),
            "duckdb": lambda tables: duckdb_summaries(con, root, outdir("duckdb"), tables),
            "spark": lambda tables: local.call("run", str(root), str(outdir("spark"))),
            "ls": lambda tables: fleet_ls(root),
        }
        if cluster is not None:
            tasks["spark-standalone"] = lambda tables: cluster.call(
                "run", str(root), str(outdir("spark-standalone"))
            )
        sizes: dict[int, dict[str, Any]] = {}
        first: dict[str, float] = {}
        for size in args.sizes:
            copy_s = copier.grow(size)
            tables = present(root)
            engines = [e for e in tasks if e != "spark-standalone" or size in args.standalone_sizes]
            entry: dict[str, Any] = {
                "collections": size, "copy_s": round(copy_s, 2),
                "dataset_bytes": copier.bytes(), "tables": sorted(tables),
                "rounds": {e: [] for e in engines},
            }  # fmt: skip
            mib = entry["dataset_bytes"] / 2**20
            print(f"{size} collections ({mib:.1f} MiB, copied in {copy_s:.1f} s)", file=sys.stderr)
            # each engine's first use (imports, the JIT, caches) is not in the rounds
            for engine in (e for e in engines if e not in first):
                t = time.perf_counter()
                tasks[engine](tables)
                first[engine] = round(time.perf_counter() - t, 3)
            for _, order in harness.rotations(engines, args.rounds):
                for engine in order:
                    t = time.perf_counter()
                    tasks[engine](tables)
                    entry["rounds"][engine].append(round(time.perf_counter() - t, 4))
            entry["loadavg"] = _loadavg()
            summaries = [e for e in engines if e != "ls"]
            entry["agreement"] = compare({e: outdir(e) for e in summaries})
            entry["median_s"] = {
                e: round(harness.summarize(v).median, 4) for e, v in entry["rounds"].items()
            }
            agree = entry["agreement"]["agree"]
            print(f"  {json.dumps(entry['median_s'])} agree={agree}", file=sys.stderr)
            for problem in entry["agreement"]["problems"]:
                print(f"  {problem}", file=sys.stderr)
            sizes[size] = entry
        types = local.call("types", str(root), str(copier.source))[0]
    return {"sizes": sizes, "first_use_s": first, "spark_types": types}


def _loadavg() -> list[float]:
    """The 1-, 5- and 15-minute load averages: how busy the shared machine was."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []
