"""--max-label-sets (root + BPF): a ceiling over every set, the sets whose file
says more (syscalls_comm: 20,000) too."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.exporter.cli import export_command
from kernmlops.exporter.config import resolve_sets
from kernmlops.exporter.core import DEFAULT_MAX_LABEL_SETS, Exporter
from tests.exporter.test_exporter_bpf import get, parse
from tests.exporter.test_jobs_bpf import start_exporter, stop

pytestmark = pytest.mark.bpf

NAMES = 80  # thread names, each calling getppid: 80 label sets and more


def _names() -> None:
    code = f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        for i in range({NAMES}):
            assert libc.prctl(15, f"kmo-lim{{i}}".encode(), 0, 0, 0) == 0  # PR_SET_NAME
            libc.getppid()
    """
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True)


def test_max_label_sets_is_a_ceiling_over_every_set(tmp_path: Path) -> None:
    """`--max-label-sets 50`: syscalls_comm, whose file says 20,000, serves 50 label
    sets per metric too (it served 730), and counts the others as left out."""
    exporter, url = start_exporter(
        tmp_path, "-c", "syscalls_comm", "-c", "syscalls", "--max-label-sets", "50"
    )
    try:
        _names()
        samples = parse(get(url))
    finally:
        stop(exporter)
    by_comm = [lab for (n, lab) in samples if n == "kernmlops_syscalls_by_comm_total"]
    assert len(by_comm) == 50
    dropped = {
        dict(lab)["metric"]: v
        for (n, lab), v in samples.items()
        if n == "kernmlops_exporter_label_sets_dropped" and dict(lab)["set"] == "syscalls_comm"
    }
    assert dropped["kernmlops_syscalls_by_comm_total"] >= NAMES - 50
    by_nr = [lab for (n, lab) in samples if n == "kernmlops_syscalls_total"]
    assert 0 < len(by_nr) <= 50


@pytest.mark.parametrize(
    ("flag", "by_comm", "by_nr"),
    [
        (None, 20_000, DEFAULT_MAX_LABEL_SETS),  # each set's own, else the default
        (50, 50, 50),
        (15_000, 15_000, 15_000),
        (30_000, 20_000, 30_000),  # the set's own is lower: kept
    ],
)
def test_limit_of_each_metric(flag: int | None, by_comm: int, by_nr: int) -> None:
    exporter = Exporter(resolve_sets(["syscalls_comm", "syscalls"]), max_label_sets=flag)
    try:
        exporter.start()
        limits = {m.spec.name: m.max_label_sets for s in exporter.sets for m in s.metrics}
    finally:
        exporter.close()
    assert limits["kernmlops_syscalls_by_comm_total"] == by_comm
    assert limits["kernmlops_syscall_errors_by_comm_total"] == by_comm
    assert limits["kernmlops_syscalls_total"] == by_nr


def test_help_says_it_is_a_ceiling() -> None:
    out = CliRunner().invoke(export_command, ["--help"]).output
    assert "a ceiling over every set's own max_label_sets" in " ".join(out.split())
