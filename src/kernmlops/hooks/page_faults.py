"""page_faults: user and kernel page faults (x86 exceptions tracepoints).

One row per fault: address, ip, error code, pid, tgid, cpu, kind (user or
kernel). With ``sample_every`` N > 1 the kernel keeps one fault in N (counted
per CPU over the traced tasks), so each row stands for N faults; the exact
counts, by kind, are kept in the manifest (``hooks.page_faults.counters``:
``faults``, ``faults_user``, ``faults_kernel``).

Those counts are of every traced task. With ``count_by_tgid`` the kernel also
counts each process's faults (exact, sampled rows or not); the hook writes them
at the end as the table ``page_fault_counts`` (tgid, faults_user, faults_kernel),
so a part of the traced tasks (duet's sides) has exact counts too. A process the
kernel's map had no room for (more than TGID_ENTRIES) is counted in the manifest
(``faults_not_by_tgid``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from kernmlops.hooks.bpf import BpfHook, BpfHookOptions

if TYPE_CHECKING:
    from kernmlops.tables import Rows

TABLE = "page_faults"
#: the table of each process's exact counts (with count_by_tgid)
COUNTS_TABLE = "page_fault_counts"
#: processes page_faults_by_tgid holds (a hash entry is ~100 bytes: ~1.6 MiB)
TGID_ENTRIES = 16384
#: the manifest's counter of faults page_faults_by_tgid had no room for
COUNTER_NOT_BY_TGID = "faults_not_by_tgid"
#: the manifest's counters (hooks.page_faults.counters): every fault of the traced
#: tasks, and those of each kind (the table's ``kind`` values)
COUNTER_ALL = "faults"
KINDS = ("user", "kernel")  # the C enum page_fault_kind's order
#: struct page_faults_seen_value (a u64 per kind, then not_by_tgid), one per CPU
SEEN = struct.Struct("<" + "Q" * (len(KINDS) + 1))
#: struct page_faults_tgid_value: a u64 per kind
BY_TGID = struct.Struct("<" + "Q" * len(KINDS))


def kind_counter(kind: str) -> str:
    """The manifest counter of faults of ``kind`` ("user" or "kernel")."""
    return f"{COUNTER_ALL}_{kind}"


class PageFaultsOptions(BpfHookOptions):
    sample_every: int = Field(
        1, ge=1, le=1 << 30, description="keep one fault in N per CPU (1: every fault)"
    )
    count_by_tgid: bool = Field(
        False,
        description=(
            f"also count every fault of each process, exact however sampled (table "
            f"{COUNTS_TABLE}: tgid, faults_user, faults_kernel; up to {TGID_ENTRIES:,} "
            "processes); costs a hash update per fault"
        ),
    )


class PageFaultsHook(BpfHook[PageFaultsOptions]):
    """Page faults of the traced tasks, all or 1 in ``sample_every``."""

    name: ClassVar[str] = "page_faults"
    object_name: ClassVar[str] = "page_faults"
    rings: ClassVar[dict[str, str]] = {TABLE: "page_faults_rb"}

    # page_faults itself comes from the ring, page_fault_counts at the end
    tables: ClassVar[tuple[str, ...]] = (TABLE, COUNTS_TABLE)
    # final_rows adds a table from a map; the ring's rows still go by the spool
    spoolable: ClassVar[bool] = True

    def written_tables(self) -> tuple[str, ...]:
        return (TABLE, COUNTS_TABLE) if self.options.count_by_tgid else (TABLE,)

    def extra_globals(self) -> dict[str, int | bool]:
        return {
            "sample_every": self.options.sample_every,
            "count_by_tgid": self.options.count_by_tgid,
        }

    def extra_max_entries(self) -> dict[str, int]:
        return {"page_faults_by_tgid": TGID_ENTRIES if self.options.count_by_tgid else 1}

    def _seen(self) -> list[int]:
        """page_faults_seen summed over CPUs: a count per kind, then not_by_tgid."""
        if self.obj is None:
            return [0] * SEEN.size
        # no numpy, as percpu_total: read at close, where drops are
        raw = self.obj.map("page_faults_seen").lookup(0) or b""
        totals = [sum(col) for col in zip(*SEEN.iter_unpack(raw), strict=True)]
        return totals or [0] * (len(KINDS) + 1)

    def faults_by_kind(self) -> dict[str, int]:
        """Faults of the traced tasks so far, sampled or not, by kind."""
        return dict(zip(KINDS, self._seen()[: len(KINDS)], strict=True))

    def faults_by_tgid(self) -> dict[int, dict[str, int]]:
        """Each process's faults so far, by kind (empty unless count_by_tgid)."""
        if self.obj is None or not self.options.count_by_tgid:
            return {}
        return {
            int.from_bytes(key, "little"): dict(zip(KINDS, BY_TGID.unpack(value), strict=True))
            for key, value in self.obj.map("page_faults_by_tgid").items()
        }

    def final_rows(self) -> Iterator[tuple[str, Rows]]:
        yield from super().final_rows()
        if not self.options.count_by_tgid or self.obj is None:
            return
        import pyarrow as pa

        counts = sorted(self.faults_by_tgid().items())
        yield (
            COUNTS_TABLE,
            pa.table(
                {
                    "tgid": pa.array([t for t, _ in counts], pa.uint32()),
                    **{
                        kind_counter(k): pa.array([c[k] for _, c in counts], pa.uint64())
                        for k in KINDS
                    },
                }
            ),
        )

    def faults_seen(self) -> int:
        """Faults of the traced tasks so far, sampled or not."""
        return sum(self.faults_by_kind().values())

    def counters(self) -> dict[str, int]:
        # exact where the rows are 1 in sample_every (or fewer, where some dropped)
        seen = self._seen()  # one read of the map for every counter
        by_kind = dict(zip(KINDS, seen[: len(KINDS)], strict=True))
        out = {
            COUNTER_ALL: sum(by_kind.values()),
            **{kind_counter(k): n for k, n in by_kind.items()},
        }
        if self.options.count_by_tgid:
            out[COUNTER_NOT_BY_TGID] = seen[len(KINDS)]
        return out
