"""`kernmlops spark-job` on a local DATASET that is not one: said before Spark starts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.cli import cli
from kernmlops.fleet import spark_job
from tests.conftest import REQUIRE_BPF


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark must not be started (it takes 15 s and pages of log to say the same)."""

    def start(master: str) -> None:
        raise AssertionError(f"Spark started ({master})")

    monkeypatch.setattr(spark_job, "start", start)
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)


@pytest.mark.usefixtures("no_spark")
def test_spark_job_on_a_local_folder_that_is_no_dataset_fails_before_spark(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    missing = tmp_path / "missing"
    for given, why in (
        (str(missing), "no such folder (DATASET is the folder kernmlops push wrote)"),
        (f"file://{missing}", "no such folder (DATASET is the folder kernmlops push wrote)"),
        (str(afile), "not a folder (DATASET is the folder kernmlops push wrote)"),
        (str(empty), "no _index/ (is it a dataset that kernmlops push wrote?)"),
        (f"file:{empty}", "no _index/ (is it a dataset that kernmlops push wrote?)"),
    ):
        result = CliRunner().invoke(cli, ["spark-job", given, str(tmp_path / "out")])
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines() == [f"error: {given}: {why}"]
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(
    importlib.util.find_spec("pyspark") is None and not REQUIRE_BPF,
    reason="needs pyspark (make setup installs it)",
)
def test_a_dataset_on_another_filesystem_is_left_to_spark(
    no_spark: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """s3a://, hdfs://, and a bare path where Hadoop's configuration makes HDFS the
    default filesystem: not checked here (Spark is started, and refused by the stub)."""
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    for given in ("s3a://lab/fleet", "hdfs://head/fleet", str(tmp_path / "on-hdfs")):
        result = CliRunner().invoke(cli, ["spark-job", given, str(tmp_path / "out")])
        assert isinstance(result.exception, AssertionError), result.output
        assert "Spark started" in str(result.exception)
