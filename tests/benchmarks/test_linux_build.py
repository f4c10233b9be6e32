"""LinuxBuildBenchmark: options, make's argv and -j, kbuild's output counted, and real
builds of Debian's linux-source-6.1 (tinyconfig, one object: seconds once the build
folder is prepared) checked against the object files made and the compilers run."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import polars as pl
import pytest
from pydantic import ValidationError

from kernmlops.benchmarks.base import BenchmarkRun
from kernmlops.benchmarks.linux_build import DEBIAN_SOURCE, LinuxBuildBenchmark, compiled_files
from kernmlops.errors import BenchmarkError
from kernmlops.host.environment import Environment
from tests.benchmarks.collect_util import collect, execs, results
from tests.conftest import needs_tools

needs_source = pytest.mark.skipif(
    not DEBIAN_SOURCE.is_file(), reason=f"no {DEBIAN_SOURCE} (apt-get install linux-source-6.1)"
)
needs_build = needs_tools("make", "gcc", "flex", "bison", "bc")
TARGET = "lib/ctype.o"
KBUILD = """\
make[1]: Entering directory '/tmp/b'
  GEN     Makefile
  CC      scripts/mod/empty.o
  CC [M]  drivers/foo.o
  LD      vmlinux
  CC      lib/ctype.o
"""


def _bench(**options: object) -> LinuxBuildBenchmark:
    return LinuxBuildBenchmark(LinuxBuildBenchmark.Options(**options))


def test_options_and_argv(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        LinuxBuildBenchmark.Options(config="rm -rf /")
    bench = _bench(source_dir=str(tmp_path), targets=["vmlinux"], jobs=3)
    bench.build_dir = tmp_path / "b"
    assert bench.launch().argv == ["make", "-C", str(tmp_path), f"O={tmp_path / 'b'}", "-j3",
                                   "vmlinux"]  # fmt: skip
    bench = _bench()
    bench.environment = Environment(cpus=[0])
    assert bench.jobs() == 1  # -j follows benchmark.cpus
    with pytest.raises(BenchmarkError, match="not a Linux source tree"):
        _bench(source_dir=str(tmp_path)).check()


def test_results_count_kbuild_compiles(tmp_path: Path) -> None:
    out = tmp_path / "stdout.txt"
    out.write_text(KBUILD)
    frame = _bench(jobs=2).results(
        BenchmarkRun(tmp_path, 0, stdout_path=out, started_us=1_000_000, ended_us=3_500_000)
    )
    got = {m: v for _, m, v in frame.select("key", "metric", "value").iter_rows()}
    assert got == {"jobs": 2.0, "build_time_s": 2.5, "compiled_files": 3.0}


@pytest.mark.parametrize("exit_code", [143, 2, None])
def test_a_build_not_done_has_no_build_time(tmp_path: Path, exit_code: int | None) -> None:
    """Stopped by -d 2 (make's status 143: SIGTERM), the run was written up as
    build_time_s 2.03, the time of a build that did not happen; a failed one too."""
    out = tmp_path / "stdout.txt"
    out.write_text(KBUILD)
    frame = _bench(jobs=2).results(
        BenchmarkRun(tmp_path, exit_code, stdout_path=out, started_us=1_000_000, ended_us=3_500_000)
    )
    got = {m: v for _, m, v in frame.select("key", "metric", "value").iter_rows()}
    assert got == {"jobs": 2.0, "compiled_files": 3.0}  # what it did compile, still


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build folder for the module: the first run prepares it (kconfig, headers)."""
    return tmp_path_factory.mktemp("linux-build")


def _options(build_dir: Path) -> dict[str, object]:
    (build_dir / TARGET).unlink(missing_ok=True)  # so the run compiles it again
    # tinyconfig once; later runs keep the folder's .config
    config = None if (build_dir / ".config").exists() else "tinyconfig"
    return {"build_dir": str(build_dir), "config": config, "targets": [TARGET], "jobs": 2}


@needs_source
@needs_build
def test_a_real_build(tmp_path: Path, build_dir: Path) -> None:
    bench = _bench(**_options(build_dir))
    bench.check()
    bench.setup(tmp_path)
    assert "CONFIG_CC_OPTIMIZE_FOR_SIZE=y" in (build_dir / ".config").read_text()  # tiny
    began = time.time()
    out = tmp_path / "stdout.txt"
    with out.open("wb") as f:
        done = subprocess.run(bench.launch().argv, stdout=f, stderr=subprocess.PIPE,
                              timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    frame = bench.results(BenchmarkRun(tmp_path, 0, stdout_path=out))
    got = {m: v for _, m, v in frame.select("key", "metric", "value").iter_rows()}
    # each object kbuild says it compiled was written by this run; ours among them
    named = compiled_files(out.read_text())
    assert TARGET in named and got["compiled_files"] == len(named)
    for obj in named:
        assert (build_dir / obj).stat().st_mtime >= began - 1, obj


@pytest.mark.bpf
@needs_source
@needs_build
def test_linux_build_through_collect(tmp_path: Path, build_dir: Path) -> None:
    proc, col = collect(tmp_path, "linux-build", _options(build_dir), "--hooks", "process_trace")
    assert proc.returncode == 0, proc.stderr
    got = results(col)
    assert got[("build", "jobs")] == 2
    # each compiled file is one cc1 run seen by the kernel (cc1 also preprocesses .S
    # files and compiles host tools, which a prepared folder no longer builds)
    assert 1 <= got[("build", "compiled_files")] <= execs(col, "cc1").height
    m = col.manifest.benchmark
    wall = (m.stopped_uptime_us - m.started_uptime_us) / 1e6
    assert 0 < got[("build", "build_time_s")] == pytest.approx(wall, abs=0.05)
    assert execs(col, "make").height >= 1
    assert col["process_trace"].filter(pl.col("kind") == "exec").height > 1
