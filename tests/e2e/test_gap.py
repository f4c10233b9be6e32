"""`kernmlops collect -b gap` end to end with a fake GAP suite (root + BPF).

The real gapbs cannot be fetched everywhere; the fake takes GAP's arguments
and prints GAP's output format (tests/benchmarks/fake_gap.py).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import yaml

from tests.benchmarks.fake_gap import log_lines, make_fake_gap
from tests.e2e.conftest import run_collect

pytestmark = pytest.mark.bpf


def _overrides(path: Path, **gap: object) -> str:
    path.write_text(yaml.safe_dump({"benchmark": {"name": "gap", "gap": gap}}))
    return str(path)


def _results(col) -> dict[tuple[str, str], float]:
    frame = col["benchmark_result"]
    return {(k, m): v for k, m, v in frame.select("key", "metric", "value").iter_rows()}


def test_gap_generates_the_graph_once_and_reuses_it(tmp_path: Path) -> None:
    fake = make_fake_gap(tmp_path / "gapbs")
    graphs = tmp_path / "graphs"
    common = {"source_dir": str(fake), "graph_dir": str(graphs), "scale": 7, "degree": 4}

    proc, col = run_collect(
        tmp_path / "out1", "-c", _overrides(tmp_path / "o1.yaml", **common, trials=3)
    )
    assert proc.returncode == 0, proc.stderr
    assert "generating the kron graph" in proc.stderr
    assert col is not None
    results = _results(col)
    assert [results[(f"trial_{i}", "seconds")] for i in (1, 2, 3)] == [0.001, 0.002, 0.003]
    assert results[("average", "seconds")] == pytest.approx(0.002)
    assert results[("read", "seconds")] == pytest.approx(0.00321)
    assert (results[("graph", "nodes")], results[("graph", "edges")]) == (128, 256)
    m = col.manifest
    assert m["benchmark"]["name"] == "gap" and m["filter"]["mode"] == "tree"
    # The kernel ran under the collector (its exec traced) and the converter before
    # the probes attached (setup), so only the kernel is in the tree.
    pt = col["process_trace"]
    execs = pt.filter((pl.col("kind") == "exec") & (pl.col("pid") == m["benchmark"]["pid"]))
    assert "bfs" in execs["comm"].to_list()
    assert "converter" not in pt["comm"].to_list()
    assert col["quanta_runtime"].filter(pl.col("tgid") == m["benchmark"]["pid"]).height > 0
    graph = graphs / "kron-g7-k4.sg"
    (converted,) = log_lines(fake, "converter.log")
    assert converted.startswith(f"-g 7 -k 4 -b {graphs}/")
    assert log_lines(fake, "kernel.log") == [f"bfs {graph}"]

    # Second run: another kernel on the same graph, failing with exit 3 after its
    # trials: no converter run, the exit code is the command's, results are kept.
    proc, col = run_collect(
        tmp_path / "out2",
        "-c",
        _overrides(tmp_path / "o2.yaml", **common, kernel="pr", trials=2, extra_args=["-x", "3"]),
    )
    assert proc.returncode == 3, proc.stderr
    assert "generating" not in proc.stderr
    assert col is not None
    assert col.manifest["ended_by"] == "failed" and col.manifest["benchmark"]["exit_code"] == 3
    results = _results(col)
    assert [results[(f"trial_{i}", "seconds")] for i in (1, 2)] == [0.001, 0.002]
    assert len(log_lines(fake, "converter.log")) == 1
    assert log_lines(fake, "kernel.log") == [f"bfs {graph}", f"pr {graph}"]
    assert sorted(p.name for p in graphs.iterdir()) == ["kron-g7-k4.sg"]


def test_missing_gap_is_a_clear_error(tmp_path: Path) -> None:
    proc, col = run_collect(
        tmp_path / "out", "-c", _overrides(tmp_path / "o.yaml", source_dir=str(tmp_path / "none"))
    )
    assert proc.returncode == 2
    said = " ".join(proc.stderr.split())  # the console wraps long lines
    assert "GAP benchmark suite was not found" in said
    assert "git clone --depth 1" in said and "benchmark.gap.source_dir" in said
    assert "setup-gap" not in said
    assert "probes attached" not in proc.stderr
    assert col is None
