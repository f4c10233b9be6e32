"""``duet process`` and ``duet analyze`` on a folder whose files are damaged or are no
files: a result file or a results table that is a FIFO (no writer: a reader waits for
ever), a kernel table that is not Parquet. Each is one line, never a hang nor a
traceback, and the damaged file stays as it was."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.duet.test_process import GOOD, _suite


def _duet(*args: str) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run([sys.executable, "-m", "kernmlops", "duet", *args],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"duet {args[0]} hung")
    assert "Traceback" not in done.stderr, done.stderr
    return done


@pytest.fixture(scope="module")
def _processed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A suite as ``duet process --json`` leaves it (its results table in Parquet, CSV
    and JSON): processed once, each test damaging its own copy (see ``processed``)."""
    folder = _suite(tmp_path_factory.mktemp("duet-processed") / "run", [GOOD], {})
    assert _duet("process", str(folder), "--json").returncode == 0
    assert {p.name for p in folder.glob("duet-results.*")} == {
        f"duet-results{suffix}" for suffix in (".csv", ".json", ".parquet")
    }
    return folder


@pytest.fixture
def processed(_processed: Path, tmp_path: Path) -> Path:
    """This test's own copy of the processed suite."""
    return Path(shutil.copytree(_processed, tmp_path / "run", symlinks=True))


def test_a_results_table_that_is_a_fifo_is_one_line(processed: Path) -> None:
    table = processed / "duet-results.parquet"
    table.unlink()
    os.mkfifo(table)
    done = _duet("analyze", str(processed))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert f"{table}: not a duet results table (" in line and "not a plain file" in line, line


def test_a_damaged_kernel_table_is_one_line(processed: Path) -> None:
    kernel = processed / "duet-kernel.parquet"
    kernel.write_bytes(b"not parquet at all, and short")
    done = _duet("analyze", str(processed))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert f"{kernel}: not a duet kernel table (" in line, line
    assert kernel.read_bytes() == b"not parquet at all, and short"


def test_a_result_file_that_is_a_fifo_is_named_not_waited_for(tmp_path: Path) -> None:
    folder = _suite(tmp_path / "run", [GOOD], {})
    (folder / GOOD).unlink()
    os.mkfifo(folder / GOOD)
    done = _duet("process", str(folder))
    assert done.returncode == 2
    assert f"{folder / GOOD}: result file is not a plain file: not read" in done.stderr


@pytest.mark.parametrize("suffix", [".csv", ".json", ".parquet"])
def test_a_huge_results_table_is_one_line_not_read(processed: Path, suffix: str) -> None:
    """A results table (CSV, JSON or Parquet) is read whole into memory: one past the
    limit (sparse here: no disk taken) is refused in one line, before any byte is read,
    and left as it was."""
    from kernmlops.duet.process import RESULTS_MAX_BYTES

    table = processed / f"duet-results{suffix}"
    start = table.read_bytes()
    os.truncate(table, RESULTS_MAX_BYTES + (100 << 20))
    done = _duet("analyze", str(table))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.endswith(f"{table}: results table of 1.1 GiB, over the 1.0 GiB limit: not read")
    assert table.stat().st_size == RESULTS_MAX_BYTES + (100 << 20)
    with table.open("rb") as f:
        assert f.read(len(start)) == start


def test_a_huge_kernel_table_is_one_line_not_read(processed: Path) -> None:
    """The kernel table beside the results, read whole as they are: one past their
    limit is refused in one line, left as it was."""
    from kernmlops.duet.process import RESULTS_MAX_BYTES

    kernel = processed / "duet-kernel.parquet"
    with open(kernel, "ab") as f:  # made if missing; sparse: no disk taken
        f.truncate(RESULTS_MAX_BYTES + (100 << 20))
    done = _duet("analyze", str(processed))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.endswith(f"{kernel}: kernel table of 1.1 GiB, over the 1.0 GiB limit: not read")
    assert kernel.stat().st_size == RESULTS_MAX_BYTES + (100 << 20)


def test_a_damaged_table_is_refused_before_the_statistics_load(processed: Path) -> None:
    """scipy.stats (most of `duet analyze`'s start) is imported at the first interval,
    not before the table is read: a table that is no results table is refused at once."""
    table = processed / "duet-results.parquet"
    table.write_bytes(b"not parquet at all, and short")
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from kernmlops.cli import cli\n"
        f"done = CliRunner().invoke(cli, ['duet', 'analyze', {str(processed)!r}])\n"
        "print(done.exit_code, 'scipy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["2", "False"], (out.stdout, out.stderr)
