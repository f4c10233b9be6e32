"""collapse_huge_pages: transparent huge page collapses, and the ranges
processes give to madvise and munmap.

Two tables:

* ``collapse_huge_pages``, one row per huge_memory tracepoint hit — fired by
  khugepaged, and by ``madvise(MADV_COLLAPSE)`` in the calling thread:
  ``kind`` (``scan_pmd``, ``isolate``, ``collapse``, ``swapin``,
  ``scan_file``, ``collapse_file``), ``result`` (the kernel's ``scan_result``
  name: ``succeed``, ``pmd_mapped``, ``exceed_none_pte``, …), ``tgid`` (the
  process whose memory it is, from ``mm->owner``; 0 where the kernel has no
  owner field), ``actor_pid`` / ``actor_tgid`` / ``actor_comm`` (the thread
  doing the work), ``mm`` (joins the rows of one address space), ``pfn``,
  ``address`` / ``file_index`` / ``is_shmem`` / ``nr`` / ``filename`` (file
  collapses), and the tracepoints' counters ``referenced``, ``none_or_zero``,
  ``unmapped``, ``isolated``, ``swapped_in``, ``present``, ``swap`` (0 where a
  kind has none). An ``isolate`` row is written with the ``collapse`` row that
  follows it in the same call (its tracepoint names no mm).
* ``madvise_munmap``, one row per call entry: ``syscall`` (``madvise`` or
  ``munmap``), ``start``, ``length_bytes``, ``advice`` (-1 for munmap) and
  ``advice_name``, ``pid``, ``tgid``. The calls come from the
  ``syscalls/sys_enter_madvise`` and ``sys_enter_munmap`` tracepoints where
  the kernel has them (status variant ``syscalls``): they cost nothing on
  other syscalls. Otherwise (or with ``syscall_tracepoints: false``) they are
  picked out of raw_syscalls ``sys_enter`` in the kernel by this
  architecture's syscall numbers (64-bit ABI; variant ``btf`` or ``raw``),
  which costs a few tens of ns on every syscall of the machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from kernmlops.ebpf.objects import BpfObject
from kernmlops.errors import HookUnavailable
from kernmlops.hooks.bpf import BpfHook, BpfHookOptions
from kernmlops.syscall_names import syscall_table

COLLAPSE_TABLE = "collapse_huge_pages"
RANGES_TABLE = "madvise_munmap"
SYSCALLS = ("madvise", "munmap")
TRACEFS = Path("/sys/kernel/tracing")
#: programs of each way to see the syscalls (bpf/collapse_huge_pages.bpf.c)
TRACEPOINT_PROGRAMS = frozenset({"madvise_enter", "munmap_enter"})
RAW_SYSCALLS_PROGRAMS = frozenset({"madvise_munmap_btf", "madvise_munmap_raw"})


def syscall_tracepoints_exist() -> bool:
    """Whether this kernel has syscalls/sys_enter_madvise and _munmap (False where
    tracefs cannot be read: a user who is not root, e.g. `kernmlops doctor`)."""
    try:
        return all((TRACEFS / "events/syscalls" / f"sys_enter_{s}").is_dir() for s in SYSCALLS)
    except PermissionError:
        return False


def syscall_numbers() -> dict[str, int]:
    """This architecture's numbers of madvise and munmap."""
    by_name = {name: nr for nr, name in syscall_table().items()}
    missing = [s for s in SYSCALLS if s not in by_name]
    if missing:
        raise HookUnavailable(
            f"no syscall number for {', '.join(missing)} "
            "(needs the kernel's uapi headers: apt-get install linux-libc-dev)"
        )
    return {s: by_name[s] for s in SYSCALLS}


class CollapseHugePagesOptions(BpfHookOptions):
    syscall_tracepoints: bool = Field(
        True,
        description=(
            "see madvise/munmap through their own syscalls tracepoints where the kernel "
            "has them; false: through raw_syscalls sys_enter (runs on every syscall)"
        ),
    )


class CollapseHugePagesHook(BpfHook[CollapseHugePagesOptions]):
    """khugepaged scans and collapses; madvise and munmap ranges."""

    name: ClassVar[str] = "collapse_huge_pages"
    object_name: ClassVar[str] = "collapse_huge_pages"
    # Drop slot 0: the huge_memory events, slot 1: the syscall ranges.
    rings: ClassVar[dict[str, str]] = {
        COLLAPSE_TABLE: "collapse_huge_pages_rb",
        RANGES_TABLE: "madvise_munmap_rb",
    }
    needs: ClassVar[tuple[str, ...]] = ("tracepoint", "tp_btf|raw_tp", "ringbuf", "task_storage")

    def _use_tracepoints(self) -> bool:
        return self.options.syscall_tracepoints and syscall_tracepoints_exist()

    def extra_globals(self) -> dict[str, int | bool]:
        try:
            nrs = syscall_numbers()
        except HookUnavailable:
            if self._use_tracepoints():  # the numbers only steer raw_syscalls
                return {}
            raise
        return {"kmo_nr_madvise": nrs["madvise"], "kmo_nr_munmap": nrs["munmap"]}

    def attach(self, obj: BpfObject) -> None:
        """The huge_memory programs, and one of the two ways to see the syscalls."""
        tracepoints = self._use_tracepoints()
        skip = RAW_SYSCALLS_PROGRAMS if tracepoints else TRACEPOINT_PROGRAMS
        progs = [p for p in obj.programs.values() if p.autoload and p.name not in skip]
        for prog in progs:
            prog.attach()
        self.status.variant = "syscalls" if tracepoints else obj.variant
        self.status.programs = [p.section for p in progs]
