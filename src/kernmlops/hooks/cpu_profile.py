"""cpu_profile: cpu-clock samples on every CPU with kernel and user stacks.

One row per sample: ``ts_uptime_us``, ``cpu``, ``pid``, ``tgid``, ``comm``,
``kernel_stack_id`` / ``user_stack_id`` (ids in the stack map, or -errno:
-14 no such stack, -17 the map's bucket held another stack), and the stacks
symbolized, leaf first: ``kernel_stack`` (``func+0x1f``, ``func+0x1f [module]``
for module symbols, hex where kallsyms has none) and ``user_stack``
(``func+0x1f (/path/of/module)`` where the module's ELF symbols cover the
address, else ``/path/of/module+0x29d90`` — the offset in the file — and hex
where no mapping holds it). :func:`folded` turns the table into folded stacks
for flame graph tools.

Each new stack is read from the stack map once and cached; user stacks are
symbolized at the first poll that drains them, with ``/proc/<tgid>/maps`` as
it is then, so the process must still live (a poll is every 10 ms; a
process gone by then keeps the maps of its last batch, if any; a stack taken
before an exec and drained after it is symbolized with the new image's maps).
Rows are emitted every EMIT_INTERVAL_S, not at every poll.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from kernmlops.ebpf.btf import RecordLayout
from kernmlops.ebpf.frames import records_to_frame
from kernmlops.ebpf.objects import BpfObject
from kernmlops.ebpf.perf_open import PERF_TYPE_SOFTWARE, SW_CPU_CLOCK, perf_event_open
from kernmlops.hooks.base import HookOptions
from kernmlops.hooks.bpf import BpfHook, BpfHookOptions
from kernmlops.host import kallsyms
from kernmlops.host.cpus import online_cpus
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
else:
    np = lazy_import("numpy")
    pl = lazy_import("polars")


TABLE = "cpu_profile"
DEBUG_DIR = Path("/usr/lib/debug/.build-id")
#: How often the table is built from the samples drained since (seconds).
EMIT_INTERVAL_S = 0.5


def _lookup_ips(ips: np.ndarray) -> np.ndarray:
    """Addresses to look symbols up at: each frame but the first is a return
    address, one past its call, which may be the first byte of the next function."""
    out = ips.astype(np.uint64, copy=True)
    out[1:] -= 1
    return out


# --- kernel -----------------------------------------------------------------------
class KernelSymbols(kallsyms.KernelSymbols):
    """/proc/kallsyms' text symbols (kernmlops.host.kallsyms), looked up a stack at a
    time with numpy."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._sorted = np.array(self.addrs, dtype=np.uint64)

    def frames(self, ips: np.ndarray) -> list[str]:
        """``func+0xoff`` per address, ``[module]`` after module symbols (hex where no
        symbol precedes it)."""
        ips = np.asarray(ips, dtype=np.uint64)
        if not len(self.addrs):
            return [f"{ip:#x}" for ip in ips.tolist()]
        idx = np.searchsorted(self._sorted, _lookup_ips(ips), side="right") - 1
        out = []
        for ip, i in zip(ips.tolist(), idx.tolist(), strict=True):
            if i < 0:
                out.append(f"{ip:#x}")
            else:
                module = self.modules[i]
                where = f" [{module}]" if module else ""
                out.append(f"{self.names[i]}+{ip - self.addrs[i]:#x}{where}")
        return out


# --- user ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcMaps:
    """One process's mappings, sorted by start."""

    starts: np.ndarray
    ends: np.ndarray
    offsets: np.ndarray
    inodes: np.ndarray
    paths: list[str]

    @classmethod
    def parse(cls, text: str) -> ProcMaps:
        rows = []
        for line in text.splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) < 5:
                continue
            start, _, end = parts[0].partition("-")
            path = parts[5] if len(parts) > 5 else ""
            rows.append((int(start, 16), int(end, 16), int(parts[2], 16), int(parts[4]), path))
        rows.sort()
        return cls(
            np.array([r[0] for r in rows], dtype=np.uint64),
            np.array([r[1] for r in rows], dtype=np.uint64),
            np.array([r[2] for r in rows], dtype=np.uint64),
            np.array([r[3] for r in rows], dtype=np.uint64),
            [r[4] for r in rows],
        )

    @classmethod
    def read(cls, tgid: int) -> ProcMaps | None:
        try:
            return cls.parse(Path(f"/proc/{tgid}/maps").read_text())
        except OSError:  # gone, or not ours to read
            return None

    def locate(self, ips: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mapping index per address (-1: none) and the address's offset in the file."""
        idx = np.searchsorted(self.starts, ips, side="right") - 1
        safe = np.maximum(idx, 0)
        inside = (idx >= 0) & (ips < self.ends[safe]) if len(self.starts) else idx < -1
        idx = np.where(inside, idx, -1)
        file_off = ips - self.starts[safe] + self.offsets[safe] if len(self.starts) else ips
        return idx, file_off


def _sym_dtype(elfclass: int, little: bool) -> np.dtype:
    """Elf32_Sym / Elf64_Sym as numpy sees them (the ELF spec's field order)."""
    e = "<" if little else ">"
    if elfclass == 64:
        fields = [
            ("st_name", f"{e}u4"),
            ("st_info", "u1"),
            ("st_other", "u1"),
            ("st_shndx", f"{e}u2"),
            ("st_value", f"{e}u8"),
            ("st_size", f"{e}u8"),
        ]
    else:
        fields = [
            ("st_name", f"{e}u4"),
            ("st_value", f"{e}u4"),
            ("st_size", f"{e}u4"),
            ("st_info", "u1"),
            ("st_other", "u1"),
            ("st_shndx", f"{e}u2"),
        ]
    return np.dtype(fields)


_STT_FUNC, _STT_GNU_IFUNC = 2, 10


class ElfSymbols:
    """Function symbols of one ELF file (.symtab, else .dynsym; a debug file found
    by build id in /usr/lib/debug when there is one), addressed by file offset.

    pyelftools finds the sections; the symbol table itself is decoded in one
    numpy call (iterating it symbol by symbol costs ~0.1 ms each: seconds for
    a large library), and names are read from the string table only for the
    symbols a lookup hits."""

    def __init__(self, path: str | Path) -> None:
        from elftools.elf.elffile import ELFFile

        self.segments: list[tuple[int, int, int]] = []  # (p_offset, p_vaddr, p_filesz)
        self.addrs = np.zeros(0, dtype=np.uint64)
        self.sizes = np.zeros(0, dtype=np.uint64)
        self._name_offsets = np.zeros(0, dtype=np.uint32)
        self._strtab = b""
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            for seg in elf.iter_segments():
                if seg["p_type"] == "PT_LOAD":
                    self.segments.append((seg["p_offset"], seg["p_vaddr"], seg["p_filesz"]))
            symtab = elf.get_section_by_name(".symtab")
            debug = _debug_file(elf) if symtab is None else None
            if debug is not None:
                # The debug file has the same vaddrs: only its symbols are used.
                dbg = ElfSymbols(debug)
                self.addrs, self.sizes = dbg.addrs, dbg.sizes
                self._name_offsets, self._strtab = dbg._name_offsets, dbg._strtab
                return
            dtype = _sym_dtype(elf.elfclass, elf.little_endian)
            for table in (symtab, elf.get_section_by_name(".dynsym")):
                if table is None or table["sh_type"] == "SHT_NOBITS":
                    continue
                data = table.data()
                syms = np.frombuffer(data, dtype=dtype, count=len(data) // dtype.itemsize)
                kind = syms["st_info"] & 0xF
                keep = ((kind == _STT_FUNC) | (kind == _STT_GNU_IFUNC)) & (syms["st_value"] != 0)
                if not keep.any():
                    continue  # .symtab has everything .dynsym has: the first one wins
                syms = syms[keep]
                order = np.argsort(syms["st_value"], kind="stable")
                self.addrs = syms["st_value"][order].astype(np.uint64)
                self.sizes = syms["st_size"][order].astype(np.uint64)
                self._name_offsets = syms["st_name"][order].astype(np.uint32)
                self._strtab = elf.get_section(table["sh_link"]).data()
                break

    def name(self, i: int) -> str:
        off = int(self._name_offsets[i])
        end = self._strtab.find(b"\0", off)
        return self._strtab[off : end if end >= 0 else None].decode("utf-8", errors="replace")

    def vaddrs(self, file_offsets: np.ndarray) -> np.ndarray:
        """File offsets -> the ELF's virtual addresses (0 outside every PT_LOAD);
        the same for PIE and non-PIE code: the load bias cancels out."""
        out = np.zeros(len(file_offsets), dtype=np.uint64)
        for p_offset, p_vaddr, p_filesz in self.segments:
            inside = (file_offsets >= p_offset) & (file_offsets < p_offset + p_filesz)
            out[inside] = file_offsets[inside] - np.uint64(p_offset) + np.uint64(p_vaddr)
        return out

    def lookup(self, file_offsets: np.ndarray) -> tuple[list[str | None], np.ndarray]:
        """Symbol name (None where no function covers it) and offset into it."""
        vaddr = self.vaddrs(np.asarray(file_offsets, dtype=np.uint64))
        if not len(self.addrs):
            return [None] * len(vaddr), np.zeros(len(vaddr), dtype=np.uint64)
        idx = np.searchsorted(self.addrs, vaddr, side="right") - 1
        safe = np.maximum(idx, 0)
        off = vaddr - self.addrs[safe]
        # A symbol of size 0 (hand-written assembly) covers up to the next one.
        covered = (idx >= 0) & (vaddr > 0) & ((off < self.sizes[safe]) | (self.sizes[safe] == 0))
        names = [
            self.name(i) if ok else None
            for i, ok in zip(safe.tolist(), covered.tolist(), strict=True)
        ]
        return names, off


def _debug_file(elf: object) -> Path | None:
    """/usr/lib/debug/.build-id/ab/cdef….debug of this ELF, if installed."""
    section = elf.get_section_by_name(".note.gnu.build-id")  # type: ignore[attr-defined]
    if section is None:
        return None
    for note in section.iter_notes():
        if note["n_type"] == "NT_GNU_BUILD_ID":
            build_id = note["n_desc"]
            path = DEBUG_DIR / build_id[:2] / f"{build_id[2:]}.debug"
            return path if path.exists() else None
    return None


class UserSymbols:
    """User addresses -> ``func+0xoff (module)`` or ``module+0xoff``, with the
    process's maps and each module's symbols cached."""

    def __init__(self) -> None:
        self._maps: dict[int, ProcMaps] = {}
        self._elves: dict[tuple[str, int], ElfSymbols | None] = {}

    def refresh(self, tgids: Iterable[int]) -> None:
        """Re-read the maps of these processes (kept as they were if gone)."""
        for tgid in tgids:
            maps = ProcMaps.read(tgid)
            if maps is not None:
                self._maps[tgid] = maps

    def forget(self, tgid: int) -> None:
        self._maps.pop(tgid, None)

    def _elf(self, tgid: int, path: str, inode: int) -> ElfSymbols | None:
        key = (path, inode)
        if key not in self._elves:
            # Through the process's root: the file as the process sees it.
            candidates = [f"/proc/{tgid}/root{path}", path]
            self._elves[key] = None
            for candidate in candidates:
                try:
                    self._elves[key] = ElfSymbols(candidate)
                    break
                except Exception:  # not there, not ELF, unreadable: unsymbolized
                    continue
        return self._elves[key]

    def frames(self, tgid: int, ips: np.ndarray) -> list[str]:
        ips = np.asarray(ips, dtype=np.uint64)
        out: list[str] = [f"{ip:#x}" for ip in ips.tolist()]
        maps = self._maps.get(tgid)
        if maps is None:
            return out
        look = _lookup_ips(ips)
        shift = ips - look  # shown offsets are of the address itself
        idx, file_off = maps.locate(look)
        for m in set(idx.tolist()) - {-1}:
            at = np.flatnonzero(idx == m)
            path = maps.paths[m]
            if not path.startswith("/"):  # [vdso], [heap], anonymous: offset in the mapping
                label = path or "[anon]"
                for i in at.tolist():
                    out[i] = f"{label}+{int(ips[i] - maps.starts[m]):#x}"
                continue
            elf = self._elf(tgid, path, int(maps.inodes[m]))
            if elf is None:
                names: list[str | None] = [None] * len(at)
                sym_off = np.zeros(len(at), dtype=np.uint64)
            else:
                names, sym_off = elf.lookup(file_off[at])
            for j, i in enumerate(at.tolist()):
                if names[j] is not None:
                    out[i] = f"{names[j]}+{int(sym_off[j] + shift[i]):#x} ({path})"
                else:
                    out[i] = f"{path}+{int(file_off[i] + shift[i]):#x}"
        return out


# --- folded stacks ------------------------------------------------------------------
_OFFSET = r"\+0x[0-9a-f]+"


def folded(
    frame: pl.DataFrame, *, kernel: bool = True, user: bool = True, annotate_kernel: bool = False
) -> str:
    """``comm;root;…;leaf count`` lines (Brendan Gregg's folded format), most
    frequent first: user frames, then kernel frames on top. Functions lose their
    offsets; frames without a symbol become ``[module]`` or ``[unknown]``.
    ``annotate_kernel`` suffixes kernel frames with ``_[k]`` (flamegraph.pl colors)."""

    def names(col: str, suffix: str) -> pl.Expr:
        return (
            pl.col(col)
            .list.reverse()
            .list.eval(
                pl.element()
                # func+0x1f (/lib/x.so) -> func ; func+0x1f [mod] -> func
                .str.replace(rf"^([^ ]+){_OFFSET}( .*)?$", "${1}")
                # /lib/x.so+0x1234 -> [x.so]
                .str.replace(r"^.*/([^/]+)$", "[${1}]")
                .str.replace(r"^0x[0-9a-f]+$", "[unknown]")
                + suffix
            )
        )

    parts = [pl.col("comm")]
    if user:
        parts.append(names("user_stack", ""))
    if kernel:
        parts.append(names("kernel_stack", "_[k]" if annotate_kernel else ""))
    lines = (
        frame.select(pl.concat_list(parts).list.join(";").alias("stack"))
        .group_by("stack")
        .len()
        .sort(["len", "stack"], descending=[True, False])
    )
    return "".join(f"{s} {n}\n" for s, n in lines.iter_rows())


# --- the hook ---------------------------------------------------------------------------
class CpuProfileOptions(BpfHookOptions):
    frequency_hz: int = Field(49, ge=1, le=10_000, description="samples per second per CPU")
    stack_entries: int = Field(
        16384,
        ge=64,
        le=1 << 20,
        description=(
            "distinct stacks the stack map holds (127 frames, ~1 KiB each); "
            "samples whose stack finds its bucket taken get stack id -17"
        ),
    )
    idle: bool = Field(False, description="also sample the idle task (pid 0)")


class CpuProfileHook(BpfHook[CpuProfileOptions]):
    """Samples every CPU at ``frequency_hz`` (cpu-clock) with both stacks."""

    libraries: ClassVar[tuple[str, ...]] = ("polars",)  # rows are built with polars

    name = "cpu_profile"
    object_name = "cpu_profile"
    rings: ClassVar[dict[str, str]] = {TABLE: "cpu_profile_rb"}
    needs = ("perf_event", "sw_cpu_clock", "ringbuf")

    def __init__(self, options: CpuProfileOptions | HookOptions | None = None) -> None:
        super().__init__(options)
        self.kernel_symbols: KernelSymbols | None = None
        self.user_symbols = UserSymbols()
        self._kstacks: dict[int, list[str]] = {}
        self._ustacks: dict[tuple[int, int], list[str]] = {}
        self._pending: list[np.ndarray] = []
        self._layout: tuple[str, RecordLayout] | None = None
        self._next_emit = 0.0

    def extra_globals(self) -> dict[str, int | bool]:
        return {"kmo_sample_idle": self.options.idle}

    def extra_max_entries(self) -> dict[str, int]:
        return {"stacks": self.options.stack_entries}

    def attach(self, obj: BpfObject) -> None:
        """One cpu-clock perf event per online CPU, each running the program."""
        prog = obj.programs["cpu_profile_sample"]
        for cpu in online_cpus():
            fd = perf_event_open(
                PERF_TYPE_SOFTWARE, SW_CPU_CLOCK, cpu=cpu, sample_freq=self.options.frequency_hz
            )
            try:
                prog.attach_perf_event(fd)  # the link owns fd from here
            except BaseException:
                os.close(fd)
                raise
        self.kernel_symbols = KernelSymbols.load()
        self.status.variant = "perf_event"
        self.status.programs = [f"perf_event cpu-clock {self.options.frequency_hz} Hz"]

    def _stack(self, stack_id: int) -> np.ndarray:
        assert self.obj is not None
        raw = self.obj.map("stacks").lookup(stack_id)
        if raw is None:
            return np.zeros(0, dtype=np.uint64)
        ips = np.frombuffer(raw, dtype=np.uint64)
        return ips[: int(np.count_nonzero(ips))]  # zero-filled after the last frame

    def _symbolize(self, records: np.ndarray) -> None:
        """Read and symbolize each stack not seen before: per unique id, not per
        sample; user stacks with the maps of their process as it is now."""
        ksyms = self.kernel_symbols or KernelSymbols("")
        for sid in np.unique(records["kernel_stack_id"]).tolist():
            if sid >= 0 and sid not in self._kstacks:
                self._kstacks[sid] = ksyms.frames(self._stack(sid))
        keys = np.unique(records[["tgid", "user_stack_id"]]).tolist()
        new = [(int(t), int(s)) for t, s in keys if s >= 0 and (t, s) not in self._ustacks]
        self.user_symbols.refresh({t for t, _ in new})
        for tgid, sid in new:
            self._ustacks[(tgid, sid)] = self.user_symbols.frames(tgid, self._stack(sid))

    def poll(self) -> Iterator[tuple[str, pl.DataFrame]]:
        # Symbolize at every drain, while the sampled processes live; build the
        # table only every EMIT_INTERVAL_S: a sample rate of ~100/s would
        # otherwise pay a DataFrame's fixed cost for one or two rows per poll.
        for table, (reader, layout) in self.readers().items():
            records = reader.drain()
            if len(records):
                self.status.events += len(records)
                self._symbolize(records)
                self._pending.append(records)
                self._layout = (table, layout)
        now = time.monotonic()
        if self._pending and now >= self._next_emit:
            self._next_emit = now + EMIT_INTERVAL_S
            yield from self._emit()

    def _emit(self) -> Iterator[tuple[str, pl.DataFrame]]:
        if self._pending and self._layout is not None:
            records, self._pending = np.concatenate(self._pending), []
            table, layout = self._layout
            yield table, self.to_frame(table, records, layout)

    def final_rows(self) -> Iterator[tuple[str, pl.DataFrame]]:
        self._next_emit = float("inf")
        yield from self.poll()
        yield from self._emit()

    def to_frame(self, table: str, records: np.ndarray, layout: RecordLayout) -> pl.DataFrame:
        self._symbolize(records)  # a no-op for stacks poll() has seen
        kids = [s for s in np.unique(records["kernel_stack_id"]).tolist() if s >= 0]
        kern = pl.DataFrame(
            {
                "kernel_stack_id": pl.Series(kids, dtype=pl.Int32),
                "kernel_stack": pl.Series(
                    [self._kstacks[s] for s in kids], dtype=pl.List(pl.String)
                ),
            }
        )
        ukeys = [
            (t, s) for t, s in np.unique(records[["tgid", "user_stack_id"]]).tolist() if s >= 0
        ]
        usr = pl.DataFrame(
            {
                "tgid": pl.Series([t for t, _ in ukeys], dtype=pl.UInt32),
                "user_stack_id": pl.Series([s for _, s in ukeys], dtype=pl.Int32),
                "user_stack": pl.Series(
                    [self._ustacks[k] for k in ukeys], dtype=pl.List(pl.String)
                ),
            }
        )
        empty = pl.lit([], dtype=pl.List(pl.String))
        return (
            records_to_frame(records, layout)
            .with_row_index("_row")
            .join(kern, on="kernel_stack_id", how="left")
            .join(usr, on=["tgid", "user_stack_id"], how="left")
            .sort("_row")
            .drop("_row")
            .with_columns(
                pl.col("kernel_stack").fill_null(empty), pl.col("user_stack").fill_null(empty)
            )
        )
