"""Disk space as the collector sees it: the free bytes of a file system, a write that
failed for want of space, and sizes written for people. The bottom of ``collect/``:
the output check, the Parquet writer, compaction and the session's space watch all
ask the same questions the same way."""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["free_bytes", "human_bytes", "is_disk_full"]

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(err: BaseException) -> bool:
    """A write failed for want of space (pyarrow's errors carry the errno in the text)."""
    while err is not None:
        if isinstance(err, OSError) and (
            err.errno in _DISK_FULL
            or "No space left on device" in str(err)
            or "Disk quota exceeded" in str(err)
        ):
            return True
        err = err.__cause__  # type: ignore[assignment]
    return False


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s file system."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def human_bytes(n: int | None) -> str:
    """confined.human_size's words, "unknown" for None."""
    from kernmlops.confined import human_size

    return "unknown" if n is None else human_size(n)
