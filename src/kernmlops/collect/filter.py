"""The in-kernel process filter: a map of tracked tgids shared by every hook.

The filter object owns the map and, in tree mode, adds each child process of
a tracked process from the fork tracepoint, before the child first runs, and
removes it when the process is freed after it was reaped. A new process
outside the tree that reuses a reaped tracked process's pid removes that tgid
(in either mode): the pid is no longer the traced one's.
Every hook object reuses the map's fd, so one seed steers all hooks.
"""

from __future__ import annotations

from pathlib import Path

from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.objects import BpfObject, open_and_load

MAP_NAME = "kmo_tracked"


class ProcessFilter:
    """Trace only the tgids added here (and, with ``follow_children``, their descendants)."""

    def __init__(self, *, follow_children: bool, bpf_dir: Path | None = None) -> None:
        self.follow_children = follow_children
        self._obj: BpfObject | None = open_and_load(
            object_path("filter", bpf_dir), globals_={"kmo_follow_children": follow_children}
        )
        self._obj.attach_all()
        self._map = self._obj.map(MAP_NAME)

    @property
    def fd(self) -> int:
        return self._map.fd

    @property
    def mode(self) -> str:
        return "tree" if self.follow_children else "tgid"

    def add(self, tgid: int) -> None:
        # 0 for the start time: kept while the collection runs (the kernel's
        # entries leave when their process is freed)
        self._map.update(tgid, bytes(8))

    def tracked(self) -> set[int]:
        return {int.from_bytes(k, "little") for k in self._map}

    def close(self) -> None:
        if self._obj is not None:
            self._obj.close()
            self._obj = None
