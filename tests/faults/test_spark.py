"""Spark reads a collection whose collector was SIGKILLed, as a fleet reads it: the
Hive folder from its root, one table across collections. Finished parts only: the
temporary part of the open interval and a compaction's hidden folder are skipped.
Spark is the test run's standalone cluster (``spark``, tests/spark.py)."""

from __future__ import annotations

import importlib.util
import shutil
import signal
import warnings
from pathlib import Path

import pytest

from kernmlops.data import read_collection
from tests.conftest import REQUIRE_BPF, needs_tools
from tests.faults.conftest import (
    kill_collector,
    parquet_rows,
    read_everything,
    start_collect,
    wait_until,
)
from tests.faults.test_kill import STORM

#: how long the storm's rows may take to reach finished parts (less than its 60 s)
PARTS_WAIT_S = 45.0

pytestmark = [
    pytest.mark.bpf,
    needs_tools("java"),
    pytest.mark.skipif(
        importlib.util.find_spec("pyspark") is None and not REQUIRE_BPF,
        reason="pyspark is not installed (make test installs it)",
    ),
]


def test_spark_reads_a_killed_collection(tmp_path: Path, bpf_baseline, spark) -> None:
    # Rows made as it runs whatever CPU is spare (a storm beside Spark's JVMs may leave
    # none, and every row would wait in the spool): the kill leaves finished parts.
    run = start_collect(tmp_path / "out", *STORM, more_config="  spool_spare_cpus: 0\n")
    run.wait_for("probes attached")
    collection = run.collection()  # its manifest is written before the probes attach

    def flushed() -> bool:
        # parts of the storm's rows, finished by the flushes (one a second); the
        # collector's end (its benchmark's 60 s) would end the wait too
        ended = run.proc.poll() is not None
        return ended or parquet_rows(collection).get("quanta_runtime", 0) > 1000

    # Killed once flushes have finished parts of the storm's rows, however long that
    # takes: the first flush waits for the decoding libraries' import, and a loaded
    # machine once had no part 2.3 s after the probes attached.
    wait_until(flushed, PARTS_WAIT_S, 0.1)
    kill_collector(run)
    assert run.proc.returncode == -signal.SIGKILL, run.stderr_lines
    # What a kill may also leave: a part cut mid-write (no footer), and a compaction
    # cut short after its swap (the old parts in a hidden folder).
    first = collection / "quanta_runtime" / "part-00000.parquet"
    assert first.exists(), f"no finished part in {PARTS_WAIT_S} s: {run.stderr_lines}"
    cut = first.with_name(".part-00099.parquet.tmp")
    cut.write_bytes(first.read_bytes()[: first.stat().st_size // 2])
    shutil.copytree(collection / "quanta_runtime", collection / ".compact-quanta_runtime")
    rows = read_everything(collection)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        col = read_collection(collection)
    root = tmp_path / "out" / "curated"
    for table, n in rows.items():
        frame = (
            spark.read.option("basePath", str(root))
            .parquet(f"{root}/benchmark=*/collection_id=*/{table}")
            .where(f"collection_id = '{col.collection_id}'")
        )
        assert frame.count() == n, table
    quanta = spark.read.option("basePath", str(root)).parquet(
        f"{root}/benchmark=*/collection_id=*/quanta_runtime"
    )
    # The partition columns come from the folder names.
    [row] = quanta.groupBy("benchmark", "collection_id").count().collect()
    assert (row["benchmark"], row["collection_id"], row["count"]) == (
        "command",
        col.collection_id,
        rows["quanta_runtime"],
    )
    assert rows["quanta_runtime"] > 1000
