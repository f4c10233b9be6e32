"""asynchronous-duet users' own work, unchanged: result folders in its layout
and names, its processed CSV, its configs; and our output in its forms.

The fixtures are written here in the original tool's formats (file names
``<suite>.<benchmark>.<runid>.<type>.<order>.<pair>.<file>``, ``artifacts/``
holding ``date``'s output, DaCapo CSVs with ``start_unix`` or only
``total_ms``, the CSV its ``process.py parse`` writes)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from kernmlops.duet.barrier import barrier_path
from kernmlops.duet.cli import duet_group
from kernmlops.duet.config import load_duet_config, validate_duet_config
from kernmlops.duet.process import process_dirs, read_results, write_processed
from kernmlops.duet.runner import run_suite
from tests.duet.conftest import write_config

DATE = "Tue Nov 24 10:00:00 UTC 2026"
DATE_NS = int(datetime(2026, 11, 24, 10, tzinfo=UTC).timestamp()) * 1_000_000_000


def _artifacts(folder: Path) -> None:
    art = folder / "artifacts"
    art.mkdir(parents=True)
    (art / "date").write_text(DATE + "\n")
    (art / "hostname").write_text("bench-host\n")
    (art / "lscpu").write_text("Architecture: x86_64\nCPU(s): 2\nModel name: Test CPU\n")
    (art / "meminfo").write_text("MemTotal:       24000000 kB\n")
    (art / "uname").write_text("Linux bench-host 6.1.0 x86_64\n")


def _dacapo_new(start_ms: int, times_ms: list[int]) -> str:
    lines = ["benchmark,iteration_time_ns,total_ms,start_unix"]
    total, t = 0, start_ms
    for d in times_ms:
        lines.append(f"avrora,{d * 1_000_000},{total},{t}")
        total += d
        t += d
    return "\n".join(lines) + "\n"


def _dacapo_old(times_ms: list[int], offset_ms: int = 0) -> str:
    lines = ["benchmark,iteration_time_ns,total_ms"]
    total = offset_ms
    for d in times_ms:
        lines.append(f"avrora,{d * 1_000_000},{total}")
        total += d
    return "\n".join(lines) + "\n"


def test_original_dacapo_folder_reads_start_unix_and_total_ms(tmp_path: Path):
    res = tmp_path / "results.20261124-100000"
    _artifacts(res)
    t0 = 1_795_500_000_000
    for r in range(3):
        for pair, times in (("A", [100, 102, 98]), ("B", [110, 108, 111])):
            name = f"dacapo.avrora.{r}.duet.{'AB' if r % 2 == 0 else 'BA'}.{pair}.results.csv"
            (res / name).write_text(_dacapo_new(t0 + r * 10_000, times))
    (res / "scalabench.avrora.0.seqn.None.A.results.csv").write_text(_dacapo_old([200, 190]))
    (res / "scalabench.avrora.0.seqn.None.B.results.csv").write_text(_dacapo_old([210, 205], 5))
    (res / "not-a-result.txt").write_text("ignored: the original ignores it too")

    out = process_dirs([res], aa=frozenset({"avrora"}))
    assert out.errors == [] and out.files == 8
    t = out.results
    first = t.filter(
        (pl.col("suite") == "dacapo") & (pl.col("runid") == 1) & (pl.col("pair") == "A")
    )
    # start_unix is Unix ms
    assert first["iteration_start_ns"].to_list() == [
        (t0 + 10_000) * 1_000_000, (t0 + 10_100) * 1_000_000, (t0 + 10_202) * 1_000_000
    ]  # fmt: skip
    assert first["order"].to_list() == ["BA"] * 3 and first["aa"].all()
    old = t.filter((pl.col("suite") == "scalabench") & (pl.col("pair") == "B"))
    # total_ms only: the original's anchor, artifacts/date + total_ms
    assert old["iteration_start_ns"].to_list() == [DATE_NS + 5_000_000, DATE_NS + 215_000_000]
    assert old["kind"].unique().to_list() == ["sequential"]
    assert t["artifact_hostname"].unique().to_list() == ["bench-host"]


def test_cli_processes_a_dacapo_only_folder_and_analyzes_both_ways(tmp_path: Path):
    res = tmp_path / "res"
    _artifacts(res)
    for r in range(4):
        for pair, times in (("A", [100] * 8), ("B", [120] * 8)):
            start = 1_795_500_000_000 + r * 100_000 + (7 if pair == "B" else 0)
            (res / f"dacapo.fop.{r}.duet.AB.{pair}.results.csv").write_text(
                _dacapo_new(start, [d + (r * 3 + i) % 5 for i, d in enumerate(times)])
            )
    runner = CliRunner()
    got = runner.invoke(duet_group, ["process", str(res), "--json", "--original"])
    assert got.exit_code == 0, got.output
    assert "64 iterations from 8 file(s)" in got.output
    rows = json.loads((res / "duet-results.json").read_text())
    assert len(rows) == 64 and rows[0]["suite"] == "dacapo"
    orig = pl.read_csv(res / "duet-results.original.csv")
    assert {"type", "order", "date", "hostname", "iteration_time_ns"} <= set(orig.columns)
    assert orig["iteration"].min() == 1  # DaCapo counts from 1 in the original
    got = runner.invoke(duet_group, ["analyze", str(res), "--method", "original", "--no-mds"])
    assert got.exit_code == 0, got.output
    assert "dacapo fop [duet] (original): B is slower than A" in got.output
    md = (res / "report" / "report.md").read_text()
    assert "original: verdict" in md and "B/A − 1" in md


def _original_processed_csv(path: Path) -> None:
    """What the original's ``process.py parse`` writes: pandas floats where a
    column had gaps, order 'None' for seqn, artifacts as plain columns."""
    lines = [
        "suite,benchmark,type,order,pair,runid,iteration,iteration_start_ns,"
        "iteration_end_ns,iteration_time_ns,start_unix,total_ms,date,hostname,lscpu,meminfo,uname"
    ]
    for r in range(5):
        for pair, base in (("A", 108078259.0), ("B", 118078259.0)):
            for i in range(1, 9):
                start = 1.7955e18 + r * 1e10 + i * 2e8 + (3e6 if pair == "B" else 0)
                t = base + (r * 7 + i * 13) % 11 * 1e5
                lines.append(
                    f"scalabench,kiama,duet,AB,{pair},{r},{i},{start:.1f},{start + t:.1f},{t:.1f},"
                    f",,{DATE},host,Test CPU,24000000 kB,Linux"
                )
    for r in range(5):
        for pair, base in (("A", 108078259.0), ("B", 108078259.0)):
            for i in range(1, 9):
                t = base + (r * 5 + i * 3) % 7 * 1e5
                lines.append(
                    f"scalabench,kiama,seqn,None,{pair},{r},{i},{i * 3e8:.1f},{i * 3e8 + t:.1f},"
                    f"{t:.1f},,,{DATE},host,Test CPU,24000000 kB,Linux"
                )
    path.write_text("\n".join(lines) + "\n")


def test_the_originals_processed_csv_is_analysed(tmp_path: Path):
    csv = tmp_path / "results.csv"
    _original_processed_csv(csv)
    table, kernel = read_results(csv)
    assert kernel is None and table.height == 160
    assert table["iteration_time_ns"].dtype == pl.Int64 and table["iteration"].min() == 0
    assert sorted(table["kind"].unique()) == ["duet", "sequential"]
    assert table.filter(pl.col("kind") == "sequential")["order"].null_count() == 80
    runner = CliRunner()
    got = runner.invoke(duet_group, ["analyze", str(csv), "--no-mds", "--aa", "other"])
    assert got.exit_code == 0, got.output
    assert "scalabench kiama [duet]: B is slower than A" in got.output
    assert "scalabench kiama [sequential]" in got.output


def test_not_a_results_table_is_one_clear_line(tmp_path: Path):
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n1,2\n")
    got = CliRunner().invoke(duet_group, ["analyze", str(bad)])
    assert got.exit_code != 0 and "not a duet results table" in got.output
    assert "Traceback" not in got.output
    broken = tmp_path / "broken.csv"
    broken.write_text("suite,benchmark,type,runid,pair,iteration_time_ns\ns,b,duet,zero,A,1\n")
    got = CliRunner().invoke(duet_group, ["analyze", str(broken)])
    assert got.exit_code != 0 and "not a duet results table" in got.output


ORIGINAL_CONFIG = """
duetbench:
  name: compat
  seed: 42
  schedule: randomized_interleaving_trials
  duet_repetitions: 1
  sequential_repetitions: 1
  harness: {{iterations: 3}}
  duets: [small, tiny]

# an anchor block and a note: not duets, ignored as the original ignores them
defaults: &defaults
  suite: loops
notes: "tiny has its own suite"

small:
  <<: *defaults
  A: {{run: "{loop} 100000"}}

tiny:
  suite: other
  A: {{run: "{loop} 100000"}}
  B: {{run: "{loop} 120000"}}
"""


def test_original_config_runs_unchanged_and_original_layout(tmp_path: Path, loop_bin: Path):
    cfg = write_config(tmp_path / "duet.yml", ORIGINAL_CONFIG.format(loop=loop_bin))
    suite = load_duet_config(cfg)
    assert [(d.name, d.suite, d.aa) for d in suite.duets] == [
        ("small", "loops", True), ("tiny", "other", False)
    ]  # fmt: skip
    result = run_suite(suite, tmp_path / "out", layout="original")
    assert not result.failed
    names = sorted(p.name for p in result.folder.iterdir() if p.is_file() and "." in p.name)
    # the original's names, at the top of the folder beside artifacts/
    assert "loops.small.0.seqn.None.A.harness.csv" in names
    assert "other.tiny.0.duet.AB.B.harness.csv" in names
    assert (result.folder / "artifacts" / "date").is_file()
    assert not (result.folder / "results").exists()
    table = process_dirs([result.folder]).results
    assert sorted(table["suite"].unique()) == ["loops", "other"]
    got = table.group_by("benchmark").agg(pl.col("aa").all())
    assert dict(got.iter_rows()) == {"small": True, "tiny": False}
    # the same files without duet-run.json: A/A comes from the config
    (result.folder / "duet-run.json").unlink()
    runner = CliRunner()
    got = runner.invoke(
        duet_group, ["process", str(result.folder), "--config", str(cfg), "--original"]
    )
    assert got.exit_code == 0, got.output
    back = read_results(result.folder / "duet-results.parquet")[0]
    assert dict(back.group_by("benchmark").agg(pl.col("aa").all()).iter_rows()) == {
        "small": True, "tiny": False
    }  # fmt: skip
    original = read_results(result.folder / "duet-results.original.csv")[0]
    assert original.height == back.height
    assert original["iteration_start_ns"].to_list() == back["iteration_start_ns"].to_list()


SYNC_CONFIG = """
duetbench:
  suite: sync-{pid}
  duet_repetitions: 0
  syncduet_repetitions: 2
  timeout: 60
  syncduet_run_base: {py} -m kernmlops.duet.harness --iterations 6 --barrier $$ --output out.csv --
  results: [out.csv]
  duets: [sleepy]
sleepy:
  A: {{run: sleep 0.01}}
  B: {{run: sleep 0.08}}
"""


def test_syncduet_shares_one_barrier_and_starts_iterations_together(tmp_path: Path):
    import sys

    cfg = write_config(
        tmp_path / "duet.yml", SYNC_CONFIG.format(pid=os.getpid(), py=sys.executable)
    )
    result = run_suite(load_duet_config(cfg), tmp_path / "out")
    assert not result.failed, [t.sides for t in result.trials]
    for trial in result.trials:
        name = trial.sync.removeprefix("barrier ")
        assert trial.sync.startswith("barrier syncduet.sleepy.") and "$$" not in name
        commands = [s.command for s in trial.sides.values()]
        assert all(f"--barrier {name} " in c for c in commands)  # the same name, no PIDs
        assert not barrier_path(name).exists()  # removed after the trial
    table = process_dirs([result.folder]).results
    for runid in (0, 1):
        run = table.filter(pl.col("runid") == runid).sort("iteration")
        a, b = (
            run.filter(pl.col("pair") == side).select("iteration_start_ns", "iteration_end_ns")
            for side in ("A", "B")
        )
        assert a.height == b.height == 6
        # A's 10 ms iterations wait for B's 80 ms ones: neither side starts an iteration
        # before the other ended the one before (the barrier's guarantee; how close
        # together they start is the scheduler's, and CI's idle lane delays either)
        for first, second in ((a, b), (b, a)):
            ended = second["iteration_end_ns"].to_numpy()[:-1]
            assert (first["iteration_start_ns"].to_numpy()[1:] > ended).all()
        # ... so each of A's waited out B's 80 ms
        assert ((b["iteration_end_ns"] - b["iteration_start_ns"]) >= 80_000_000).all()


def test_syncduet_without_placeholder_is_recorded_unsynchronized(tmp_path: Path):
    cfg = validate_duet_config(
        {
            "duetbench": {"suite": f"nosync-{os.getpid()}", "duet_repetitions": 0,
                          "syncduet_repetitions": 1, "syncduet_run_base": "sh -c",
                          "results": ["f"], "duets": ["d"]},
            "d": {"A": {"run": "'echo hi > f'"}},
        }
    )  # fmt: skip
    [trial] = run_suite(cfg, tmp_path / "out").trials
    assert trial.sync is None and any("no $$" in w for w in trial.warnings)


def test_processed_output_round_trips_through_json(tmp_path: Path, loop_bin: Path):
    cfg = validate_duet_config(
        {
            "duetbench": {"suite": "rt", "duet_repetitions": 1, "harness": {"iterations": 3},
                          "duets": ["d"]},
            "d": {"A": {"run": f"{loop_bin} 1000"}},
        }
    )  # fmt: skip
    result = run_suite(cfg, tmp_path / "out")
    processed = process_dirs([result.folder])
    written = write_processed(processed, tmp_path / "t", json=True, original=True)
    assert {p.name for p in written} >= {"duet-results.json", "duet-results.original.json"}
    ours = read_results(tmp_path / "t" / "duet-results.json")[0]
    assert ours.equals(processed.results.select(ours.columns))
    pandas_form = json.loads((tmp_path / "t" / "duet-results.original.json").read_text())
    assert set(pandas_form["type"].values()) == {"duet"} and len(pandas_form["pair"]) == 6
    back = read_results(tmp_path / "t" / "duet-results.original.json")[0]
    assert back["iteration_time_ns"].to_list() == processed.results["iteration_time_ns"].to_list()


@pytest.mark.parametrize("verbose", [True, False])
def test_run_verbose_and_docker_options(tmp_path: Path, loop_bin: Path, verbose: bool):
    cfg = write_config(
        tmp_path / "duet.yml",
        f"duetbench:\n  suite: v{int(verbose)}-{os.getpid()}\n  harness: {{iterations: 2}}\n"
        f"  duets: [d]\nd:\n  A: {{run: {loop_bin} 1000}}\n",
    )
    args = ["run", str(cfg), "-o", str(tmp_path / "o"), "--docker", "podman"]
    got = CliRunner().invoke(duet_group, args + (["--verbose"] if verbose else []))
    assert got.exit_code == 0, got.output
    assert ("A: pid" in got.output and f"{loop_bin} 1000" in got.output) == verbose
