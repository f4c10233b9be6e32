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

__all__ = ["FAST_JVM", "ClusterError", "free_port", "standalone_cluster", "wait_for_log"]

#: JVM options for a fast start on a small machine (the client compiler, a serial GC)
FAST_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


class ClusterError(RuntimeError):
    """The cluster did not start (the master's log's end says why)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_log(
    log: Path, text: str, count: int, procs: list[subprocess.Popen[bytes]], timeout_s: float
) -> None:
    """Until ``text`` is in a daemon's ``log`` ``count`` times.

    Raises:
        ClusterError: a daemon exited, or ``timeout_s`` passed.
    """
    deadline = time.monotonic() + timeout_s
    while log.read_text().count(text) < count:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise ClusterError(f"the Spark cluster did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)


@contextmanager
def standalone_cluster(
    workdir: Path,
    *,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    timeout_s: float = 90,
    wait_workers: bool = True,
) -> Iterator[str]:
    """Start a master and ``workers`` workers (``cores`` and ``memory`` each) on
    127.0.0.1, logging under ``workdir``; yield the master's URL (``spark://...``) once
    every worker has registered (with ``wait_workers=False``: once they are started,
    so a session's JVM can start meanwhile; :func:`wait_for_log` on ``master.log``
    waits for them); stop them all on exit. The master starts first: a worker that
    finds none retries only seconds later.

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
    master_log = workdir / "master.log"
    procs: list[subprocess.Popen[bytes]] = []

    def daemon(name: str, cls: str, *args: str) -> None:
        cmd = [*java, cls, "--host", "127.0.0.1", "--webui-port", str(free_port()), *args]
        with open(workdir / f"{name}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))

    try:
        daemon("master", "org.apache.spark.deploy.master.Master", "--port", str(port))
        wait_for_log(master_log, "New state: ALIVE", 1, procs, timeout_s)
        for i in range(workers):
            daemon(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--cores", str(cores),
                   "--memory", memory, "--work-dir", str(workdir / f"work{i}"), master)  # fmt: skip
        if wait_workers:
            wait_for_log(master_log, "Registering worker", workers, procs, timeout_s)
        yield master
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
