"""One Spark for the whole test run (the ``spark`` fixture of tests/conftest.py): a real
standalone cluster on this machine, spark://127.0.0.1:<port>, a master and a worker of
two cores, and a session on it: one executor, whose two tasks at a time each run in a
Python worker of their own. Its JVMs take most of a Spark test's time, so the tests
that use Spark (the fleet's job, the faults' killed collection) share them; two
workers of a core each (an executor each) cost ~14 s more of CPU on a 2-vCPU machine,
most of it where the tests wait for the cluster.

The daemons are kernmlops.fleet.local_cluster's (java directly, the master first);
the session's JVM starts while the workers do."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: how long the cluster may take to come up (a loaded 2-vCPU machine)
START_S = 90


def start_cluster(folder: Path) -> tuple[Any, Callable[[], None]]:
    """(a SparkSession on a new standalone cluster, a function that stops both).
    The daemons' logs and work folders are in ``folder``."""
    from contextlib import ExitStack

    from kernmlops.fleet.local_cluster import FAST_JVM, standalone_cluster, wait_for_log
    from kernmlops.fleet.spark_job import session

    stack = ExitStack()
    try:
        # the session's JVM starts while the workers do
        master = stack.enter_context(
            standalone_cluster(folder, workers=1, cores=2, wait_workers=False)
        )
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        options = " ".join(FAST_JVM)
        spark = session(
            master,
            app="kernmlops-tests",
            **{
                "spark.sql.shuffle.partitions": "2",
                "spark.executor.memory": "512m",
                # the tests' few thousand rows: compiling each query's Java costs more
                # than running it interpreted (the results are the same: -13 s a run)
                "spark.sql.codegen.wholeStage": "false",
                "spark.sql.codegen.factoryMode": "NO_CODEGEN",
                "spark.driver.extraJavaOptions": options,
                "spark.executor.extraJavaOptions": options,
            },
        )
        stack.callback(_end_gateway)  # after spark.stop (an exit stack's are last first)
        stack.callback(spark.stop)
        master_log = folder / "master.log"
        wait_for_log(master_log, "Registering worker", 1, [], START_S)
        # The worker's executor up (the driver counts itself too): its JVM starts
        # here, not in the first test's own timing (a collection's spare CPU, say).
        memory_status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus
        deadline = time.monotonic() + START_S
        while memory_status().size() < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no executors: {master_log.read_text()[-2000:]}")
            time.sleep(0.05)
    except BaseException:
        stack.close()
        raise
    return spark, stack.close


def _end_gateway() -> None:
    """The session's JVM (PySpark's gateway) ends with the session: stopping the
    session leaves it running, a child of the test run, until the run exits. It ends
    when its stdin closes."""
    import subprocess

    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None
