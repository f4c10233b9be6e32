"""The in-kernel process filter (collect/filter.py): which tgids its map holds."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from kernmlops.ebpf.build import build
from tests.hooks.conftest import build_c

pytestmark = pytest.mark.bpf  # root: it loads and attaches a BPF program

FORKS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/wait.h>

/* After a line on stdin: fork N children one after the other, each exiting at
 * once and reaped; print their pids, then wait for another line. */
int main(int argc, char **argv)
{
	char line[16];

	if (!fgets(line, sizeof(line), stdin))
		return 2;
	for (int i = 0; i < atoi(argv[1]); i++) {
		pid_t pid = fork();

		if (pid == 0)
			_exit(0);
		if (pid < 0 || waitpid(pid, NULL, 0) != pid)
			return 3;
		printf("%d\n", pid);
	}
	fflush(stdout);
	close(1);
	return fgets(line, sizeof(line), stdin) ? 0 : 2;
}
"""


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "forks", FORKS)


def test_a_reaped_child_leaves_the_map(forks: Path) -> None:
    """The map holds the tree's live processes, not every process it ever had: a
    build forks more processes than the map's 65,536 entries, and a child that
    finds the map full is not traced. Each child the kernel added is removed once
    reaped and freed (300 forked, at most a tenth still waiting to be freed); the
    process user space added stays while it lives."""
    from kernmlops.collect.filter import ProcessFilter

    build()
    flt = ProcessFilter(follow_children=True)
    proc = subprocess.Popen([str(forks), "300"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdin is not None and proc.stdout is not None
        flt.add(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        children = {int(p) for p in proc.stdout.read().split()}
        assert len(children) == 300
        # A task is freed by an RCU callback after it was reaped: most within
        # moments, a few much later on a busy machine (lazy RCU, callback threads
        # waiting for a CPU); their entries leave then.
        deadline = time.monotonic() + 30
        while len((tracked := flt.tracked()) & children) > 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.pid in tracked
        assert len(tracked & children) <= 30, sorted(tracked & children)[:10]
        proc.stdin.write("end\n")
        proc.stdin.flush()
        assert proc.wait() == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        flt.close()
