"""The PySpark job over a dataset of published collections (``kernmlops spark-job``).

Reads the dataset's index, then every table of the published collections only (a
collection being pushed is not in the index yet), and writes three Parquet tables:

``collections``
    one row per collection: host, kernel, CPU, benchmark, start, duration; quanta and
    context switches per second (each quantum ends in a switch); page faults and faults
    per second; block I/Os and their issue -> complete latency (mean, p50, p99, µs).
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

Run it with ``kernmlops spark-job DATASET OUT --master spark://host:7077``, or submit
this file: ``spark-submit --master spark://host:7077 $(python -m kernmlops.fleet.spark_job
--path) DATASET OUT`` (the executors need kernmlops installed for the MLLB features).
DATASET is a path Spark opens: a folder, ``file://``, ``hdfs://``, or ``s3a://`` with
the hadoop-aws package on Spark's class path.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from kernmlops.fleet.index import INDEX_DIR
from kernmlops.tables import BENCHMARK, COLLECTION_ID

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["OUTPUTS", "natural_types", "read_table", "run", "session"]

#: the job's output tables (sub-folders of OUT)
OUTPUTS = ("collections", "quanta_by_comm", "mllb")
_KEYS = [COLLECTION_ID, BENCHMARK]


def session(master: str | None = None, app: str = "kernmlops-fleet", **conf: str) -> SparkSession:
    """A Spark session whose partition values stay strings (a benchmark named ``123``
    is not an integer) and whose timestamps are UTC; ``conf``: more settings."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = (
        builder.config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


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


def read_table(spark: SparkSession, root: str, table: str) -> DataFrame | None:
    """Table ``table`` of every collection under ``root``, with the ``benchmark`` and
    ``collection_id`` columns of its folders and natural types; None where no collection
    has it. Schemas of different kernmlops versions are merged."""
    from pyspark.errors import AnalysisException

    try:
        frame = (
            spark.read.option("basePath", root)
            .option("mergeSchema", "true")
            .parquet(f"{root}/{BENCHMARK}=*/{COLLECTION_ID}=*/{table}")
        )
    except AnalysisException as err:  # no such files: the table is in no collection
        if "PATH_NOT_FOUND" in str(err) or "UNABLE_TO_INFER_SCHEMA" in str(err):
            return None
        raise
    return natural_types(frame)


def _published(frame: DataFrame | None, index: DataFrame) -> DataFrame | None:
    """Rows of published collections only (a push under way has parts, no index row)."""
    if frame is None:
        return None
    ids = index.select(COLLECTION_ID)
    # the table's own collection_id column and the folder's are one value
    return frame.join(ids, on=COLLECTION_ID, how="left_semi")


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
) -> DataFrame:
    from pyspark.sql import functions as F

    out = index.select(
        COLLECTION_ID, BENCHMARK, "host", "kernel", "cpu_model", "logical_cpus", "started_at",
        "state", "duration_s",
    )  # fmt: skip
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
    # the collection's duration; a collection without one (killed) spans its quanta
    seconds = F.coalesce("duration_s", "_span_s")
    out = out.withColumn("switches_per_s", F.col("quanta") / seconds)
    if faults is not None:
        per = faults.groupBy(COLLECTION_ID).agg(F.count("*").alias("faults"))
        out = out.join(per, on=COLLECTION_ID, how="left")
    else:
        out = out.withColumn("faults", F.lit(None).cast("bigint"))
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
    return out.drop("_span_s").orderBy("started_at", COLLECTION_ID)


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
    replacing earlier results); rows per table written (absent tables: no input).

    Raises:
        FileNotFoundError: ``dataset`` has no index (nothing published there).
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    root = dataset.rstrip("/")
    try:
        index = spark.read.parquet(f"{root}/{INDEX_DIR}").cache()
    except AnalysisException:
        raise FileNotFoundError(
            f"{root}: no {INDEX_DIR}/ (is it a dataset that kernmlops push wrote?)"
        ) from None

    # the cache must go with this run: Spark matches a later read of the same folder to
    # it, and a second run in the session would see only the collections of the first
    try:
        read: dict[str, DataFrame | None] = {}

        def table(name: str) -> DataFrame | None:
            # each table is read (its schema inferred, a Spark job) once
            if name not in read:
                read[name] = _published(read_table(spark, root, name), index)
            return read[name]

        results = {
            "collections": collections_summary(
                index, table("quanta_runtime"), table("page_faults"), table("block_io")
            ),
            "quanta_by_comm": quanta_by_comm(
                table("quanta_runtime"), table("quanta_queued_time"), table("process_trace")
            ),
            "mllb": mllb(table("lb_decisions")),
        }
        written = {}
        for name, frame in results.items():
            if frame is None:
                continue
            target = f"{out.rstrip('/')}/{name}"
            # The rows counted as the write passes them (an observed metric, merged once
            # per committed task): exact, with no job that reads the output back.
            rows = Observation(f"kmo-{name}")
            frame.observe(rows, F.count(F.lit(1)).alias("rows")).write.mode("overwrite").parquet(
                target
            )
            written[name] = int(rows.get["rows"])
    finally:
        index.unpersist()
    return written


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
    spark = session(args.master)
    try:
        written = run(spark, args.dataset, args.out)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    for name, n in written.items():
        print(f"{name}: {n:,} rows -> {args.out.rstrip('/')}/{name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
