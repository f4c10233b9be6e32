"""GapBenchmark: output parsing, argv, the graph cache (with a fake GAP), check()."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from kernmlops.benchmarks.base import BenchmarkRun
from kernmlops.benchmarks.gap import GapBenchmark, gap_result_rows, parse_gap_output
from kernmlops.config import load_config
from kernmlops.errors import BenchmarkError, ConfigError
from tests.benchmarks.fake_gap import log_lines, make_fake_gap

# What GAP kernels print (format "%-21s%3.5lf" for times), as a run with -f shows it.
BFS_FROM_FILE = """\
Read Time:           0.04312
Graph has 65536 nodes and 908724 undirected edges for degree: 13
Source:                 33214
Trial Time:          0.00188
Source:                  1207
Trial Time:          0.00101
Source:                 50120
Trial Time:          0.00098
Average Time:        0.00129
"""

# A run that generates its graph (-g) and verifies each trial (-v).
PR_GENERATED_VERIFIED = """\
Generate Time:       0.51034
Build Time:          0.23311
Graph has 1048576 nodes and 15699687 undirected edges for degree: 14
 0    0.52714523
 1    0.16623120
Trial Time:          0.41220
Verification:        PASS
Verification Time:   0.30118
Trial Time:          0.40180
Verification:        FAIL
Verification Time:   0.30002
Average Time:        0.40700
"""

# tc relabels by degree first; a directed graph says so.
TC_RELABEL = """\
Read Time:           1.20000
Graph has 4096 nodes and 60000 directed edges for degree: 14
Relabel Time:        0.01500
Trial Time:          0.25000
Average Time:        0.25000
"""


def _bench(**options: object) -> GapBenchmark:
    return GapBenchmark(GapBenchmark.Options(**options))


def test_parse_trials_average_and_read() -> None:
    out = parse_gap_output(BFS_FROM_FILE)
    assert out.trials == [0.00188, 0.00101, 0.00098]
    assert out.average == 0.00129
    # GAP's average is the mean of its trials (printed to 5 decimals).
    assert sum(out.trials) / len(out.trials) == pytest.approx(out.average, abs=5e-6)
    assert out.times == {"Read": 0.04312}
    assert (out.nodes, out.edges, out.directed) == (65536, 908724, False)
    assert out.verified == []


def test_parse_generate_build_and_verification() -> None:
    out = parse_gap_output(PR_GENERATED_VERIFIED)
    assert out.trials == [0.41220, 0.40180]
    assert out.average == 0.40700
    # Verification Time is the checker's, neither a trial nor a phase of the run.
    assert out.times == {"Generate": 0.51034, "Build": 0.23311}
    assert out.verified == [True, False]
    assert out.nodes == 1048576


def test_parse_relabel_and_directed() -> None:
    out = parse_gap_output(TC_RELABEL)
    assert out.times == {"Read": 1.2, "Relabel": 0.015}
    assert out.directed is True
    assert out.trials == [0.25]


def test_parse_ignores_noise_and_empty() -> None:
    assert parse_gap_output("").trials == []
    out = parse_gap_output("warning: something\nTrial Time: abc\nTrial Time:   0.5\n")
    assert out.trials == [0.5]


def test_result_rows() -> None:
    rows = gap_result_rows(parse_gap_output(PR_GENERATED_VERIFIED))
    assert rows == [
        ("trial_1", "seconds", 0.41220, "s"),
        ("trial_2", "seconds", 0.40180, "s"),
        ("trial_1", "verified", 1.0, "bool"),
        ("trial_2", "verified", 0.0, "bool"),
        ("average", "seconds", 0.40700, "s"),
        ("generate", "seconds", 0.51034, "s"),
        ("build", "seconds", 0.23311, "s"),
        ("graph", "nodes", 1048576.0, "count"),
        ("graph", "edges", 15699687.0, "count"),
    ]


def test_results_from_a_run(tmp_path: Path) -> None:
    (tmp_path / "stdout.txt").write_text(BFS_FROM_FILE)
    frame = _bench().results(BenchmarkRun(tmp_path, 0, stdout_path=tmp_path / "stdout.txt"))
    assert frame is not None
    trials = frame.filter(frame["key"].str.starts_with("trial_"))
    assert trials["value"].to_list() == [0.00188, 0.00101, 0.00098]
    assert _bench().results(BenchmarkRun(tmp_path, 0)) is None
    (tmp_path / "empty.txt").write_text("Couldn't open file x.sg\n")
    assert _bench().results(BenchmarkRun(tmp_path, 255, stdout_path=tmp_path / "empty.txt")) is None


def test_options_defaults_and_errors() -> None:
    opts = GapBenchmark.Options()
    assert (opts.kernel, opts.scale, opts.degree, opts.trials) == ("bfs", 20, 16, 3)
    for bad in ({"kernel": "dfs"}, {"scale": 0}, {"degree": 0}, {"trials": 0}, {"scael": 5}):
        with pytest.raises(ValidationError):
            GapBenchmark.Options(**bad)


def test_config_section_is_gap(tmp_path: Path) -> None:
    cfg = load_config({"benchmark": {"name": "gap", "gap": {"kernel": "pr", "scale": 12}}})
    opts = cfg.benchmark_options()
    assert isinstance(opts, GapBenchmark.Options)
    assert (opts.kernel, opts.scale) == ("pr", 12)
    with pytest.raises(ConfigError, match=r"benchmark\.gap\.kernel"):
        load_config({"benchmark": {"gap": {"kernel": "dfs"}}})


@pytest.mark.parametrize(
    ("kernel", "suffix", "weighted"),
    [("pr", "sg", False), ("bfs", "sg", False), ("cc", "sg", False), ("bc", "sg", False),
     ("tc", "sg", False), ("sssp", "wsg", True)],
)  # fmt: skip
def test_argv_per_kernel(tmp_path: Path, kernel: str, suffix: str, weighted: bool) -> None:
    bench = _bench(source_dir=str(tmp_path / "gapbs"), graph_dir=str(tmp_path / "graphs"),
                   kernel=kernel, scale=10, degree=8, trials=2)  # fmt: skip
    graph = tmp_path / "graphs" / f"kron-g10-k8.{suffix}"
    launch = bench.launch()
    assert launch is not None
    assert launch.argv == [str(tmp_path / "gapbs" / kernel), "-f", str(graph), "-n", "2"]
    assert launch.capture_output and launch.env == {}
    conv = bench.converter_argv(graph)
    assert conv[0] == str(tmp_path / "gapbs" / "converter")
    assert conv[1:5] == ["-g", "10", "-k", "8"]
    assert ("-w" in conv) is weighted
    assert conv[-2:] == ["-b", str(graph)]


def test_argv_verify_threads_extra_args(tmp_path: Path) -> None:
    bench = _bench(source_dir=str(tmp_path), graph_dir=str(tmp_path), verify=True, threads=2,
                   extra_args=["-r", "7"])  # fmt: skip
    launch = bench.launch()
    assert launch is not None
    assert launch.argv[-3:] == ["-v", "-r", "7"]
    assert launch.env == {"OMP_NUM_THREADS": "2"}
    assert bench.describe().startswith(str(tmp_path / "bfs") + " -f ")


def test_default_folders_follow_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    bench = _bench()
    assert bench.source_dir == tmp_path / ".cache" / "kernmlops" / "gapbs"
    assert bench.graph_path == tmp_path / ".cache/kernmlops/gap-graphs/kron-g20-k16.sg"
    rel = _bench(source_dir="gap", graph_dir="~/g")
    assert rel.source_dir == Path.cwd() / "gap"
    assert rel.graph_dir == tmp_path / "g"


def test_graph_generated_once_then_reused(tmp_path: Path) -> None:
    fake = make_fake_gap(tmp_path / "gapbs")
    graphs = tmp_path / "graphs"
    common = {"source_dir": str(fake), "graph_dir": str(graphs), "scale": 6, "degree": 4}
    first = _bench(**common)
    first.check()
    assert first.ensure_graph() is True
    assert first.graph_path.read_text().split() == ["fakegraph", "64", "128", "0", "4"]
    # The same graph for another run (another kernel, another instance) is reused.
    again = _bench(**common, kernel="pr")
    again.setup(tmp_path)
    assert again.ensure_graph() is False
    assert log_lines(fake, "converter.log") == [
        f"-g 6 -k 4 -b {graphs}/.kron-g6-k4.{os.getpid()}.partial.sg"
    ]
    # sssp needs the weighted graph: a second, separate file.
    weighted = _bench(**common, kernel="sssp")
    assert weighted.ensure_graph() is True
    assert weighted.graph_path.name == "kron-g6-k4.wsg"
    assert weighted.graph_path.read_text().split()[3] == "1"
    assert len(log_lines(fake, "converter.log")) == 2
    assert "-w" in log_lines(fake, "converter.log")[1].split()
    assert sorted(p.name for p in graphs.iterdir()) == ["kron-g6-k4.sg", "kron-g6-k4.wsg"]


def test_fake_suite_runs_the_launched_argv(tmp_path: Path) -> None:
    fake = make_fake_gap(tmp_path / "gapbs")
    bench = _bench(source_dir=str(fake), graph_dir=str(tmp_path / "g"), scale=5, trials=4)
    bench.check()
    bench.setup(tmp_path)
    launch = bench.launch()
    assert launch is not None
    done = subprocess.run(launch.argv, capture_output=True, text=True, timeout=120, check=True)
    (tmp_path / "stdout.txt").write_text(done.stdout)
    frame = bench.results(BenchmarkRun(tmp_path, 0, stdout_path=tmp_path / "stdout.txt"))
    assert frame is not None
    values = {(k, m): v for k, m, v in frame.select("key", "metric", "value").iter_rows()}
    assert [values[(f"trial_{i}", "seconds")] for i in range(1, 5)] == [0.001, 0.002, 0.003, 0.004]
    assert values[("average", "seconds")] == pytest.approx(0.0025)
    assert values[("graph", "nodes")] == 32
    assert log_lines(fake, "kernel.log") == [f"bfs {bench.graph_path}"]


def test_converter_failure_leaves_no_graph(tmp_path: Path) -> None:
    fake = make_fake_gap(tmp_path / "gapbs")
    (fake / "converter").write_text("#!/bin/sh\necho 'std::bad_alloc' >&2\nexit 134\n")
    bench = _bench(source_dir=str(fake), graph_dir=str(tmp_path / "g"), scale=5)
    with pytest.raises(BenchmarkError, match=r"converter failed \(exit 134\).*bad_alloc"):
        bench.ensure_graph()
    assert list((tmp_path / "g").iterdir()) == []


def test_converter_that_writes_nothing_is_an_error(tmp_path: Path) -> None:
    fake = make_fake_gap(tmp_path / "gapbs")
    (fake / "converter").write_text("#!/bin/sh\nexit 0\n")
    with pytest.raises(BenchmarkError, match="converter failed"):
        _bench(source_dir=str(fake), graph_dir=str(tmp_path / "g")).ensure_graph()


def test_unwritable_graph_dir(tmp_path: Path) -> None:
    fake = make_fake_gap(tmp_path / "gapbs")
    (tmp_path / "file").write_text("")
    bench = _bench(source_dir=str(fake), graph_dir=str(tmp_path / "file" / "graphs"))
    with pytest.raises(BenchmarkError, match="graph_dir"):
        bench.ensure_graph()


def test_check_without_gap_says_how_to_get_it(tmp_path: Path) -> None:
    bench = _bench(source_dir=str(tmp_path / "nowhere"))
    with pytest.raises(BenchmarkError) as err:
        bench.check()
    msg = str(err.value)
    assert "benchmark.gap.source_dir" in msg
    assert str(tmp_path / "nowhere") in msg
    # Issue: it said `make setup-gap`, a target of the source checkout's Makefile that
    # an installed wheel's user does not have; the commands said clone into the folder
    # searched and build there
    assert "setup-gap" not in msg
    where = str(tmp_path / "nowhere")
    repo = "https://github.com/sbeamer/gapbs"  # the Makefile's GAP_REPO
    assert f"`git clone --depth 1 {repo} {where} && make -C {where} -j`" in msg


def test_check_default_folder_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(BenchmarkError, match=r"git clone --depth 1 .* && make -C "):
        _bench().check()


def test_check_unbuilt_copy(tmp_path: Path) -> None:
    src = make_fake_gap(tmp_path / "gapbs", kernels=("pr",))
    bench = _bench(source_dir=str(src), graph_dir=str(tmp_path / "g"), kernel="bfs")
    with pytest.raises(BenchmarkError, match=r"no built 'bfs' program.*make -C"):
        bench.check()
    _bench(source_dir=str(src), graph_dir=str(tmp_path / "g"), kernel="pr").check()
    (src / "pr").chmod(0o644)  # present but not executable: not built
    with pytest.raises(BenchmarkError, match="no built 'pr'"):
        _bench(source_dir=str(src), kernel="pr").check()


def test_converter_needed_only_without_a_cached_graph(tmp_path: Path) -> None:
    src = make_fake_gap(tmp_path / "gapbs")
    (src / "converter").unlink()
    bench = _bench(source_dir=str(src), graph_dir=str(tmp_path / "g"), scale=5)
    with pytest.raises(BenchmarkError, match="no built 'converter'"):
        bench.check()
    bench.graph_path.parent.mkdir()
    bench.graph_path.write_text("fakegraph 32 64 0 4\n")
    bench.check()  # the cached graph is all it needs
