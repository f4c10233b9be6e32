"""The PySpark job over a dataset of published collections (``kernmlops spark-job``).

Reads the dataset's index, then every table of the published collections only (a
collection being pushed is not in the index yet), and writes three Parquet tables:

``collections``
    one row per collection: host, kernel, CPU, benchmark, start, duration; quanta and
    context switches per second (each quantum ends in a switch); page faults and faults
    per second: the exact count the hook kept in the manifest
    (``hooks.page_faults.counters.faults``), else (a collection made before it kept
    one) the rows, each standing for N faults where the hook kept 1 in N (the
    manifest's ``hooks.page_faults.sample_every``, in ``fault_sample_every``), and
    ``faults_estimated`` true where N > 1; block I/Os and
    their issue -> complete latency (mean, p50, p99, µs). Rates are per second of the
    benchmark's run (``benchmark_s``, from the manifest's benchmark start and stop),
    else of the collection (``duration_s``), else of its quanta's span (killed).
``quanta_by_comm``
    per collection and command name: quanta, run time (mean, p50, p99 µs), queued
    wake-ups and queue time (mean, p50, p99 µs). A thread's name is the last one
    ``process_trace`` saw for it; threads it never saw are ``pid <n>``.
``mllb``
    the MLLB data set of every ``lb collect`` collection (table ``lb_decisions``):
    MLLB's filter, then its 15 features and the label ``can_migrate``, computed by the
    same code as ``kernmlops lb train`` (kernmlops.lb), so the rows train the same model.

Percentiles are Spark's ``percentile_approx`` (the smallest value with at least p of
the values at or below it; exact below 10,000 values per group). Columns keep their
natural types: 64-bit unsigned columns (kernel addresses), which Spark would read as
``decimal(20,0)``, become ``bigint`` with the same bits, as Java holds them.

Only the collections in the dataset's index are read (their folders, named by the index):
a push under way, or a collection ``kernmlops fleet reindex`` found damaged, has no row.
Timestamps are written as UTC instants (Parquet ``TIMESTAMP_MICROS``, UTC-adjusted), the
type of the index's. A failure Spark reports (a damaged file, a path not there, an output
that cannot be written) is a :class:`JobError`, one line naming the file and what to do;
the tables written before it are kept, those after it are not left from an earlier run.

Run it with ``kernmlops spark-job DATASET OUT --master spark://host:7077``, or submit
this file: ``spark-submit --master spark://host:7077 $(python -m kernmlops.fleet.spark_job
--path) DATASET OUT`` (the executors need kernmlops installed for the MLLB features).
DATASET is a path Spark opens: a folder, ``file://``, ``hdfs://``, or ``s3a://`` with
the hadoop-aws package on Spark's class path.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from kernmlops.errors import KernmlopsError
from kernmlops.fleet.index import INDEX_DIR
from kernmlops.tables import BENCHMARK, COLLECTION_ID

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["OUTPUTS", "JobError", "natural_types", "read_table", "run", "session", "start"]

#: the job's output tables (sub-folders of OUT)
OUTPUTS = ("collections", "quanta_by_comm", "mllb")
_KEYS = [COLLECTION_ID, BENCHMARK]


#: Parquet's UTC-adjusted timestamps: Spark's default, INT96, reads back without a zone
_TIMESTAMPS = ("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")


#: the master URLs spark-submit takes (its SparkSubmit and SparkContext)
_MASTER = re.compile(
    r"local(\[(\*|[1-9]\d*)(\s*,\s*\d+)?\])?|local-cluster\[[^]]+\]|yarn"
    r"|(spark|k8s|mesos)://\S+"
)


class JobError(KernmlopsError):
    """The job could not run to its end: why, in one line, and what to do."""


def session(master: str | None = None, app: str = "kernmlops-fleet", **conf: str) -> SparkSession:
    """A Spark session whose partition values stay strings (a benchmark named ``123``
    is not an integer) and whose timestamps are UTC, read and written; ``conf``: more
    settings. Spark's own log shows fatal errors only: the job's failures are its
    :class:`JobError`."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    # the progress bar is for a terminal: in a log it is a line of stages per job
    conf.setdefault("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = (
        builder.config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config(*_TIMESTAMPS)
        .config("spark.ui.enabled", "false")
        # parquet-mr checks no page checksum unless told: a byte damaged inside a page
        # (the footer whole) would be read as wrong values, or as a decoding error
        .config("spark.hadoop.parquet.page.verify-checksum.enabled", "true")
        .getOrCreate()
    )
    # a failed task's stack, logged as it fails (on the driver in local mode), would
    # come before the job's one line saying what failed
    spark.sparkContext.setLogLevel("FATAL")
    return spark


def start(master: str | None = None, **conf: str) -> SparkSession:
    """:func:`session`, or a JobError saying why Spark did not start (a master URL it
    cannot parse or reach, no Java).

    Raises:
        JobError: Spark did not start.
    """
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    if master is not None and not _MASTER.fullmatch(master):
        # spark-submit would print its own stack and exit before Spark says anything
        raise JobError(
            f"--master {master}: not a Spark master URL (local, local[N], local[*], "
            "spark://HOST:PORT, yarn, k8s://https://HOST:PORT)"
        )
    try:
        return session(master, **conf)
    except (Py4JError, PySparkException) as err:
        where = f" (--master {master})" if master else ""
        raise JobError(f"Spark did not start{where}: {_summary(err)}") from None


def natural_types(frame: DataFrame) -> DataFrame:
    """``frame`` with every ``decimal(20,0)`` column (Parquet's unsigned 64-bit) as
    ``bigint`` holding the same 64 bits (values above 2^63 - 1 become negative, as in
    Java and in DuckDB's BIGINT cast of the bits)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DecimalType

    two63 = F.lit(str(2**63)).cast("decimal(20,0)")
    two64 = F.lit(str(2**64)).cast("decimal(20,0)")
    for field in frame.schema.fields:
        if isinstance(field.dataType, DecimalType) and (
            field.dataType.precision,
            field.dataType.scale,
        ) == (20, 0):
            col = F.col(field.name)
            frame = frame.withColumn(
                field.name,
                F.when(col >= two63, col - two64).otherwise(col).cast("bigint"),
            )
    return frame


def read_table(
    spark: SparkSession, root: str, table: str, collections: Iterable[str] | None = None
) -> DataFrame | None:
    """Table ``table`` of the collections under ``root``, with the ``benchmark`` and
    ``collection_id`` columns of its folders and natural types; None where no collection
    has it. Schemas of different kernmlops versions are merged.

    Args:
        collections: the collections' folders under ``root``
            (``benchmark=<b>/collection_id=<id>``), each of which has the table; None:
            every folder there (whether published or not).
    """
    from pyspark.errors import AnalysisException

    if collections is None:
        paths = [f"{root}/{BENCHMARK}=*/{COLLECTION_ID}=*/{table}"]
    else:
        paths = [f"{root}/{folder}/{table}" for folder in collections]
        if not paths:
            return None
    try:
        frame = spark.read.option("basePath", root).option("mergeSchema", "true").parquet(*paths)
    except AnalysisException as err:  # no such files: the table is in no collection
        cause = str(err)
        if collections is None and ("PATH_NOT_FOUND" in cause or "UNABLE_TO_INFER_SCHEMA" in cause):
            return None
        raise  # a folder the index names is not there
    return natural_types(frame)


def _folders(index: DataFrame) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(table -> the folders of the indexed collections that have it (their index rows'
    ``rows``: the tables whose parts were published), folder -> its collection_id)."""
    by_table: dict[str, list[str]] = {}
    ids: dict[str, str] = {}
    for row in index.select(COLLECTION_ID, BENCHMARK, "path", "rows").collect():
        folder = row["path"] or f"{BENCHMARK}={row[BENCHMARK]}/{COLLECTION_ID}={row[COLLECTION_ID]}"
        ids[folder] = row[COLLECTION_ID]
        for name in sorted(row["rows"] or {}):
            by_table.setdefault(name, []).append(folder)
    return by_table, ids


#: what the summary takes from each manifest: the page_faults hook's sampling (1 fault
#: in N kept as a row) and exact count, and the benchmark's start and stop
#: (CLOCK_MONOTONIC µs)
_FACTS = {
    "every": "$.config.hooks.page_faults.sample_every",
    "counted": "$.hooks.page_faults.counters.faults",
    "started": "$.benchmark.started_uptime_us",
    "stopped": "$.benchmark.stopped_uptime_us",
}


def manifest_facts(spark: SparkSession, root: str, ids: dict[str, str]) -> DataFrame | None:
    """(collection_id, fault_sample_every, faults_counted, benchmark_s) of the indexed
    collections (``ids``: folder -> collection_id) whose manifest says any of: page_faults
    kept 1 fault in N > 1 (``hooks.page_faults.sample_every``), how many faults it
    counted in the kernel (``hooks.page_faults.counters.faults``), or how long the
    benchmark ran (``benchmark.started_uptime_us`` to ``stopped_uptime_us``); None when
    none does. Only these values of each manifest reach the driver."""
    from pyspark.sql import functions as F

    if not ids:
        return None
    paths = [f"{root}/{folder}/manifest.json" for folder in ids]
    found = (
        spark.read.text(paths, wholetext=True)
        .select(
            F.input_file_name().alias("file"),
            *(F.get_json_object("value", at).cast("bigint").alias(k) for k, at in _FACTS.items()),
        )
        .where("every > 1 or counted is not null or (started is not null and stopped > started)")
        .collect()
    )
    # Spark names a file by its URI (file:, percent-encoded): matched by its folder's tail
    tails = {f"/{folder}/manifest.json": folder for folder in ids}
    rows = []
    for row in found:
        path = unquote(urlsplit(row["file"]).path)
        folder = next((f for tail, f in tails.items() if path.endswith(tail)), None)
        if folder is None:
            continue
        every = row["every"] if row["every"] and row["every"] > 1 else None
        ran = row["started"] is not None and row["stopped"] and row["stopped"] > row["started"]
        seconds = (row["stopped"] - row["started"]) / 1e6 if ran else None
        rows.append((ids[folder], every, row["counted"], seconds))
    if not rows:
        return None
    schema = (
        f"{COLLECTION_ID} string, fault_sample_every bigint, faults_counted bigint, "
        "benchmark_s double"
    )
    return spark.createDataFrame(rows, schema)


def _pcts(column: str, prefix: str) -> list[Any]:
    from pyspark.sql import functions as F

    return [
        F.mean(column).alias(f"{prefix}_mean_us"),
        F.percentile_approx(column, 0.5, 10_000).alias(f"{prefix}_p50_us"),
        F.percentile_approx(column, 0.99, 10_000).alias(f"{prefix}_p99_us"),
    ]


def quanta_by_comm(
    quanta: DataFrame | None, queued: DataFrame | None, trace: DataFrame | None
) -> DataFrame | None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if quanta is None:
        return None
    names = None
    if trace is not None and "comm" in trace.columns:
        last = Window.partitionBy(COLLECTION_ID, "pid").orderBy(F.col("ts_uptime_us").desc())
        names = (
            trace.where(F.col("comm").isNotNull())
            .withColumn("_n", F.row_number().over(last))
            .where("_n = 1")
            .select(COLLECTION_ID, "pid", "comm")
        )

    def named(frame: DataFrame) -> DataFrame:
        if names is not None:
            frame = frame.join(names, on=[COLLECTION_ID, "pid"], how="left")
        else:
            frame = frame.withColumn("comm", F.lit(None).cast("string"))
        return frame.withColumn(
            "comm", F.coalesce("comm", F.concat(F.lit("pid "), F.col("pid").cast("string")))
        )

    runs = (
        named(quanta)
        .groupBy(*_KEYS, "comm")
        .agg(F.count("*").alias("quanta"), *_pcts("quanta_run_length_us", "runtime"))
    )
    if queued is None:
        return runs
    waits = (
        named(queued)
        .groupBy(*_KEYS, "comm")
        .agg(F.count("*").alias("queued"), *_pcts("quanta_queued_time_us", "queue"))
    )
    return runs.join(waits, on=[*_KEYS, "comm"], how="full_outer")


def collections_summary(
    index: DataFrame,
    quanta: DataFrame | None,
    faults: DataFrame | None,
    block_io: DataFrame | None,
    facts: DataFrame | None = None,
) -> DataFrame:
    """One row per indexed collection. ``facts``: (collection_id, fault_sample_every,
    faults_counted, benchmark_s) from the manifests (:func:`manifest_facts`): the faults
    are the hook's exact count where the manifest has it, else its rows, a row of a
    collection that kept 1 fault in N counting N (``faults_estimated``); rates are per
    second of the benchmark's run where the manifest says how long it ran."""
    from pyspark.sql import functions as F

    out = index.select(
        COLLECTION_ID, BENCHMARK, "host", "kernel", "cpu_model", "logical_cpus", "started_at",
        "state", "duration_s",
    )  # fmt: skip
    if facts is not None:
        out = out.join(facts, on=COLLECTION_ID, how="left")
    else:
        for name, kind in (
            ("fault_sample_every", "bigint"), ("faults_counted", "bigint"),
            ("benchmark_s", "double"),
        ):  # fmt: skip
            out = out.withColumn(name, F.lit(None).cast(kind))
    if quanta is not None:
        per = quanta.groupBy(COLLECTION_ID).agg(
            F.count("*").alias("quanta"),
            ((F.max("ts_uptime_us") - F.min("ts_uptime_us")) / 1e6).alias("_span_s"),
        )
        out = out.join(per, on=COLLECTION_ID, how="left")
    else:
        out = out.withColumn("quanta", F.lit(None).cast("bigint")).withColumn(
            "_span_s", F.lit(None).cast("double")
        )
    # the benchmark's run (what the tables of a benchmark's processes span: the
    # collection's own start and last flush around it are not), else the collection's
    # duration (faux: no benchmark process), else (killed) the span of its quanta
    seconds = F.coalesce("benchmark_s", "duration_s", "_span_s")
    out = out.withColumn("switches_per_s", F.col("quanta") / seconds)
    if faults is not None:
        per = faults.groupBy(COLLECTION_ID).agg(F.count("*").alias("_fault_rows"))
        out = out.join(per, on=COLLECTION_ID, how="left")
    else:
        out = out.withColumn("_fault_rows", F.lit(None).cast("bigint"))
    seen = F.col("_fault_rows").isNotNull() | F.col("faults_counted").isNotNull()
    every = F.when(seen, F.coalesce("fault_sample_every", F.lit(1)))
    out = out.withColumn("fault_sample_every", every)
    # the kernel's count of every fault, else a row is one fault, or N where 1 in N kept
    out = out.withColumn(
        "faults", F.coalesce("faults_counted", F.col("_fault_rows") * F.col("fault_sample_every"))
    ).withColumn(
        "faults_estimated",
        F.when(seen, F.col("faults_counted").isNull() & (F.col("fault_sample_every") > 1)),
    )
    out = out.withColumn("faults_per_s", F.col("faults") / seconds)
    if block_io is not None:
        per = block_io.groupBy(COLLECTION_ID).agg(
            F.count("*").alias("block_ios"), *_pcts("issue_to_complete_us", "block_io")
        )
        out = out.join(per, on=COLLECTION_ID, how="left")
    else:
        empty = {"block_ios": "bigint", "block_io_mean_us": "double",
                 "block_io_p50_us": "bigint", "block_io_p99_us": "bigint"}  # fmt: skip
        for name, kind in empty.items():
            out = out.withColumn(name, F.lit(None).cast(kind))
    return out.drop("_span_s", "_fault_rows", "faults_counted").orderBy("started_at", COLLECTION_ID)


def _mllb_schema() -> Any:
    from pyspark.sql.types import ByteType, DoubleType, StringType, StructField, StructType

    from kernmlops.lb.names import FEATURES

    return StructType(
        [
            StructField(COLLECTION_ID, StringType()),
            StructField(BENCHMARK, StringType()),
            StructField("variant", StringType()),
            *[StructField(name, DoubleType()) for name in FEATURES],
            StructField("can_migrate", ByteType()),
        ]
    )


def mllb_features(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Decisions -> MLLB's filter and features, with kernmlops.lb's own code (on the
    executors: each Arrow batch of ``lb_decisions`` rows at once)."""
    import polars as pl
    import pyarrow as pa

    from kernmlops.lb.features import LABEL, conform, float_features
    from kernmlops.lb.names import FEATURES
    from kernmlops.lb.pipeline import prepare

    for batch in batches:
        frame = pl.from_arrow(pa.Table.from_batches([batch]))
        assert isinstance(frame, pl.DataFrame)
        kept = prepare(conform(frame))
        x = float_features(kept)
        columns = {
            COLLECTION_ID: kept[COLLECTION_ID].cast(pl.String).to_arrow(),
            BENCHMARK: kept[BENCHMARK].cast(pl.String).to_arrow(),
            "variant": kept["variant"].cast(pl.String).to_arrow(),
            **{name: pa.array(x[:, i], pa.float64()) for i, name in enumerate(FEATURES)},
            "can_migrate": kept[LABEL].cast(pl.Int8).to_arrow(),
        }
        yield pa.RecordBatch.from_pydict(columns)


def mllb(decisions: DataFrame | None) -> DataFrame | None:
    if decisions is None:
        return None
    return decisions.mapInArrow(mllb_features, _mllb_schema())


def run(spark: SparkSession, dataset: str, out: str) -> dict[str, int]:
    """Compute the job's tables over ``dataset`` and write them under ``out`` (Parquet,
    replacing earlier results); rows per table written (absent tables: no input, and
    an earlier run's folder of that table removed from ``out``).

    Raises:
        FileNotFoundError: ``dataset`` has no index (nothing published there).
        JobError: Spark could not read the dataset (a damaged file, a folder the index
            names that is not there) or write ``out``: the file and what to do. Nothing
            is written when reading fails (the tables' schemas are read first); when a
            write fails, the tables written before it are kept and the others' folders
            removed from ``out`` (an earlier run's, or half written).
    """
    from py4j.protocol import Py4JError
    from pyspark.errors import AnalysisException, PySparkException
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    root = dataset.rstrip("/")
    out = out.rstrip("/")
    try:
        index = spark.read.parquet(f"{root}/{INDEX_DIR}").cache()
    except AnalysisException as err:
        if "PATH_NOT_FOUND" not in str(err) and "UNABLE_TO_INFER_SCHEMA" not in str(err):
            raise JobError(_explain(err, root, f"reading {root}")) from None
        raise FileNotFoundError(
            f"{root}: no {INDEX_DIR}/ (is it a dataset that kernmlops push wrote?)"
        ) from None
    except (Py4JError, PySparkException) as err:
        raise JobError(_explain(err, root, f"reading {root}")) from None

    # the cache must go with this run: Spark matches a later read of the same folder to
    # it, and a second run in the session would see only the collections of the first
    written: dict[str, int] = {}
    doing = f"reading {root}"
    before = spark.conf.get(_TIMESTAMPS[0], None)
    try:
        spark.conf.set(*_TIMESTAMPS)
        # the indexed collections only: a push under way has parts and no row, and a
        # collection reindex found damaged no row either
        folders, ids = _folders(index)
        read: dict[str, DataFrame | None] = {}

        def table(name: str) -> DataFrame | None:
            # each table is read (its schema inferred, a Spark job) once
            if name not in read:
                read[name] = read_table(spark, root, name, folders.get(name, []))
            return read[name]

        results = {
            "collections": collections_summary(
                index,
                table("quanta_runtime"),
                table("page_faults"),
                table("block_io"),
                manifest_facts(spark, root, ids),
            ),
            "quanta_by_comm": quanta_by_comm(
                table("quanta_runtime"), table("quanta_queued_time"), table("process_trace")
            ),
            "mllb": mllb(table("lb_decisions")),
        }
        for name, frame in results.items():
            if frame is None:
                # no input this run: an earlier run's table left in OUT would read as this
                # run's beside this run's others
                _remove(spark, f"{out}/{name}")
                continue
            target = f"{out}/{name}"
            doing = f"writing {target}"
            # The rows counted as the write passes them (an observed metric, merged once
            # per committed task): exact, with no job that reads the output back.
            rows = Observation(f"kmo-{name}")
            frame.observe(rows, F.count(F.lit(1)).alias("rows")).write.mode("overwrite").parquet(
                target
            )
            written[name] = int(rows.get["rows"])
    except (Py4JError, PySparkException) as err:
        line = _explain(err, root, doing)
        if doing.startswith("writing"):
            # the table half replaced, and those after it an earlier run's: gone, so that
            # OUT holds this run's tables only
            rest = [name for name in OUTPUTS if name not in written]
            removed = [name for name in rest if _remove(spark, f"{out}/{name}")]
            done = ", ".join(f"{out}/{name}" for name in written) or "nothing"
            line += f" (written: {done}; not written: {', '.join(rest)}"
            line += f", their folders removed: {', '.join(removed)})" if removed else ")"
        else:
            line += f" (nothing written to {out})"
        raise JobError(line) from None
    finally:
        index.unpersist()
        if before is None:
            spark.conf.unset(_TIMESTAMPS[0])
        else:
            spark.conf.set(_TIMESTAMPS[0], before)
    return written


def _remove(spark: SparkSession, path: str) -> bool:
    """Remove ``path`` (a folder Spark writes), through Spark's own filesystem; True if
    it was there. False where it cannot be (a Spark Connect session has no JVM here)."""
    try:
        jvm = spark.sparkContext._jvm
        target = jvm.org.apache.hadoop.fs.Path(path)
        fs = target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        return bool(fs.delete(target, True))
    except Exception:  # best effort: the error being reported is the job's
        return False


def _java_chain(err: BaseException) -> list[Any]:
    """The Java exceptions behind ``err``, outermost first (its causes)."""
    java = getattr(err, "java_exception", None) or getattr(err, "_origin", None)
    chain: list[Any] = []
    while java is not None and len(chain) < 32:
        chain.append(java)
        try:
            java = java.getCause()
        except Exception:
            break
    return chain


def _call(java: Any, *methods: str) -> Any:
    """The first of ``methods`` that ``java`` has, called; None if none."""
    for method in methods:
        try:
            return getattr(java, method)()
        except Exception:
            continue
    return None


def _classes(java: Any) -> set[str]:
    """The names of ``java``'s class and those above it."""
    names = set()
    cls = _call(java, "getClass")
    while cls is not None and len(names) < 16:
        names.add(str(cls.getName()))
        cls = cls.getSuperclass()
    return names


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0].strip()[:300] if lines else ""


def _summary(err: BaseException) -> str:
    """What went wrong, in one line: the innermost Java message that says something, a
    Python worker's last line, or the error's own first line."""
    if type(err).__name__ == "PythonException":
        lines = [line for line in str(err).splitlines() if line.strip()]
        return lines[-1].strip() if lines else "a Python worker failed"
    for java in reversed(_java_chain(err)):
        text = _first_line(_call(java, "getMessage"))
        if text and not text.startswith("["):  # Spark's own name their condition
            cls = _call(java, "getClass")
            name = str(cls.getSimpleName()) if cls is not None else ""
            text = f"{name}: {text}" if name and not text.startswith(name) else text
        if text:
            return text
    text = _first_line(str(err))
    return text or type(err).__name__


def _local(path: str) -> str:
    """A ``file:`` URI as the local path it names; any other path as it is."""
    return unquote(urlsplit(path).path) if path.startswith("file:") else path


def _fleet_uri(root: str) -> str:
    """The dataset's URI as ``kernmlops fleet`` opens it (pyarrow: s3://, not s3a://)."""
    return re.sub(r"^s3[an]://", "s3://", root)


_COLLECTION = re.compile(rf"^(.*/{BENCHMARK}=[^/]+/{COLLECTION_ID}=([^/]+))/")
#: parquet-mr's words for a page whose CRC does not match (ParquetDecodingException)
_CRC_FAILED = "CRC checksum verification failed"
_READ_FILE = re.compile(r"Encountered error while reading file (\S+?)\.(\s|$)")


def _explain(err: BaseException, root: str, doing: str) -> str:
    """One line for a Spark failure while ``doing`` ("reading DATASET", "writing OUT/t"):
    the file and what to do where it is known, else Spark's reason."""
    chain = _java_chain(err)
    reindex = f"`kernmlops fleet reindex {shlex.quote(_fleet_uri(root))}`"
    for java in chain:
        condition = str(_call(java, "getCondition", "getErrorClass") or "")
        params = dict(_call(java, "getMessageParameters") or {})
        message = str(_call(java, "getMessage") or "")
        found = _READ_FILE.search(message)
        path = params.get("path") or (found.group(1) if found else "")
        if condition.startswith("FAILED_READ_FILE") or (found and not condition):
            return _damaged(_local(path), condition, chain, reindex)
        if condition == "PATH_NOT_FOUND" and path:
            return (
                f"{_local(path)}: not there, though the index names its collection (deleted "
                f"since it was published?): {reindex} rebuilds the index from what is there"
            )
        if "org.apache.hadoop.fs.UnsupportedFileSystemException" in _classes(java) or (
            "S3AFileSystem not found" in message
        ):
            where = doing.split(" ", 1)[1]
            scheme = where.split("://", 1)[0] if "://" in where else "?"
            return (
                f"{where}: Spark has no filesystem for {scheme}:// here (for S3: s3a:// "
                "with the hadoop-aws package on Spark's class path)"
            )
    if doing.startswith("writing") and any("java.io.IOException" in _classes(j) for j in chain):
        return f"cannot write {doing.split(' ', 1)[1]}: {_summary(err)}"
    return f"the job failed {doing}: {_summary(err)}"


def _damaged(path: str, condition: str, chain: list[Any], reindex: str) -> str:
    """The line for a dataset file Spark cannot read."""
    kind = condition.partition(".")[2]
    if kind == "FILE_NOT_EXIST":
        return f"{path}: not there (deleted while the job ran?): {reindex} rebuilds the index"
    inner = [_first_line(_call(j, "getMessage")) for j in chain[1:]]
    detail = next((t.replace(f"file:{path}", "it").replace(path, "it") for t in inner if t), "")
    why = {
        "CANNOT_READ_FILE_FOOTER": "its footer cannot be read",
    }.get(kind) or (detail[:200] if detail else "its data cannot be read")
    if any(_CRC_FAILED in t for t in inner):
        why = "a page fails its checksum"
    if kind != "CANNOT_READ_FILE_FOOTER":
        # damage inside a page: only a reindex that reads every page sees it
        reindex = reindex.replace("fleet reindex ", "fleet reindex --pages ", 1)
    if f"/{INDEX_DIR}/" in path:
        return f"{path}: not a readable index file ({why}): {reindex} rewrites the index"
    collection = _COLLECTION.match(path)
    if collection is None:
        return f"{path}: Spark cannot read it ({why})"
    return (
        f"{path}: not a readable Parquet file ({why}): collection {unquote(collection[2])} "
        f"is damaged: push it again from its source, or {reindex} takes it out of the "
        "index (the job then skips it)"
    )


def main(argv: list[str] | None = None) -> int:
    """The spark-submit entry point: ``spark_job.py DATASET OUT``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", action="store_true", help="print this file's path and exit")
    parser.add_argument("dataset", nargs="?")
    parser.add_argument("out", nargs="?")
    parser.add_argument("--master", help="spark://host:port (default: spark-submit's)")
    args = parser.parse_args(argv)
    if args.path:
        print(__file__)
        return 0
    if not args.dataset or not args.out:
        parser.error("DATASET and OUT are required")
    try:
        spark = start(args.master)
    except JobError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    try:
        written = run(spark, args.dataset, args.out)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except JobError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    finally:
        spark.stop()
    for name in OUTPUTS:
        n = written.get(name)
        done = f"{n:,} rows -> {args.out.rstrip('/')}/{name}" if n is not None else "no input"
        print(f"{name}: {done}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
