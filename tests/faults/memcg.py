"""A memory-limited cgroup to run a collection in (v2 where the memory controller is
there, else v1's memory hierarchy)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path


def _v2_root() -> Path | None:
    from kernmlops.host.cgroup import cgroup2_mount

    root = cgroup2_mount()
    if root and "memory" in (root / "cgroup.subtree_control").read_text().split():
        return root
    return None


@contextlib.contextmanager
def memory_limited(limit_bytes: int) -> Iterator[list[str]]:
    """A fresh memory cgroup; yields the argv prefix that runs a command inside it."""
    name = f"kmo-fault-{uuid.uuid4().hex[:8]}"
    v2 = _v2_root()
    if v2 is not None:
        path = v2 / name
        path.mkdir()
        (path / "memory.max").write_text(str(limit_bytes))
        (path / "memory.swap.max").write_text("0")
    else:
        path = Path("/sys/fs/cgroup/memory") / name
        path.mkdir()
        (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        swap = path / "memory.memsw.limit_in_bytes"
        if swap.exists():
            swap.write_text(str(limit_bytes))
    enter = ["sh", "-c", f'echo $$ > "{path}/cgroup.procs" && exec "$@"', "memcg"]
    try:
        yield enter
    finally:
        for _ in range(100):
            with contextlib.suppress(OSError):
                os.rmdir(path)
                break
            time.sleep(0.1)
