"""bench/: the entry point finds every benchmark, each one's --help works, and the
harness's statistics and results files are right on known inputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bench import harness
from bench.__main__ import benchmarks
from bench.__main__ import main as bench_main
from tests.conftest import needs_tools

REPO = Path(__file__).resolve().parent.parent
MODULES = sorted(
    p.stem
    for p in (REPO / "bench").glob("*.py")
    if not p.stem.startswith("_") and p.stem != "harness"
)


def test_list_names_every_module_with_its_purpose_and_target() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "list"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    listed = {line.split()[0] for line in out.splitlines() if line and not line[0].isspace()}
    assert {m.replace("_", "-") for m in MODULES} <= listed
    found = benchmarks()
    assert sorted(e.module for e in found.values()) == MODULES
    for entry in found.values():
        assert entry.purpose, f"{entry.module} has no docstring"
        assert entry.target, f"{entry.module} has no TARGET"


@pytest.mark.parametrize("module", MODULES)
def test_help_of_each_benchmark(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    name = module.replace("_", "-")
    with pytest.raises(SystemExit) as done:
        bench_main([name, "--help"])
    assert done.value.code == 0
    assert f"usage: python -m bench {name}" in capsys.readouterr().out


def test_an_unknown_benchmark_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["no-such-bench"]) == 2
    assert "python -m bench list" in capsys.readouterr().err


def _coverage(n: int, j: int) -> float:
    """P(x(j) <= median <= x(n+1-j)), from scipy's binomial, independently of the harness."""
    return float(stats.binom.cdf(n - j, n, 0.5) - stats.binom.cdf(j - 1, n, 0.5))


@pytest.mark.parametrize("n", [2, 3, 5, 6, 9, 10, 20, 51])
def test_median_interval_is_the_narrowest_order_statistics_at_95(n: int) -> None:
    values = np.random.default_rng(n).lognormal(size=n)
    xs = np.sort(values)
    low, high, coverage = harness.median_interval(list(values))
    fits = [j for j in range(1, n // 2 + 1) if _coverage(n, j) >= 0.95]
    j = max(fits) if fits else 1
    assert (low, high) == (xs[j - 1], xs[n - j])
    assert coverage == pytest.approx(_coverage(n, j))


def test_summary_on_known_values() -> None:
    s = harness.summarize([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert s.median == 5.5
    assert (s.median_low, s.median_high) == (2, 9)  # 97.9% coverage; (3, 8) has 89.1%
    assert s.median_coverage == pytest.approx(1 - 2 * 11 / 1024)
    sem = stats.sem(range(1, 11))
    lo, hi = stats.t.interval(0.95, 9, loc=5.5, scale=sem)
    assert (s.mean, s.mean_low, s.mean_high) == pytest.approx((5.5, lo, hi))


def test_summary_without_scipy_keeps_the_medians(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle on a machine whose Python lacks scipy (the 16-core machine's): the
    medians and their intervals, no mean interval, and a results file still written."""
    monkeypatch.setitem(sys.modules, "scipy", None)  # import scipy... raises ImportError
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    s = harness.summarize([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert (s.median, s.median_low, s.median_high, s.mean) == (5.5, 2, 9, 5.5)
    assert (s.mean_low, s.mean_high) == (None, None)
    assert s.as_dict(1)["mean_low"] is None and s.as_dict(1)["median_high"] == 9


def test_a_rounded_summary_keeps_its_confidence_and_coverage() -> None:
    s = harness.summarize([1.04, 2, 3, 4, 5, 6, 7, 8, 9, 10]).as_dict(1)
    assert s["median_low"] == 2.0 and s["mean"] == 5.5  # rounded to a digit
    assert s["confidence"] == 0.95 and s["median_coverage"] == pytest.approx(1 - 2 * 11 / 1024)


def test_rotations_turn_the_order_each_round() -> None:
    got = [order for _, order in harness.rotations(["a", "b", "c"], 4)]
    assert got == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_results_file_records_the_run_and_old_files_still_read(tmp_path: Path) -> None:
    harness.begin("demo", ["--rounds", "3"])
    out = tmp_path / "demo.json"
    harness.save(out, {"median": 1.5, "where": str(harness.ROOT / "bench" / "x")})
    data = json.loads(out.read_text())
    assert data["median"] == 1.5 and data["where"] == "bench/x"
    meta = data[harness.META_KEY]
    assert meta["format"] == harness.FORMAT and meta["benchmark"] == "demo"
    assert meta["argv"] == ["--rounds", "3"]
    assert {"cpus", "cpu_model", "kernel", "memory_gib"} <= set(meta["machine"])
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"machine": {"cpus": 2, "kernel": "6.18"}, "median": 2}))
    read = harness.load(old)
    assert read["median"] == 2 and read[harness.META_KEY]["format"] == 0
    assert read[harness.META_KEY]["machine"] == {"cpus": 2, "kernel": "6.18"}


def test_committed_results_read_and_name_their_machine() -> None:
    for path in sorted((REPO / "bench" / "results").glob("*.json")):
        meta = harness.load(path)[harness.META_KEY]
        assert meta["machine"].get("cpus"), f"{path.name}: no machine recorded"


def test_fleet_scale_fits_a_line_and_says_where_each_engine_stops() -> None:
    from bench.fleet_scale import fit, where_wrong

    sizes = [10, 100, 1000]
    line = fit(sizes, [1.0 + 0.002 * n for n in sizes])
    assert line["fixed_s"] == pytest.approx(1.0)
    assert line["per_collection_ms"] == pytest.approx(2.0)
    lines = {
        "a": {"fixed_s": 1.0, "per_collection_ms": 2.0},
        "b": {"fixed_s": 20.0, "per_collection_ms": 1.0},
    }
    verdict = where_wrong(lines, (10.0,), ["a", "b"])
    assert verdict["largest_within"] == {"a": {"10s": 4500}, "b": {"10s": 0}}
    assert verdict["crossover_n"] == {"a vs b": 19000}
    assert verdict["per_collection_vs_cheapest"] == {"a": 2.0, "b": 1.0}
    # relative residuals: a noisy large size does not swallow the small ones' fixed cost
    noisy = fit(sizes, [1.02, 1.2, 3.6])
    assert 0.9 < noisy["fixed_s"] < 1.1


def test_fleet_scale_copies_publish_and_polars_and_duckdb_agree(tmp_path: Path) -> None:
    """Copies of a collection published with their index rows; the polars and DuckDB
    summaries agree with each other and with the source's own numbers, and a changed
    number is caught."""
    duckdb = pytest.importorskip("duckdb")
    import polars as pl

    from bench.fleet_scale import Copier, compare, duckdb_summaries, polars_summaries, present
    from kernmlops.fleet import open_dataset
    from kernmlops.fleet.index import read_index
    from tests.fleet.conftest import make_collection

    source = make_collection(tmp_path / "src", "c0", quanta=600)
    copier = Copier(source, tmp_path / "dataset")
    copier.grow(3)
    index = read_index(open_dataset(tmp_path / "dataset")).to_pylist()
    assert [r["host"] for r in index] == ["node-0000", "node-0001", "node-0002"]
    assert len({r["collection_id"] for r in index}) == 3
    assert all(r["total_rows"] > 0 for r in index)
    tables = present(copier.root)
    assert {"quanta_runtime", "page_faults", "block_io"} <= tables
    polars_summaries(copier.root, tmp_path / "polars", tables)
    with duckdb.connect() as con:
        duckdb_summaries(con, copier.root, tmp_path / "duckdb", tables)
    outs = {"polars": tmp_path / "polars", "duckdb": tmp_path / "duckdb"}
    got = compare(outs)
    assert got["agree"], got["problems"]
    summary = pl.read_parquet(tmp_path / "duckdb" / "collections.parquet")
    assert summary["quanta"].to_list() == [600] * 3
    assert summary["switches_per_s"].to_list() == [300.0] * 3  # 600 quanta in 2 s
    by_comm = pl.read_parquet(tmp_path / "polars" / "quanta_by_comm.parquet")
    assert by_comm["quanta"].sum() == 3 * 600

    changed = summary.with_columns(pl.col("quanta") + (pl.col("host") == "node-0001"))
    changed.write_parquet(tmp_path / "duckdb" / "collections.parquet")
    got = compare(outs)
    assert not got["agree"] and "collections.quanta" in got["problems"][0]


def test_a_baseline_runs_from_a_checkout_or_an_installed_folder(tmp_path: Path) -> None:
    assert harness.tree_env(None) == {}  # this tree: the environment as it is
    checkout, site = tmp_path / "checkout", tmp_path / "site"
    (checkout / "src" / "kernmlops").mkdir(parents=True)
    (site / "kernmlops").mkdir(parents=True)
    env = harness.tree_env(checkout)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(checkout / "src")
    env = harness.tree_env(site)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(site)
    with pytest.raises(SystemExit, match="no kernmlops there"):
        harness.tree_env(tmp_path / "empty")


def test_children_run_the_kernmlops_a_pythonpath_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a wheel installed with pip --target (no clang there): its kernmlops, not src/'s
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    paths = harness.child_env()["PYTHONPATH"].split(os.pathsep)
    assert paths == [str(tmp_path), str(REPO), str(REPO / "src")]
    monkeypatch.delenv("PYTHONPATH")
    assert harness.child_env()["PYTHONPATH"].split(os.pathsep) == [str(REPO), str(REPO / "src")]


def test_the_static_storms_result_is_overheads_score(tmp_path: Path) -> None:
    from bench.overhead import switch_storm

    storm = tmp_path / "storm"
    subprocess.run(["gcc", "-O2", "-o", str(storm), str(REPO / "bench" / "switch_storm.c")],
                   check=True)  # fmt: skip
    w = switch_storm(1, str(storm), pairs=2)
    assert w.argv == [str(storm), "2", "1"] and w.higher_is_better
    proc = subprocess.run([str(storm), "2", "0.3"], capture_output=True, text=True, check=True)
    got = json.loads(proc.stdout)
    assert got["pairs"] == 2 and got["failed_children"] == 0 and got["round_trips"] > 0
    # round trips counted by the pairs themselves, over the storm's own clock
    assert got["round_trips_per_s"] == pytest.approx(got["round_trips"] / got["seconds"], rel=1e-3)
    assert w.score(proc.stdout, proc.stderr) == (got["round_trips_per_s"], got["round_trips"])
    with pytest.raises(RuntimeError, match="no result line"):
        w.score("", "killed")


def test_a_killed_collectors_memory_spool_goes_with_its_output(tmp_path: Path, shm: Path) -> None:
    # bench kills a collector that does not stop in time: its collection folder and
    # its spool's folder on the tmpfs both go (kernmlops warns about a leftover one
    # at every later start); a link to anyone else's folder is not followed.
    from kernmlops.spool import memory as spool_mod
    from tests.spool.conftest import make_collection

    out = tmp_path / "out"
    coll = out / "curated" / "benchmark=faux" / "collection_id=k1"
    memory = spool_mod.spool_memory(make_collection(coll, "k1"), "k1", 8)
    assert memory is not None and memory.folder.parent == shm
    (memory.folder / "events.00000.ring").write_bytes(b"x" * 64)
    other = tmp_path / "someone-elses"
    other.mkdir()
    planted = make_collection(out / "curated" / "benchmark=faux" / "collection_id=k2", "k2")
    planted.mkdir()
    (planted / spool_mod.MEMORY_LINK).symlink_to(other)
    harness.remove_output(out)
    assert not out.exists() and not memory.folder.exists()
    assert other.exists()


@pytest.mark.parametrize("how", ["full", "lazy"])
def test_storm_trees_reads_count_every_row_in_their_own_process(tmp_path: Path, how: str) -> None:
    # what storm-tree --read full/lazy reports: rows per table (the sink's own counts)
    # and the reader's peak RSS, from a process of its own
    import polars as pl

    from bench.storm_tree import child_read
    from kernmlops.collect.manifest import write_manifest
    from kernmlops.collect.parquet import ParquetSink

    with ParquetSink(tmp_path, "c1", row_group_rows=1024, rows_per_file=5000) as sink:
        sink.write("events", pl.DataFrame({"ts": np.arange(12_000), "cpu": np.zeros(12_000)}))
        sink.write("drops", pl.DataFrame({"hook": ["a", "b"], "drops": [0, 3]}))
    write_manifest(tmp_path, {"collection_id": "c1", "tables": sink.files_written()})
    got = child_read(tmp_path, how)
    assert got["rows"] == {"drops": 2, "events": 12_000}
    assert 10 < got["max_rss_mb"] < 1024  # its own, not this process's peak (GBs by now)


def test_the_storms_quiet_wait_leaves_a_deadline_room_for_the_round() -> None:
    from argparse import Namespace

    from bench.overhead import quiet_cap

    args = Namespace(quiet_wait=20.0, storm_s=5, deadline=None)
    assert quiet_cap(args, 3, 1000.0) == 20.0  # no deadline: the full wait
    args.deadline = 1000.0 + 3 * 13 + 3 * 20 + 30  # room for it all
    assert quiet_cap(args, 3, 1000.0) == 20.0
    args.deadline = 1000.0 + 3 * 13 + 15  # 15 s of room for three waits
    assert quiet_cap(args, 3, 1000.0) == 5.0
    args.deadline = 1000.0 + 10  # the round itself will not fit: no waiting
    assert quiet_cap(args, 3, 1000.0) == 0.0


@needs_tools("stress-ng")
def test_fork_rows_reads_the_workloads_own_count(tmp_path: Path) -> None:
    from bench.fork_rows import _workload, workload_argv

    # stress-ng's metrics line against its own YAML report of the same run
    argv = [*workload_argv("fork", 1, 1), "--yaml", str(tmp_path / "m.yaml")]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=tmp_path)
    got = _workload(out.stdout + out.stderr, "fork", 0.25)
    report = (tmp_path / "m.yaml").read_text()
    assert f"bogo-ops: {got['ops']}\n" in report and got["ops"] > 0
    assert got["workload_cpu_us_per_op"] == pytest.approx(0.25e6 / got["ops"])


def test_fork_rows_pairs_each_programs_ns_by_round() -> None:
    from bench.fork_rows import paired

    def run(fork: float, cnt: int = 10) -> dict:
        return {"programs": {"fork_btf": {"ns_per_run": fork, "run_cnt": cnt}}}

    a = [run(1500), run(1300), run(1900)]
    b = [run(1000), run(1100), run(1200, cnt=0)]  # a round without runs pairs nothing
    assert paired(a, b) == {"fork_btf": (500 + 200) / 2}


def test_the_storm_times_no_program_unless_asked() -> None:
    """A storm run without --bpf-stats (the kernel counted no run) says its programs
    were not timed, rather than 0 ns a run; a timed one divides the kernel's counts."""
    from bench.overhead import Run, StormResult, ns_per_run

    def run(state: str, score: float, progs: dict[str, list[int]]) -> Run:
        return Run(state, score, score, 1.0, 1.0, 0.0, 0.0, bpf_progs=progs)

    def rounds(timed: bool) -> StormResult:
        n = 1000 if timed else 0
        return StormResult(["storm"], [{
            "off": run("off", 100.0, {}),
            "floor": run("floor", 90.0, {"floor_switch": [50 * n, n]}),
            "programs": run("programs", 85.0, {"switch_btf": [90 * n, n]}),
            "default": run("default", 80.0, {"switch_btf": [95 * n, n]}),
        }])  # fmt: skip

    untimed, timed = rounds(False).summary(), rounds(True).summary()
    assert untimed["floor_ns_per_run"] is None and untimed["programs_ns_per_run"] is None
    assert untimed["default_ns_per_run"] == {}
    assert ns_per_run(untimed["floor_ns_per_run"]) == "ns/run not timed (--bpf-stats)"
    assert (timed["floor_ns_per_run"], timed["programs_ns_per_run"]) == (50.0, 90.0)
    assert timed["default_ns_per_run"] == {"switch_btf": 95.0}
    # the slowdowns are the runs' own scores either way
    assert (
        untimed["default_over_floor"]
        == timed["default_over_floor"]
        == pytest.approx((100 / 80 - 1) / (100 / 90 - 1))
    )


def test_switch_cost_reads_every_task_of_the_storms_tree() -> None:
    """switch-cost's tasks are the storm's whole tree (stress-ng forks its workers),
    as ps lists it, and their schedstat counts grow as they run."""
    from bench.switch_cost import cpu_and_arrivals, storm_tasks

    tree = subprocess.Popen(
        ["sh", "-c", "sh -c 'sleep 600 & wait' & sh -c 'while :; do :; done' & wait"],
        start_new_session=True,  # one group: the whole tree goes at the end
    )
    try:
        # the tree as ps lists it, once it is whole: waited for, not a fixed time (a
        # starved test, in CI's idle lane, may find its shells not yet forked)
        def below(pid: int, parent: dict[int, int]) -> bool:
            while pid > 1:
                if pid == tree.pid:
                    return True
                pid = parent.get(pid, 0)
            return False

        deadline = time.monotonic() + 60
        while True:
            ps = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
            parent = {int(p): int(pp) for p, pp in (ln.split() for ln in ps.stdout.splitlines())}
            expected = {p for p in parent if below(p, parent)}
            # the root, two shells, sleep (the busy loop is a shell)
            if len(expected) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(expected) >= 4, expected
        assert set(storm_tasks(tree.pid)) == expected
        # the counts grow as the busy loop runs: until it ran 0.1 s more, however
        # long that takes at the idle policy
        cpu0, n0 = cpu_and_arrivals(sorted(expected))
        while (cpu1 := cpu_and_arrivals(sorted(expected))[0]) - cpu0 <= 0.1e9:
            assert time.monotonic() < deadline + 60, f"{(cpu1 - cpu0) / 1e9:.3f} s of CPU"
            time.sleep(0.05)
        assert cpu_and_arrivals(sorted(expected))[1] >= n0
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()
