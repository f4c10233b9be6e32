"""Helpers for the duet tests: a CPU-bound C loop, a config writer, and a run of a
small duet that the tests of ``kernmlops duet`` read (``ran``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

LOOP_C = r"""
#include <stdlib.h>
/* CPU-bound: argv[1] iterations of a multiply-add the compiler cannot drop. */
int main(int argc, char **argv) {
	unsigned long n = argc > 1 ? strtoul(argv[1], 0, 10) : 1000000;
	volatile unsigned long x = 0;
	for (unsigned long i = 0; i < n; i++)
		x += i * i;
	return 0;
}
"""


@pytest.fixture(scope="session")
def loop_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A compiled CPU-bound loop: ``loop N`` does N multiply-adds."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler (cc, gcc or clang) is needed to build the test workload"
    folder = tmp_path_factory.mktemp("loop")
    (folder / "loop.c").write_text(LOOP_C)
    subprocess.run([cc, "-O2", "-o", str(folder / "loop"), str(folder / "loop.c")], check=True)
    return folder / "loop"


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


SWAP = """#!/bin/sh
# the user renames the suite's folder away (once) and makes another in its place
[ -e {out}/moved ] && exit 0
exec setpriv --reuid=65534 --regid=65534 --clear-groups sh -c '
    mv {out}/{suite} {out}/moved && mkdir {out}/{suite} || exit 1
    [ -z "{plant}" ] && exit 0
    mkdir {out}/{suite}/logs  # each log by its name, a link to the file planted
    for f in {out}/moved/logs/*; do ln -s "{plant}" {out}/{suite}/logs/"${{f##*/}}"; done'
"""

SWAPPED = """
duetbench:
  suite: {suite}
  duet_repetitions: 2
  harness: {{iterations: 2}}
  duets: [d]
d:
  A: {{run: {swap}}}
  B: {{run: sleep 0.01}}
"""


def swapping_config(tmp_path: Path, out: Path, plant: Path | None = None) -> Path:
    """A suite whose side A, in the first trial, moves the suite's folder away and
    makes another under its name, as a user may in their own output folder (with
    ``plant``: holding, under each log's name, a link to that file)."""
    suite = f"swap-{os.getpid()}"
    swap = tmp_path / "swap.sh"
    swap.write_text(SWAP.format(out=out, suite=suite, plant=plant or ""))
    swap.chmod(0o755)
    return write_config(tmp_path / "duet.yml", SWAPPED.format(suite=suite, swap=swap))


#: the duet of ``kernmlops duet run`` that test_cli.py and test_cli_quiet.py share
CFG = """
duetbench:
  suite: cli-{pid}
  duet_repetitions: 3
  sequential_repetitions: 3
  harness: {{iterations: 8}}
  artifacts: {{python: python3 --version}}
  duets: [sleepy]
sleepy:
  A: {{run: sleep 0.03}}
  B: {{run: sleep 0.05}}
"""


@pytest.fixture(scope="module")
def _ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The outdir of one ``duet run`` of CFG (seed 3), unprocessed: a run of its nine
    trials costs seconds, and the tests of a module that only read one share it (see
    ``ran``). One a module: test_cli_quiet.py's, whose verdicts compare the sleeps'
    measured times, is made in that module, in the main lane's quiet part."""
    from click.testing import CliRunner

    from kernmlops.duet.cli import duet_group

    tmp = tmp_path_factory.mktemp("duet-cli-run")
    cfg = write_config(tmp / "duet.yml", CFG.format(pid=os.getpid()))
    out = tmp / "out"
    res = CliRunner().invoke(duet_group, ["run", str(cfg), "--outdir", str(out), "--seed", "3"])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture
def ran(_ran: Path, tmp_path: Path) -> Path:
    """This test's own copy of the shared run's outdir (what it writes there, it alone
    sees), in a folder of its own beside ``tmp_path``'s other files."""
    copy = tmp_path / "ran" / "out"
    shutil.copytree(_ran, copy, symlinks=True)
    return copy
