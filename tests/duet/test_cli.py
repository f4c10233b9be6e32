"""``kernmlops duet run | process | analyze`` through click, end to end."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.duet.cli import duet_group
from kernmlops.duet.config import load_duet_config
from tests.duet.conftest import CFG, swapping_config, write_config

SILENT = """
duetbench:
  suite: silent-{pid}
  duet_repetitions: 2
  duets: [nothing]
nothing:
  A: {{run: "true", results: [hyperfine.json]}}
  B: {{run: "true", results: [hyperfine.json]}}
"""


def test_sides_that_leave_no_result_file_fail_the_run(tmp_path: Path):
    cfg = write_config(tmp_path / "duet.yml", SILENT.format(pid=os.getpid()))
    out = tmp_path / "out"
    res = CliRunner().invoke(duet_group, ["run", str(cfg), "--outdir", str(out)])
    assert res.exit_code == 1, res.output
    why = (
        "exit status 0, but it left none of its result files: "
        "no hyperfine.json in its working folder"
    )
    assert res.output.count("FAILED in ") == 2
    assert res.output.count(f"A: failed ({why})") == 2
    assert res.output.count(f"B: failed ({why})") == 2
    assert "2 trial(s) did not succeed (see duet-run.json)" in res.output
    # what the folder holds says the same: no result file, every side failed
    index = json.loads((out / f"silent-{os.getpid()}" / "duet-run.json").read_text())
    assert [s["status"] for t in index["trials"] for s in t["sides"].values()] == ["failed"] * 4
    assert list((out / f"silent-{os.getpid()}" / "results").iterdir()) == []
    # process finds nothing, and analyze says what it found, not "process first"
    res = CliRunner().invoke(duet_group, ["process", str(out)])
    assert res.exit_code == 2
    assert "error: no iterations in 0 result file(s) (see the warnings above)" in res.output
    assert res.output.count("warning: ") == 4  # a line per side, the file named in it
    res = CliRunner().invoke(duet_group, ["analyze", str(out)])
    assert res.exit_code == 2 and "process` first" not in res.output
    first = f"silent-{os.getpid()}.nothing.0.duet.AB.A: side failed: {why}"
    assert res.output == (
        f"error: {out}: no duet-results.parquet: `kernmlops duet process` finds no "
        f"iterations there (0 result files; the first of its 4 warnings: {first})\n"
    )
    assert sorted(p.name for p in out.iterdir()) == [f"silent-{os.getpid()}"]  # nothing made


def test_user_errors_exit_non_zero_with_a_message(tmp_path: Path):
    runner = CliRunner()
    bad = write_config(tmp_path / "bad.yml", "duetbench: {suite: s, dets: [x]}\n")
    res = runner.invoke(duet_group, ["run", str(bad), "-o", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "duetbench.dets: unknown key; did you mean 'duetbench.duets'?" in res.output
    res = runner.invoke(duet_group, ["process", str(tmp_path)])
    assert res.exit_code == 2 and "no duet results" in res.output
    res = runner.invoke(duet_group, ["analyze", str(tmp_path)])
    assert res.exit_code == 2 and res.output == (
        f"error: {tmp_path}: no duet-results.parquet, and nothing `kernmlops duet process` "
        f"could read: {tmp_path}: no duet results (duet-run.json of `duet run`, or result "
        "files named <suite>.<benchmark>.<runid>.<type>.<order>.<pair>.<file>)\n"
    )
    res = runner.invoke(duet_group, ["process", str(tmp_path), str(tmp_path)])
    assert res.exit_code == 2 and "--out" in res.output
    (tmp_path / "duet-results.csv").write_text("a,b\n1,2\n")
    res = runner.invoke(duet_group, ["analyze", str(tmp_path), "--warmup", "x"])
    assert res.exit_code == 2 and "--warmup: warm-up 'x'" in res.output
    for option, value, said in (("--confidence", "2", "must be between 0.5 and 1 (got 2.0)"),
                                ("--min-overlap", "0", "must be in (0, 1] (got 0.0)"),
                                ("--min-runs", "1", "must be at least 2 (got 1)")):  # fmt: skip
        res = runner.invoke(duet_group, ["analyze", str(tmp_path), option, value])
        assert res.exit_code == 2 and f"{option}: {said}" in res.output, res.output


def test_analyze_resamples_are_bounded(tmp_path: Path):
    # an unbounded count let --interval bca --resamples <huge> exhaust memory
    from kernmlops.duet.analysis import MAX_RESAMPLES, MIN_RESAMPLES
    from kernmlops.duet.cli import analyze_cmd

    (tmp_path / "duet-results.csv").write_text("a,b\n1,2\n")
    for n in (MAX_RESAMPLES + 1, MIN_RESAMPLES - 1):
        args = ["analyze", str(tmp_path), "--interval", "bca", "--resamples", str(n)]
        res = CliRunner().invoke(duet_group, args)
        assert res.exit_code == 2
        assert f"--resamples: must be 100 to 100000 (got {n})" in res.output
    # as the command says it: one line, exit 2
    args = ["duet", "analyze", str(tmp_path), "--interval", "bca", "--resamples", str(10**12)]
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"error: Invalid value for --resamples: must be 100 to 100000 (got {10**12}) "
        "(see kernmlops duet analyze --help)\n"
    )
    help_text = next(p for p in analyze_cmd.params if p.name == "resamples").help
    assert f"{MIN_RESAMPLES} to {MAX_RESAMPLES}" in help_text
    # the bounds themselves are accepted: the table is read (and refused) next
    res = CliRunner().invoke(duet_group, ["analyze", str(tmp_path), "--resamples", "100000"])
    assert res.exit_code == 2 and "not a duet results table" in res.output


def test_failed_trial_makes_run_exit_1(tmp_path: Path):
    cfg = write_config(
        tmp_path / "duet.yml",
        """
duetbench: {suite: failing, duets: [d], harness: {iterations: 2}}
d: {A: {run: "true"}, B: {run: "false"}}
""",
    )
    res = CliRunner().invoke(duet_group, ["run", str(cfg), "-o", str(tmp_path / "o")])
    assert res.exit_code == 1
    assert "B: failed (exit status 1)" in res.output and "1 trial(s) did not succeed" in res.output


def test_analyze_names_a_side_that_failed_in_every_run(tmp_path: Path):
    from kernmlops.duet.process import side_outcomes

    cfg = write_config(
        tmp_path / "duet.yml",
        """
duetbench: {suite: failb, duets: [d], duet_repetitions: 2, sequential_repetitions: 1,
            harness: {iterations: 3}}
d: {A: {run: "true"}, B: {run: "sh -c 'exit 3'"}}
""",
    )
    out = tmp_path / "o"
    runner = CliRunner()
    assert runner.invoke(duet_group, ["run", str(cfg), "-o", str(out)]).exit_code == 1
    res = runner.invoke(duet_group, ["process", str(out)])
    assert res.exit_code == 0 and "d.0.duet.AB.B: side failed: exit status 3" in res.output
    # how each side ended is what duet-run.json says
    index = json.loads((out / "failb" / "duet-run.json").read_text())
    want = sorted((t["runid"], t["kind"], p, s["status"], s["error"])
                  for t in index["trials"] for p, s in t["sides"].items())  # fmt: skip
    sides = side_outcomes(out)
    assert sorted(sides.select("runid", "kind", "pair", "status", "error").rows()) == want
    assert {(k, s, e) for _, k, p, s, e in want if p == "B"} == {
        ("duet", "failed", "exit status 3"),
        ("sequential", "failed", "exit status 3"),
    }
    for args in ([], ["--warmup", "1000"]):
        res = runner.invoke(duet_group, ["analyze", str(out), "--no-mds", *args])
        assert res.exit_code == 0, res.output
        why = "B has no iteration in any run: failed (exit status 3) in all 2 runs"
        assert f"failb d [duet]: no verdict: {why}" in res.output
        assert "failb d [sequential]: no verdict: B has no iteration in any run: failed (exit " \
            "status 3) in its only run" in res.output  # fmt: skip
        md = (out / "report" / "report.md").read_text()
        # the file of its first failed run, not the folder of every log
        log = out / "failb" / "logs" / "failb.d.0.duet.AB.B.stderr"
        assert log.is_file()
        assert f"> {why}; its stderr: {log} (and 1 more beside it)" in md
        assert "lower --min-overlap" not in md and "too little data" not in md
        summary = json.loads((out / "report" / "analysis.json").read_text())
        duet = summary["benchmarks"][0]["comparisons"]["duet"]
        assert duet["verdict"] == f"no verdict: {why}" and duet["n_b_before_warmup"] == 0
    # the table without its suite folders: the side is still named, and where to look
    table = tmp_path / "t" / "duet-results.parquet"
    table.parent.mkdir()
    (out / "duet-results.parquet").rename(table)
    res = runner.invoke(duet_group, ["analyze", str(table), "--no-mds"])
    assert "[duet]: no verdict: B has no iteration in any run\n" in res.output


def test_analyze_names_a_benchmark_whose_sides_both_failed(tmp_path: Path):
    """Neither side of a benchmark has an iteration: it has no row in the results, and
    analyze names it (each side's account and its stderr files), beside the others."""
    cfg = write_config(
        tmp_path / "duet.yml",
        """
duetbench: {suite: both, duets: [good, bad], duet_repetitions: 2, sequential_repetitions: 1,
            harness: {iterations: 3}}
good: {A: {run: "true"}, B: {run: "true"}}
bad: {A: {run: "sh -c 'exit 3'"}, B: {run: "sh -c 'exit 4'"}}
""",
    )
    out = tmp_path / "o"
    runner = CliRunner()
    assert runner.invoke(duet_group, ["run", str(cfg), "-o", str(out)]).exit_code == 1
    assert runner.invoke(duet_group, ["process", str(out)]).exit_code == 0
    res = runner.invoke(duet_group, ["analyze", str(out), "--no-mds"])
    assert res.exit_code == 0, res.output
    why = ("no iterations on either side (A: failed (exit status 3) in all 2 runs; "
           "B: failed (exit status 4) in all 2 runs)")  # fmt: skip
    assert f"both bad [duet]: no verdict: {why}\n" in res.output
    alone = ("no iterations on either side (A: failed (exit status 3) in its only run; "
             "B: failed (exit status 4) in its only run)")  # fmt: skip
    assert f"both bad [sequential]: no verdict: {alone}\n" in res.output
    assert "both good [duet]: " in res.output  # the others as before
    logs = out / "both" / "logs"
    a, b = logs / "both.bad.0.duet.AB.A.stderr", logs / "both.bad.0.duet.AB.B.stderr"
    assert a.is_file() and b.is_file()
    md = (out / "report" / "report.md").read_text()
    assert (f"> {why}; A's stderr: {a} (and 1 more beside it); B's stderr: {b} (and 1 more "
            "beside it)") in md  # fmt: skip
    summary = json.loads((out / "report" / "analysis.json").read_text())
    named = {b["benchmark"]: b["comparisons"] for b in summary["benchmarks"]}
    assert sorted(named) == ["bad", "good"]
    assert named["bad"]["duet"]["verdict"] == f"no verdict: {why}"
    assert named["bad"]["duet"]["n_a"] == named["bad"]["duet"]["n_b"] == 0


def test_analyze_interval_option_is_used_and_recorded(tmp_path: Path):
    import numpy as np

    from kernmlops.duet.analysis import INTERVALS, Options, analyze
    from kernmlops.duet.cli import analyze_cmd
    from tests.duet.test_original import _duet_table

    choices = next(p for p in analyze_cmd.params if p.name == "interval").type.choices
    assert tuple(sorted(choices)) == tuple(sorted(INTERVALS))
    table = _duet_table(np.random.default_rng(3), runs=10, slow=1.01)
    table.write_parquet(tmp_path / "duet-results.parquet")
    for args, interval in (([], "signflip"), (["--interval", "bca"], "bca")):
        res = CliRunner().invoke(duet_group, ["analyze", str(tmp_path), "--no-mds", *args])
        assert res.exit_code == 0, res.output
        summary = json.loads((tmp_path / "report" / "analysis.json").read_text())
        duet = summary["benchmarks"][0]["comparisons"]["duet"]
        assert summary["options"]["interval"] == interval and duet["interval"] == interval
        direct = analyze(table, Options(mds=False, interval=interval)).benchmarks[0]
        assert duet["ratio_ci"] == direct.comparisons["duet"].ratio_ci.as_list()
        assert direct.comparisons["duet"].verdict in res.output
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| interval | BCa bootstrap |" in md and "over runs (unit: runs when ≥ 5" in md
    res = CliRunner().invoke(duet_group, ["analyze", str(tmp_path), "--interval", "exact"])
    assert res.exit_code == 2 and "'exact' is not one of" in res.output


#: CFG with a trial of each kind and order (AB, BA, sequential), two iterations each:
#: every kind of file CFG's run makes (its index, artifacts, each side's results and
#: logs), in a fifth of the time
SMALL = (
    CFG.replace("duet_repetitions: 3", "duet_repetitions: 2")
    .replace("sequential_repetitions: 3", "sequential_repetitions: 1")
    .replace("iterations: 8", "iterations: 2")
)

NOBODY = 65534
SUDO = {"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY), "SUDO_USER": "nobody"}
SECRET = "root's own: never to be overwritten\n"


def _home(tmp_path: Path) -> tuple[Path, Path]:
    """(nobody's folder, a folder of root's only holding a file) in a folder of root's."""
    tmp_path.chmod(0o755)
    user, victim = tmp_path / "alice", tmp_path / "root-only"
    user.mkdir()
    os.chown(user, NOBODY, NOBODY)
    victim.mkdir(mode=0o700)
    (victim / "secret").write_text(SECRET)
    return user, victim


def _plant(link: Path, target: Path) -> None:
    link.symlink_to(target)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="plays sudo: needs root")
def test_run_under_sudo_writes_through_no_planted_link(tmp_path: Path) -> None:
    """``sudo kernmlops duet run -o ~/out``: ~/out a link of the user's to root's folder,
    or the suite's folder in it one: refused in one line, root's folder as it was;
    into the user's folder, what the run made is theirs."""
    user, victim = _home(tmp_path)
    cfg = write_config(tmp_path / "duet.yml", SMALL.format(pid=os.getpid()))
    runner = CliRunner(env=SUDO)
    _plant(user / "out", victim)
    res = runner.invoke(duet_group, ["run", str(cfg), "-o", str(user / "out"), "--seed", "3"])
    assert res.exit_code == 2, res.output
    assert f"{user / 'out'} is a link in a folder nobody can change" in res.output
    (user / "out").unlink()
    (user / "out").mkdir()
    os.chown(user / "out", NOBODY, NOBODY)
    _plant(user / "out" / f"cli-{os.getpid()}", victim)
    res = runner.invoke(duet_group, ["run", str(cfg), "-o", str(user / "out"), "--seed", "3"])
    assert res.exit_code == 2, res.output
    assert "is a link or a file, not a folder: not written through" in res.output
    assert sorted(p.name for p in victim.iterdir()) == ["secret"]
    assert (victim / "secret").read_text() == SECRET
    (user / "out" / f"cli-{os.getpid()}").unlink()
    res = runner.invoke(duet_group, ["run", str(cfg), "-o", str(user / "out" / "new")])
    assert res.exit_code == 0, res.output
    owners = {p: p.lstat().st_uid for p in [user / "out" / "new", *(user / "out").rglob("*")]}
    assert {p: o for p, o in owners.items() if o != NOBODY} == {}
    assert (user / "out").lstat().st_uid == NOBODY


@pytest.mark.skipif(os.geteuid() != 0, reason="plays sudo: needs root")
def test_process_under_sudo_writes_through_no_planted_link(tmp_path: Path, ran: Path) -> None:
    user, victim = _home(tmp_path)
    runs = ran
    runner = CliRunner(env=SUDO)
    _plant(user / "t", victim)
    res = runner.invoke(duet_group, ["process", str(runs), "-o", str(user / "t")])
    assert res.exit_code == 2, res.output
    assert f"{user / 't'} is a link in a folder nobody can change" in res.output
    # the temporary names in the user's own folder planted as links to root's file
    out = user / "o"
    out.mkdir()
    os.chown(out, NOBODY, NOBODY)
    for ext in ("parquet", "csv"):
        _plant(out / f".duet-results.{ext}.tmp", victim / "secret")
    res = runner.invoke(duet_group, ["process", str(runs), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in victim.iterdir()) == ["secret"]
    assert (victim / "secret").read_text() == SECRET
    made = [out / "duet-results.parquet", out / "duet-results.csv"]
    assert {p.lstat().st_uid for p in made} == {NOBODY}
    assert not any(p.is_symlink() for p in made)


@pytest.mark.skipif(os.geteuid() != 0, reason="plays sudo: needs root")
def test_analyze_under_sudo_writes_through_no_planted_link(tmp_path: Path, ran: Path) -> None:
    """The report folder a link to root's folder: refused; in the user's own report
    folder, plots/ a link: refused, report.md a link to root's file: the link goes,
    the file stays; what is written is the user's."""
    user, victim = _home(tmp_path)
    runs = ran
    assert CliRunner().invoke(duet_group, ["process", str(runs)]).exit_code == 0
    runner = CliRunner(env=SUDO)

    def analyze(out: Path):
        args = ["analyze", str(runs), "--out", str(out), "--warmup", "1", "--min-runs", "3"]
        return runner.invoke(duet_group, args)

    _plant(user / "r", victim)
    res = analyze(user / "r")
    assert res.exit_code == 2 and f"{user / 'r'} is a link in a folder" in res.output, res.output
    out = user / "own"
    out.mkdir()
    os.chown(out, NOBODY, NOBODY)
    _plant(out / "plots", victim)
    res = analyze(out)
    assert res.exit_code == 2 and "plots is a link or a file" in res.output, res.output
    (out / "plots").unlink()
    _plant(out / "report.md", victim / "secret")
    res = analyze(out)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in victim.iterdir()) == ["secret"]
    assert (victim / "secret").read_text() == SECRET
    made = [p for p in out.rglob("*")]
    assert made and {p.lstat().st_uid for p in made} == {NOBODY}
    assert not (out / "report.md").is_symlink()
    assert "data:image/png;base64," in (out / "report.html").read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="the user plays the attacker: needs root")
@pytest.mark.parametrize("sudo", [True, False])
def test_run_verbose_shows_no_planted_log(tmp_path: Path, sudo: bool) -> None:
    """``duet run --verbose`` shows the end of each side's log: the user moves the
    suite's folder away and plants, under each log's name, a link to root's file.
    What is shown is never that file, with sudo or without."""
    out = Path(tempfile.mkdtemp(prefix="kmo-duet-logs-"))
    try:
        out.chmod(0o755)
        os.chown(out, NOBODY, NOBODY)
        secret = tmp_path / "secret"
        secret.write_text(SECRET)
        secret.chmod(0o600)
        cfg = swapping_config(tmp_path, out, plant=secret)
        runner = CliRunner(env=SUDO if sudo else {k: None for k in SUDO})
        res = runner.invoke(duet_group, ["run", str(cfg), "-o", str(out), "--verbose"])
        assert res.exit_code == 0, res.output
        assert any((out / "moved" / "logs").iterdir()), "the swap did not run"
        planted = list((out / load_duet_config(cfg).suite / "logs").iterdir())
        assert planted and all(p.is_symlink() for p in planted)
        assert SECRET.strip() not in res.output
    finally:
        shutil.rmtree(out, ignore_errors=True)


TINY = """
duetbench: {suite: tiny, duets: [d], harness: {iterations: 2}, duet_repetitions: 1,
            sequential_repetitions: 1}
d: {A: {run: "true"}, B: {run: "true"}}
"""


def test_run_errors_name_the_folder_as_given_not_the_held_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the run holds OUTDIR open and reaches it as /proc/<pid>/fd/<n>: no message says so
    monkeypatch.chdir(tmp_path)
    cfg = write_config(tmp_path / "tiny.yml", TINY)
    runner = CliRunner()
    assert runner.invoke(duet_group, ["run", str(cfg), "-o", "duetout"]).exit_code == 0
    res = runner.invoke(duet_group, ["run", str(cfg), "-o", "duetout"])
    assert res.exit_code == 2
    assert "error: duetout/tiny exists and is not empty: use --force to replace it" in res.output
    assert "/proc/" not in res.output

    mkdir = os.mkdir

    def read_only(path, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if path == "tiny":  # the suite's folder, made in the held OUTDIR
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", read_only)
    res = runner.invoke(duet_group, ["run", str(cfg), "-o", "elsewhere"])
    assert res.exit_code == 2
    assert (
        "error: cannot create the suite's folder elsewhere/tiny: the file system is read-only"
        in " ".join(res.output.split())
    ), res.output
    assert "/proc/" not in res.output


def test_analyze_names_the_minimum_detectable_slowdown(tmp_path: Path):
    import numpy as np

    from kernmlops.duet.analysis import Options, analyze
    from tests.duet.test_original import _duet_table

    for slow, note in ((1.2, " (B is already detected slower without an injected slowdown)"),
                       (1.0, "")):  # fmt: skip
        folder = tmp_path / str(slow)
        folder.mkdir()
        table = _duet_table(np.random.default_rng(5), runs=10, slow=slow)
        table.write_parquet(folder / "duet-results.parquet")
        res = CliRunner().invoke(duet_group, ["analyze", str(folder)])
        assert res.exit_code == 0, res.output
        [c] = analyze(table, Options()).benchmarks[0].comparisons.values()
        line = f"loops mul [duet]: {c.verdict}; minimum detectable slowdown {c.mds * 100:.2f}%"
        assert f"{line}{note}\n" in res.output
        assert "MDS" not in res.output
        md = (folder / "report" / "report.md").read_text()
        assert f"| minimum detectable slowdown | {c.mds * 100:.2f}%" in md
    assert c.mds > 0  # the A/A table: found by injecting a slowdown


def test_analyze_refuses_a_negative_seed_in_one_line(tmp_path: Path):
    """numpy's generators take no negative seed: a user's --seed -1 is one error
    line and exit 2, not a traceback from deep in the analysis."""
    import numpy as np

    from tests.duet.test_original import _duet_table

    _duet_table(np.random.default_rng(3), runs=6, slow=1.01).write_parquet(
        tmp_path / "duet-results.parquet"
    )
    for method in ("kernmlops", "original"):
        res = CliRunner().invoke(
            duet_group, ["analyze", str(tmp_path), "--no-mds", "--method", method, "--seed", "-1"]
        )
        assert res.exit_code == 2, res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)
        assert "--seed: must be 0 or more (got -1)" in res.output
        assert not (tmp_path / "report").exists()


def test_aa_naming_no_benchmark_is_said(tmp_path: Path):
    """--aa with a name no benchmark has (a typo) is a warning line, in analyze
    and in process, not a benchmark left as A/B in silence."""
    import numpy as np

    from tests.duet.test_original import _duet_table

    _duet_table(np.random.default_rng(3), runs=6, slow=1.0).write_parquet(
        tmp_path / "duet-results.parquet"
    )
    runner = CliRunner()
    res = runner.invoke(duet_group, ["analyze", str(tmp_path), "--no-mds", "--aa", "mull"])
    assert res.exit_code == 0, res.output
    assert f"warning: --aa mull: no such benchmark in {tmp_path} (benchmarks: mul)" in res.output
    res = runner.invoke(duet_group, ["analyze", str(tmp_path), "--no-mds", "--aa", "mul"])
    assert res.exit_code == 0, res.output
    assert "loops mul [duet]: A/A " in res.output and "warning: --aa" not in res.output

    folder = tmp_path / "original"
    folder.mkdir()
    rows = "0,0,10,10,1,0\n1,10,22,12,1,0\n"
    header = "iteration,iteration_start_ns,iteration_end_ns,iteration_time_ns,epoch_start_ms,"
    for pair in "AB":
        (folder / f"s.b.0.duet.AB.{pair}.harness.csv").write_text(header + "exit_code\n" + rows)
    res = runner.invoke(duet_group, ["process", str(folder), "--aa", "bb", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "warning: --aa bb: no such benchmark in the results (benchmarks: b)" in res.output


def test_no_mds_says_it_was_not_computed(tmp_path: Path):
    """With --no-mds the minimum detectable slowdown is not looked for: neither the
    command's lines nor the report may say it was not found up to the maximum."""
    import numpy as np

    from tests.duet.test_original import _duet_table

    _duet_table(np.random.default_rng(3), runs=10, slow=1.0).write_parquet(
        tmp_path / "duet-results.parquet"
    )
    res = CliRunner().invoke(duet_group, ["analyze", str(tmp_path), "--no-mds"])
    assert res.exit_code == 0, res.output
    assert "minimum detectable slowdown" not in res.output
    duet = json.loads((tmp_path / "report" / "analysis.json").read_text())["benchmarks"][0]
    duet = duet["comparisons"]["duet"]
    assert duet["ratio_ci"] is not None  # an interval, so the MDS could have been searched
    assert duet["mds"] is None and duet["mds_note"] == "not computed (--no-mds)"
    md = (tmp_path / "report" / "report.md").read_text()
    (row,) = [line for line in md.splitlines() if line.startswith("| loops | mul | duet |")]
    assert row.split(" | ")[6] == "–", row  # the MDS column: not "> max"


def test_run_on_a_full_disk_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The index cannot be written after the first trial (ENOSPC): one line naming
    it and exit 2, not a traceback; the index written before it still stands."""
    from kernmlops.duet import runner

    cfg = write_config(
        tmp_path / "duet.yml",
        """
duetbench: {suite: full, duets: [d], duet_repetitions: 2, sequential_repetitions: 0,
            harness: {iterations: 2}}
d: {A: {run: "true"}, B: {run: "true"}}
""",
    )
    real, calls = runner.write_atomic, []

    def fills_up(path: Path, data: str | bytes) -> None:
        calls.append(path)
        if len(calls) > 2:  # the index before the trials, and after the first one
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data)

    monkeypatch.setattr(runner, "write_atomic", fills_up)
    out = tmp_path / "o"
    res = CliRunner().invoke(duet_group, ["run", str(cfg), "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit), res.exception
    assert res.output.endswith(
        f"error: cannot write {out / 'full' / 'duet-run.json'}: the disk is full\n"
    ), res.output
    index = json.loads((out / "full" / "duet-run.json").read_text())
    assert len(index["trials"]) == 1 and index["trials"][0]["sides"]["A"]["status"] == "ok"


def test_process_on_a_full_disk_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """polars' write fails with the disk full: one line and exit 2, not a traceback,
    and no half-written temporary table left in the folder."""
    import polars as pl

    rows = "0,0,10,10,1,0\n1,10,22,12,1,0\n"
    header = "iteration,iteration_start_ns,iteration_end_ns,iteration_time_ns,epoch_start_ms,"
    for pair in "AB":
        (tmp_path / f"s.b.0.duet.AB.{pair}.harness.csv").write_text(header + "exit_code\n" + rows)

    def full(self: pl.DataFrame, f: object = None, **kw: object) -> None:
        raise OSError("No space left on device (os error 28)")  # as polars raises it

    monkeypatch.setattr(pl.DataFrame, "write_csv", full)
    res = CliRunner().invoke(duet_group, ["process", str(tmp_path), "--no-progress"])
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit), res.exception
    assert res.output.endswith(
        f"error: cannot write the tables in {tmp_path}: No space left on device (os error 28)\n"
    ), res.output
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(("sig", "code"), [("SIGHUP", 129), ("SIGTERM", 143)])
def test_run_stopped_by_a_hangup_or_sigterm_ends_cleanly(tmp_path: Path, sig: str, code: int):
    """A hangup (the ssh session lost) stops `duet run` as SIGTERM does: the running
    sides stopped, the index finished, the trial's work folder removed, exit 128 + the
    signal's number (as collect). A hangup used to end the runner at once."""
    import signal
    import subprocess
    import sys
    import time

    from tests.duet.test_runner import _leftovers

    suite = f"hup-{os.getpid()}-{sig}"
    cfg = write_config(
        tmp_path / "duet.yml",
        f"""
duetbench: {{suite: {suite}, duets: [d], duet_repetitions: 2, sequential_repetitions: 0,
            harness: {{iterations: 1}}, timeout: 120}}
d: {{A: {{run: sleep 60}}, B: {{run: sleep 60}}}}
""",
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernmlops", "duet", "run", str(cfg), "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        logs = out / suite / "logs"
        deadline = time.monotonic() + 60
        while not (logs.is_dir() and any(logs.iterdir())):  # the first trial's sides run
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout
            time.sleep(0.1)
        proc.send_signal(getattr(signal, sig))
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, output
    assert "interrupted: the trials run so far are kept" in output
    index = json.loads((out / suite / "duet-run.json").read_text())
    assert index["finished_at"] is not None
    assert not (out / suite / "work").exists()
    assert _leftovers(suite) == []


def test_process_names_a_result_file_no_trial_lists(ran: Path):
    """The trial a run was stopped in leaves its sides' files in results/ and no
    record in duet-run.json: process reads the trials the index has, and names
    that file rather than leaving it out in silence."""
    (suite,) = [p for p in ran.iterdir() if (p / "duet-run.json").is_file()]
    listed = sorted((suite / "results").iterdir())
    stopped = suite / "results" / listed[0].name.replace(".0.", ".9.", 1)
    shutil.copyfile(listed[0], stopped)
    res = CliRunner().invoke(duet_group, ["process", str(ran), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert (
        f"warning: {stopped}: no trial in duet-run.json names it (the run was stopped "
        "during its trial?): not read" in " ".join(res.output.split())
    ), res.output
    assert f"from {len(listed)} file(s)" in res.output
