"""KernMLOps' `kernmlops collect dump` and `collect graph` (graphs/cli.py), reached
through `collect` as its users type them (and `make dump`); `collect -- dump` still runs
a program."""

from __future__ import annotations

import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kernmlops.cli import cli
from tests.conftest import needs_tools
from tests.graphs.conftest import synthetic_tables, write_collection


@pytest.fixture
def curated(tmp_path: Path) -> Path:
    tables = synthetic_tables()
    write_collection(tmp_path, {t: tables[t] for t in ("process_trace", "block_io")},
                     cid="abc-1", benchmark="linux-build")  # fmt: skip
    write_collection(tmp_path, {"process_trace": tables["process_trace"]},
                     cid="abd-2", benchmark="faux")  # fmt: skip
    return tmp_path / "curated"


def _shapes(output: str) -> dict[str, str]:
    """table -> "(rows, columns)" from the dump's `name: shape: (r, c)` lines."""
    return {
        line.split(":")[0]: line.split("shape: ")[1]
        for line in output.splitlines()
        if ": shape: (" in line
    }


def test_collect_dump_prints_every_table_as_kernmlops_did(curated: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(cli, ["collect", "dump", "-d", str(curated)])
    assert done.exit_code == 0, done.output
    shapes = _shapes(done.output)
    assert sorted(shapes) == sorted(
        ["process_trace", "block_io", "block_io_queue_length", "block_io_latency"]
    )
    assert shapes["process_trace"].startswith("(12, ")  # both collections' 6 rows
    assert shapes["block_io_latency"].startswith("(60, ")  # the synthetic block_io's rows
    # one benchmark, as KernMLOps spells it; the data folder holding curated/ too
    done = runner.invoke(cli, ["collect", "dump", "-b", "linux_build", "-d", str(curated.parent)])
    assert done.exit_code == 0, done.output
    assert _shapes(done.output)["process_trace"].startswith("(6, ")
    missing = runner.invoke(cli, ["collect", "dump", "-d", str(curated / "nope")])
    assert missing.exit_code != 0
    assert missing.output.strip().splitlines() == [f"error: {curated / 'nope'}: no such folder"]


def test_collect_graph_draws_the_collection_its_id_prefix_names(
    curated: Path, tmp_path: Path
) -> None:
    runner = CliRunner()
    out = tmp_path / "figs"
    args = ["collect", "graph", "-d", str(curated), "-o", str(out), "--no-trends", "-m"]
    done = runner.invoke(cli, [*args, "-c", "abc"])
    assert done.exit_code == 0, done.output
    drawn = sorted(p.name for p in out.iterdir())
    assert "process_events.png" in drawn and "block_io_latency.png" in drawn
    # a prefix two ids share, or none has: one line each, non-zero
    for prefix, said in (
        ("ab", "2 collections' ids start with 'ab' (abc-1, abd-2): give more of the id"),
        ("zz", "no collection's id starts with 'zz'"),
    ):
        refused = runner.invoke(cli, [*args, "-c", prefix])
        assert refused.exit_code != 0
        assert refused.output.strip().splitlines() == [f"error: {curated}: {said}"]


@pytest.mark.parametrize(
    ("args", "command", "rest"),
    [
        (["collect", "dump", "-d", "x"], "collect dump", ["-d", "x"]),
        (["collect", "graph", "-c", "a"], "collect graph", ["-c", "a"]),
        (["collect", "data", "-b", "faux"], "collect data", ["-b", "faux"]),
        # after `--` the words are a command to run, whatever they are
        (["collect", "--", "dump"], "collect", ["--", "dump"]),
        (["collect", "-b", "gap"], "collect", ["-b", "gap"]),
    ],
)
def test_kernmlops_collect_words_reach_their_commands(
    args: list[str], command: str, rest: list[str]
) -> None:
    assert isinstance(cli, click.Group)
    with click.Context(cli) as ctx:
        name, found, left = cli.resolve_command(ctx, args)
    assert found is not None and (name, left) == (command, rest)
    assert found.name == command


@needs_tools("make")
def test_make_dump_runs_collect_dump() -> None:
    # -n: what it would run, the set-up it needs first included
    proc = subprocess.run(
        ["make", "-s", "-n", "dump", "ARGS=-b gap"],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert proc.stdout.strip().splitlines()[-1].endswith("kernmlops collect dump -b gap")
