"""A standalone Spark cluster on this machine: a master and workers started from pyspark's
own jars, for trying ``kernmlops spark-job --master`` before a real cluster, for the
tests and for ``python -m bench fleet-scale``.

The daemons are started with java directly (spark-class would start a JVM first only to
build the command) with the client compiler and a serial GC, which start fastest on a
small machine. Needs pyspark and Java 17.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["FAST_JVM", "ClusterError", "free_port", "standalone_cluster"]

#: JVM options for a fast start on a small machine (the client compiler, a serial GC)
FAST_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


class ClusterError(RuntimeError):
    """The cluster did not start (the master's log's end says why)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def standalone_cluster(
    workdir: Path,
    *,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    timeout_s: float = 90,
) -> Iterator[str]:
    """Start a master and ``workers`` workers (``cores`` and ``memory`` each) on
    127.0.0.1, logging under ``workdir``; yield the master's URL (``spark://...``) once
    every worker has registered; stop them all on exit.

    Raises:
        ClusterError: a daemon exited, or the workers did not register in ``timeout_s``.
    """
    import pyspark

    home = Path(pyspark.__file__).parent
    workdir.mkdir(parents=True, exist_ok=True)
    # what spark-class's load-spark-env.sh sets: the workers build executors' commands
    scala = next((home / "jars").glob("scala-library-*.jar")).stem.split("-")[-1]
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_SCALA_VERSION": ".".join(scala.split(".")[:2])}  # fmt: skip
    java = ["java", "-cp", f"{home}/jars/*", "-Xmx256m", *FAST_JVM]
    port = free_port()
    master = f"spark://127.0.0.1:{port}"
    daemons = {
        "master": ["org.apache.spark.deploy.master.Master", "--port", str(port)],
        **{
            f"worker{i}": ["org.apache.spark.deploy.worker.Worker", "--cores", str(cores),
                           "--memory", memory, "--work-dir", str(workdir / f"work{i}"), master]
            for i in range(workers)
        },
    }  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, args in daemons.items():
            cmd = [*java, args[0], "--host", "127.0.0.1", "--webui-port", str(free_port())]
            with open(workdir / f"{name}.log", "w") as log:
                procs.append(
                    subprocess.Popen(
                        [*cmd, *args[1:]], env=env, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        deadline = time.monotonic() + timeout_s
        master_log = workdir / "master.log"
        while master_log.read_text().count("Registering worker") < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise ClusterError(
                    f"the Spark cluster did not start: {master_log.read_text()[-2000:]}"
                )
            time.sleep(0.2)
        yield master
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
