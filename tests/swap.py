"""A file swapped for a FIFO right after a reader looked at it: the race of a
reader that checks a name (``os.stat``) and then opens it again by that name.

:func:`swap_after_look` puts a FIFO at ``path`` as soon as the code under test has
looked at it (its ``n``-th ``os.stat``, or its first ``os.open``, of that name):
code that reads what it checked reads the file; code that opens the name again
opens the FIFO and waits for a writer. :func:`within` runs the call in a thread and,
when it is still waiting after the timeout, gives that FIFO a writer that closes at
once (so the test ends, failed, rather than hangs).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


class Swap:
    def __init__(self, path: Path) -> None:
        self.path = os.path.abspath(path)
        self.swapped = False

    def is_ours(self, p: object) -> bool:
        return isinstance(p, (str, os.PathLike)) and os.path.abspath(os.fspath(p)) == self.path

    def now(self) -> None:
        if self.swapped:
            return
        self.swapped = True
        fifo = f"{self.path}.fifo"
        os.mkfifo(fifo)
        os.rename(fifo, self.path)  # at once: no moment without the name


def swap_after_look(monkeypatch: pytest.MonkeyPatch, path: Path, *, stats: int | None = 1) -> Swap:
    """After the ``stats``-th ``os.stat`` of ``path`` (None: none counts), or its first
    ``os.open`` (by its name, or by its folder's descriptor and its name)."""
    swap = Swap(path)
    real_stat, real_open = os.stat, os.open
    seen = [0]

    def stat(p: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        st = real_stat(p, *args, **kwargs)
        if swap.is_ours(p) and kwargs.get("dir_fd") is None:
            seen[0] += 1
            if stats is not None and seen[0] >= stats:
                swap.now()
        return st

    def open_(p: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real_open(p, flags, *args, **kwargs)
        at = kwargs.get("dir_fd")
        if swap.is_ours(p if at is None else os.path.join(os.readlink(f"/proc/self/fd/{at}"), p)):
            swap.now()
        return fd

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "open", open_)
    return swap


def within(call: Callable[[], Any], fifo: Path, timeout: float = 60) -> Any:
    """``call()``'s value (or its exception, raised here), failing the test when it is
    still waiting on ``fifo`` after ``timeout`` seconds (long: a reader that does not
    wait may still take seconds in CI's idle lane)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as err:  # handed to the test's thread
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        # a writer that closes at once: the reader sees the end and returns
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
        pytest.fail(f"waited over {timeout:g} s on the FIFO at {fifo}")
    if "error" in out:
        raise out["error"]
    return out["value"]
