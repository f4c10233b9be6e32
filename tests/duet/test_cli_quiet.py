"""The test of test_cli.py that asserts something of time (``quiet``: the main lane,
tests/lanes.py), apart from the others so that those run beside it. Its run (``ran``,
tests/duet/conftest.py) is made in this module, alone on the machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.duet.cli import duet_group


@pytest.mark.quiet  # its verdicts compare the sleeps' measured times (the run is made here)
def test_run_process_analyze(ran: Path):
    runner = CliRunner()
    out = ran
    suite = out / f"cli-{os.getpid()}"
    index = json.loads((suite / "duet-run.json").read_text())
    assert index["seed"] == 3 and len(index["trials"]) == 9
    assert index["artifacts"]["python"]["error"] is None
    assert (suite / "artifacts" / "python").read_text().startswith("Python 3")

    res = runner.invoke(duet_group, ["analyze", str(out)])  # before process: what it finds
    assert res.exit_code == 2 and res.output == (
        f"error: {out}: no duet-results.parquet: run `kernmlops duet process {out}` first "
        "(it finds 96 iterations in 12 result file(s))\n"
    )
    res = runner.invoke(duet_group, ["process", str(out)])
    assert res.exit_code == 0, res.output
    assert "96 iterations from 12 file(s), 1 benchmark(s)" in res.output
    assert (out / "duet-results.parquet").exists() and (out / "duet-results.csv").exists()

    res = runner.invoke(duet_group, ["analyze", str(out), "--warmup", "1", "--min-runs", "3"])
    assert res.exit_code == 0, res.output
    # B sleeps 5/3 as long (plus the same start-up cost): every comparison sees it, and
    # the iterations still overlap by 40% of the longer one (B 5x as long never pairs)
    # 3 runs of each kind, --min-runs 3: a verdict, its CI's unit named beside it
    assert f"cli-{os.getpid()} sleepy [duet]: B is slower than A by" in res.output
    assert "[sequential]: B is slower than A by" in res.output
    assert res.output.count("(95% CI over 3 runs, Welch's t)") == 2
    report = out / "report"
    md = (report / "report.md").read_text()
    assert "## Verdicts" in md and "plots/ci.png" in md and "timeline.png" in md
    html = (report / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3 and "<table>" in html
    summary = json.loads((report / "analysis.json").read_text())
    duet = summary["benchmarks"][0]["comparisons"]["duet"]
    assert 1.1 < duet["gm_ratio"] < 3 and duet["ratio_ci"][0] > 1
