"""`kernmlops spark-job` as a user runs it, on a Spark of its own (``--master
local[1]``): apart from tests/fleet/test_spark_job.py, whose tests share the test run's
standalone cluster and so run in the main lane (tests/lanes.py), so that this one, which
needs neither that cluster nor BPF, runs beside them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.cli import cli
from kernmlops.fleet.local_cluster import FAST_JVM
from tests.conftest import REQUIRE_BPF, needs_tools
from tests.fleet.test_spark_job import _pushed

pytestmark = [
    needs_tools("java"),
    pytest.mark.skipif(
        importlib.util.find_spec("pyspark") is None and not REQUIRE_BPF,
        reason="pyspark is not installed (make test installs it)",
    ),
]


def test_spark_job_command_says_what_is_damaged_in_one_line(tmp_path: Path) -> None:
    """The command, as a user runs it: a damaged part is one error line (no Python or
    Java stack, no progress bar in a log), exit 2; a master URL Spark would not take is
    refused before Spark starts."""
    dest = _pushed(tmp_path, ("c1", {"seed": 1, "quanta": 300}))
    part = dest / "benchmark=faux" / "collection_id=c1" / "block_io" / "part-00000.parquet"
    os.truncate(part, part.stat().st_size // 2)
    out = tmp_path / "out"
    # the JVMs (spark-submit's launcher, the driver) start as the test run's Spark does
    # (tests/spark.py: the client compiler, a serial GC), which a small machine starts
    # fastest; what the command prints is Spark's and ours either way
    fast = " ".join(FAST_JVM)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_LAUNCHER_OPTS=fast,
               PYSPARK_SUBMIT_ARGS=f"--driver-java-options '{fast}' pyspark-shell")  # fmt: skip
    command = [sys.executable, "-m", "kernmlops", "spark-job", str(dest), str(out)]
    done = subprocess.run(
        [*command, "--master", "local[1]"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]]
    assert lines[-1].startswith(f"error: {part}: not a readable Parquet file")
    for noise in ("Traceback", "Py4J", "\tat ", "[Stage"):
        assert noise not in done.stderr, done.stderr
    assert not out.exists()
    bad = CliRunner().invoke(cli, ["spark-job", str(dest), str(out), "--master", "local[0]"])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --master local[0]: not a Spark")
