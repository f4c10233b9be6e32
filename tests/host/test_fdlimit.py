"""host.fdlimit: the soft open-file limit raised to the hard one."""

from __future__ import annotations

import subprocess
import sys


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    # In a child: the test process keeps its own limits. The kernel's getrlimit is
    # the independent reading of what was set.
    script = (
        "import resource\n"
        "from kernmlops.host.fdlimit import raise_fd_limit\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(64, hard), hard))\n"
        "got = raise_fd_limit()\n"
        "print(got, *resource.getrlimit(resource.RLIMIT_NOFILE), hard)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got, soft, hard_now, hard = (int(x) for x in done.stdout.split())
    assert got == soft == hard_now == hard
