"""The process's open-file limit (RLIMIT_NOFILE), raised where a reader holds many files.

Debian and Ubuntu start every login with a soft limit of 1,024 descriptors and a hard
one hundreds of times larger; the soft one is a guard for programs that use select(2),
which kernmlops does not. A lazy read of a fleet holds one descriptor per Parquet part
until it is collected (parts are opened once and scanned through their descriptors, so
no name is opened again), and the exporter one per connection: both raise the soft
limit to the hard one first, as Go programs do at start.
"""

from __future__ import annotations

import contextlib
import resource


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft
