"""What a local user does beside root: run a step as nobody, in a forked child, in a
folder every user can reach (for the tests of hostile plants)."""

from __future__ import annotations

import os
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import skip_here

NOBODY = 65534


def as_nobody(step: Callable[[], None]) -> None:
    """Run ``step`` as nobody (uid and gid 65534, no groups) in a forked child; its
    failure fails the test."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            step()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the step as nobody failed"


@contextmanager
def reachable_folder(prefix: str) -> Iterator[Path]:
    """A new folder of root's, mode 0755, that nobody can reach (pytest's own folders
    are root's only); removed after. Needs root (skip_here: CI has it)."""
    if os.geteuid() != 0:
        skip_here("plants files as another user: needs root")
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
