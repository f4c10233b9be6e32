"""One Spark for the whole test run (the ``spark`` fixture of tests/conftest.py): a real
standalone cluster on this machine, spark://127.0.0.1:<port>, a master and two workers
of one core each, and a session on it. Its JVMs take most of a Spark test's time, so
the tests that use Spark (the fleet's job, the faults' killed collection) share them.

The daemons are started with java directly (spark-class would start a JVM first to
build the command), the master first: a worker that finds no master retries only
seconds later. The session's JVM starts while the workers do."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: JVM options for a fast start on a small machine (the client compiler, a serial GC)
FAST_JVM = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
#: how long the cluster may take to come up (a loaded 2-vCPU machine)
START_S = 90


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_log(log: Path, text: str, count: int, procs: list[subprocess.Popen], what: str) -> None:
    """Until ``text`` is in ``log`` ``count`` times; fails if a daemon died."""
    deadline = time.monotonic() + START_S
    while log.read_text().count(text) < count:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"{what}: {log.read_text()[-2000:]}")
        time.sleep(0.05)


def start_cluster(folder: Path) -> tuple[Any, Callable[[], None]]:
    """(a SparkSession on a new standalone cluster, a function that stops both).
    The daemons' logs and work folders are in ``folder``."""
    import pyspark

    from kernmlops.fleet.spark_job import session

    home = Path(pyspark.__file__).parent
    # what spark-class's load-spark-env.sh sets: the workers build executors' commands
    scala = next((home / "jars").glob("scala-library-*.jar")).stem.split("-")[-1]
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_SCALA_VERSION": ".".join(scala.split(".")[:2])}  # fmt: skip
    java = ["java", "-cp", f"{home}/jars/*", "-Xmx256m", *FAST_JVM]
    port = _port()
    master = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []

    def daemon(name: str, cls: str, *args: str) -> None:
        with open(folder / f"{name}.log", "w") as log:
            argv = [*java, cls, "--host", "127.0.0.1", "--webui-port", str(_port()), *args]
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))

    def stop_daemons() -> None:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    try:
        daemon("master", "org.apache.spark.deploy.master.Master", "--port", str(port))
        master_log = folder / "master.log"
        _wait_log(master_log, "New state: ALIVE", 1, procs, "the Spark master did not start")
        for i in range(2):
            daemon(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--cores", "1",
                   "--memory", "1g", "--work-dir", str(folder / f"work{i}"), master)  # fmt: skip
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        options = " ".join(FAST_JVM)
        spark = session(
            master,
            app="kernmlops-tests",
            **{
                "spark.sql.shuffle.partitions": "2",
                "spark.executor.memory": "512m",
                "spark.driver.extraJavaOptions": options,
                "spark.executor.extraJavaOptions": options,
            },
        )
        _wait_log(master_log, "Registering worker", 2, procs, "the Spark workers did not start")
        # Each worker's executor up (the driver counts itself too): their JVMs start
        # here, not in the first test's own timing (a collection's spare CPU, say).
        memory_status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus
        deadline = time.monotonic() + START_S
        while memory_status().size() < 3:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no executors: {master_log.read_text()[-2000:]}")
            time.sleep(0.05)
    except BaseException:
        if "spark" in locals():
            spark.stop()
        stop_daemons()
        raise

    def stop() -> None:
        try:
            spark.stop()
        finally:
            stop_daemons()

    return spark, stop
