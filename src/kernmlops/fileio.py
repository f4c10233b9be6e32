"""Files written whole: a reader (or a collector killed mid-write) sees the old
content or the new one, never half of one."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | Path, data: bytes | str, *, durable: bool = False) -> Path:
    """Write ``data`` (str as UTF-8) to a temporary name beside ``path``, then rename it
    over ``path``. ``durable`` also syncs the file before and the folder after the
    rename, so the new content survives a crash of the machine. The temporary file is
    removed if anything fails; the error (an OSError) is the caller's to report."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per writing process
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself
        finally:
            os.close(fd)
    return path
