"""BTF (BPF Type Format) reader and record layouts derived from it.

A hook's record struct is declared once, in C. The compiled object's .BTF
section describes it; this module turns that description into a numpy
structured dtype (and from it a polars schema), the way bpf2go generates Go
types. Pure Python, no root: it only reads bytes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.errors import KernmlopsError
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy")


BTF_MAGIC = 0xEB9F
#: Section holding `__kmo_ring_<ring>` markers (see bpf/common.h).
RECORDS_SECTION = ".kmo.records"
RING_MARKER_PREFIX = "__kmo_ring_"
#: `__kmo_batch_<ring>`: the ring carries per-CPU batches of its records (KMO_BATCHED_RING)
BATCH_MARKER_PREFIX = "__kmo_batch_"


class BtfError(KernmlopsError):
    """The BTF is missing, malformed, or describes a layout we cannot map."""


class Kind(IntEnum):
    VOID = 0
    INT = 1
    PTR = 2
    ARRAY = 3
    STRUCT = 4
    UNION = 5
    ENUM = 6
    FWD = 7
    TYPEDEF = 8
    VOLATILE = 9
    CONST = 10
    RESTRICT = 11
    FUNC = 12
    FUNC_PROTO = 13
    VAR = 14
    DATASEC = 15
    FLOAT = 16
    DECL_TAG = 17
    TYPE_TAG = 18
    ENUM64 = 19


INT_SIGNED = 1
INT_CHAR = 2
INT_BOOL = 4


@dataclass
class BtfType:
    """One type. ``members`` holds (name, type_id, bit_offset, bitfield_size) for
    structs and unions, (name, value) for enums, (type_id, offset, size) for
    datasecs; ``ref`` is the referenced type or element type."""

    id: int
    kind: Kind
    name: str
    size: int = 0
    ref: int = 0
    nelems: int = 0
    encoding: int = 0
    bits: int = 0
    members: list = field(default_factory=list)


def decode_type(
    blob: bytes | memoryview, pos: int, type_id: int, name_at: Callable[[int], str]
) -> tuple[BtfType, int]:
    """Decode the type record at ``pos``; return it and where the next one starts."""
    name_off, info, size_or_type = struct.unpack_from("<III", blob, pos)
    pos += 12
    vlen = info & 0xFFFF
    kind = Kind((info >> 24) & 0x1F)
    kflag = info >> 31
    t = BtfType(type_id, kind, name_at(name_off), size=size_or_type, ref=size_or_type)
    if kind is Kind.INT:
        (enc,) = struct.unpack_from("<I", blob, pos)
        pos += 4
        t.encoding, t.bits = (enc >> 24) & 0xF, enc & 0xFF
    elif kind is Kind.ARRAY:
        t.ref, _index, t.nelems = struct.unpack_from("<III", blob, pos)
        pos += 12
    elif kind in (Kind.STRUCT, Kind.UNION):
        for _ in range(vlen):
            m_name, m_type, m_off = struct.unpack_from("<III", blob, pos)
            pos += 12
            bit_off, bf_size = (m_off & 0xFFFFFF, m_off >> 24) if kflag else (m_off, 0)
            t.members.append((name_at(m_name), m_type, bit_off, bf_size))
    elif kind is Kind.ENUM:
        # Values are s32 in the format; kind_flag marks a signed enum, but
        # older clang (14) never sets it, so negative values also mean signed.
        t.encoding = INT_SIGNED if kflag else 0
        for _ in range(vlen):
            m_name, val = struct.unpack_from("<Ii", blob, pos)
            pos += 8
            t.members.append((name_at(m_name), val))
    elif kind is Kind.ENUM64:
        t.encoding = INT_SIGNED if kflag else 0
        for _ in range(vlen):
            m_name, lo, hi = struct.unpack_from("<III", blob, pos)
            pos += 12
            val = lo | (hi << 32)
            if kflag and val >= 1 << 63:
                val -= 1 << 64
            t.members.append((name_at(m_name), val))
    elif kind is Kind.FUNC_PROTO:
        pos += 8 * vlen
    elif kind is Kind.VAR or kind is Kind.DECL_TAG:
        pos += 4
    elif kind is Kind.DATASEC:
        for _ in range(vlen):
            t.members.append(struct.unpack_from("<III", blob, pos))
            pos += 12
    return t, pos


class Btf:
    """All types of one BTF blob, by id and by (kind, name)."""

    def __init__(self, types: list[BtfType]) -> None:
        self.types = types  # index == id; types[0] is void
        self._by_name: dict[tuple[Kind, str], BtfType] = {}
        for t in types[1:]:
            if t.name:
                self._by_name.setdefault((t.kind, t.name), t)

    @classmethod
    def parse(cls, data: bytes) -> Btf:
        try:
            return cls._parse(data)
        except (struct.error, ValueError, UnicodeDecodeError, IndexError) as err:
            raise BtfError(f"malformed BTF: {err}") from err

    @classmethod
    def _parse(cls, data: bytes) -> Btf:
        if len(data) < 24:
            raise BtfError("BTF blob too short")
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != BTF_MAGIC:
            raise BtfError(f"bad BTF magic {magic:#x}")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        end = hdr_len + max(type_off + type_len, str_off + str_len)
        if end > len(data):
            raise BtfError(f"malformed BTF: sections end at {end}, blob has {len(data)} bytes")
        types_blob = memoryview(data)[hdr_len + type_off : hdr_len + type_off + type_len]
        strings = bytes(data[hdr_len + str_off : hdr_len + str_off + str_len])

        def name_at(off: int) -> str:
            end = strings.index(b"\0", off)
            return strings[off:end].decode()

        types = [BtfType(0, Kind.VOID, "")]
        pos = 0
        while pos < len(types_blob):
            t, pos = decode_type(types_blob, pos, len(types), name_at)
            types.append(t)
        return cls(types)

    @classmethod
    def from_elf(cls, path: str | Path) -> Btf:
        """The .BTF section of a compiled BPF object."""
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile

        try:
            with open(path, "rb") as fh:
                section = ELFFile(fh).get_section_by_name(".BTF")
                if section is None:
                    raise BtfError(f"{path}: no .BTF section (compile with clang -g)")
                return cls.parse(section.data())
        except OSError as err:
            raise BtfError(f"cannot read {path}: {err.strerror}") from err
        except ELFError as err:
            raise BtfError(f"{path} is not an ELF object: {err}") from err

    def find(self, kind: Kind, name: str) -> BtfType:
        try:
            return self._by_name[(kind, name)]
        except KeyError:
            raise BtfError(f"no {kind.name.lower()} named {name!r} in BTF") from None

    def resolve(self, type_id: int) -> BtfType:
        """Skip typedefs and qualifiers."""
        t = self.types[type_id]
        while t.kind in (Kind.TYPEDEF, Kind.VOLATILE, Kind.CONST, Kind.RESTRICT, Kind.TYPE_TAG):
            t = self.types[t.ref]
        return t

    def ring_record(self, ring: str) -> BtfType:
        """The record struct of ring buffer ``ring`` (declared with KMO_RING)."""
        var = self.find(Kind.VAR, RING_MARKER_PREFIX + ring)
        ptr = self.resolve(var.ref)
        if ptr.kind is not Kind.PTR:
            raise BtfError(f"marker of ring {ring!r} is not a pointer")
        record = self.resolve(ptr.ref)
        if record.kind is not Kind.STRUCT:
            raise BtfError(f"record of ring {ring!r} is not a struct")
        return record

    def rings(self) -> list[str]:
        """Names of every ring buffer declared with KMO_RING."""
        try:
            sec = self.find(Kind.DATASEC, RECORDS_SECTION)
        except BtfError:
            return []
        names = (self.types[type_id].name for type_id, _off, _size in sec.members)
        return [
            n.removeprefix(RING_MARKER_PREFIX) for n in names if n.startswith(RING_MARKER_PREFIX)
        ]

    def ring_batch(self, ring: str) -> BtfType | None:
        """The batch struct of a ring declared with KMO_BATCHED_RING, else None."""
        try:
            var = self.find(Kind.VAR, BATCH_MARKER_PREFIX + ring)
        except BtfError:
            return None
        ptr = self.resolve(var.ref)
        batch = self.resolve(ptr.ref) if ptr.kind is Kind.PTR else ptr
        if batch.kind is not Kind.STRUCT:
            raise BtfError(f"batch of ring {ring!r} is not a struct")
        return batch

    def ring_fingerprint(self, ring: str) -> str:
        """A digest of the types a ring's records (and batches) are declared with:
        every member's name, offset and type down to its scalars, typedef names
        included (they carry meaning: kmo_batch_gap_ns, kmo_us_from_ns). A spool keeps
        it beside its records, so that recovery decodes them only with objects that
        lay them out the same: a change that keeps the record's size (a field moved,
        an offset become a gap) would otherwise be misread, not refused. Read from the
        BTF alone: no numpy before the probes attach."""
        batch = self.ring_batch(ring)
        doc = [self._shape(self.ring_record(ring).id),
               None if batch is None else self._shape(batch.id)]  # fmt: skip
        text = json.dumps(doc, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _shape(self, type_id: int) -> object:
        t = self.types[type_id]
        if t.kind in (Kind.STRUCT, Kind.UNION):
            members = [[n, off, bits, self._shape(ref)] for n, ref, off, bits in t.members]
            return [t.kind.name, t.name, t.size, members]
        if t.kind is Kind.ARRAY:
            return ["ARRAY", t.nelems, self._shape(t.ref)]
        if t.kind in (Kind.ENUM, Kind.ENUM64):
            return [t.kind.name, t.name, t.size, t.encoding, sorted(t.members)]
        if t.kind in (Kind.TYPEDEF, Kind.VOLATILE, Kind.CONST, Kind.RESTRICT, Kind.TYPE_TAG):
            return [t.kind.name, t.name, self._shape(t.ref)]
        # scalars; a pointer is a u64 in a record: what it points to is not read
        return [t.kind.name, t.name, t.size, t.encoding, t.bits]


@dataclass(frozen=True)
class RecordLayout:
    """A record's numpy dtype plus how to present its columns."""

    name: str
    dtype: np.dtype
    #: column -> {value: label} for enum-typed fields
    enums: dict[str, dict[int, str]]
    #: char-array columns, decoded to strings
    strings: tuple[str, ...]
    #: for a batched ring: the batch's dtype (``n`` records valid of ``recs``)
    batch: np.dtype | None = None
    #: microsecond columns the program fills with nanoseconds: column -> rounded
    #: (see us_from_ns; bpf/common.h's kmo_us_from_ns)
    us_from_ns: dict[str, bool] = field(default_factory=dict)
    #: kmo_batch_ns columns: nanoseconds after their batch's first_ns (see unbatch)
    batch_ns: tuple[str, ...] = ()
    #: kmo_batch_gap_ns columns: nanoseconds after the batch's record before (see unbatch)
    batch_gaps: tuple[str, ...] = ()

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


def _enum_labels(t: BtfType) -> dict[int, str]:
    """Enumerator names without their common prefix, lower-cased (FOO_KIND_EXEC -> exec)."""
    names = [n for n, _ in t.members]
    prefix = ""
    if len(names) > 1:
        first, last = min(names), max(names)
        i = 0
        while i < min(len(first), len(last)) and first[i] == last[i]:
            i += 1
        prefix = first[: first.rfind("_", 0, i + 1) + 1] if "_" in first[:i] else ""
    return {val: n[len(prefix) :].lower() for n, val in t.members}


#: The C typedef (bpf/common.h) of a 64-bit field that needs its full unsigned
#: range (kernel addresses): the only u64 kept unsigned in tables.
FULL_RANGE_TYPEDEF = "kmo_full_u64"


#: Typedefs (bpf/common.h) of a microsecond column the program fills with
#: nanoseconds: name -> whether to round (else truncate) when dividing by 1000.
US_FROM_NS_TYPEDEFS = {"kmo_us_from_ns": False, "kmo_us_from_ns_round": True}

#: The C typedef (bpf/common.h) of a time kept as nanoseconds after the batch's
#: first_ns: 4 bytes a record instead of 8 (KMO_BATCH_SLOT_AT).
BATCH_NS_TYPEDEF = "kmo_batch_ns"
#: ... and one kept as nanoseconds after the batch's record before it (its first's:
#: after first_ns), which compresses better in the spool (KMO_BATCH_GAP).
BATCH_GAP_TYPEDEF = "kmo_batch_gap_ns"


def _typedefs(btf: Btf, type_id: int) -> list[str]:
    """The typedef names a member's declared type goes through."""
    names = []
    t = btf.types[type_id]
    while t.kind in (Kind.TYPEDEF, Kind.VOLATILE, Kind.CONST, Kind.RESTRICT, Kind.TYPE_TAG):
        if t.kind is Kind.TYPEDEF:
            names.append(t.name)
        t = btf.types[t.ref]
    return names


def _full_range(btf: Btf, type_id: int) -> bool:
    """Whether a member's declared type is (a typedef chain through) kmo_full_u64."""
    return FULL_RANGE_TYPEDEF in _typedefs(btf, type_id)


def us_from_ns(values: np.ndarray, rounded: bool) -> np.ndarray:
    """Nanoseconds as microseconds, as the BPF programs once divided them."""
    return (values + 500) // 1000 if rounded else values // 1000


def _scalar(btf: Btf, t: BtfType, where: str, *, full_range: bool = False) -> np.dtype:
    """A C scalar's column type. Unsigned 64-bit integers become signed int64 (the
    same bytes, read as signed: timestamps, durations and counts never reach 2**63)
    unless declared kmo_full_u64: Spark, Hive and pandas have no unsigned 64-bit
    type (Spark reads one as decimal(20,0)). Narrower unsigned integers stay as they
    are: every reader widens them losslessly (Spark reads UINT32 as bigint)."""
    if t.kind is Kind.INT:
        if t.encoding & INT_BOOL:
            return np.dtype(np.bool_)
        signed = bool(t.encoding & INT_SIGNED) or (t.size == 8 and not full_range)
        return np.dtype(f"<{'i' if signed else 'u'}{t.size}")
    if t.kind in (Kind.ENUM, Kind.ENUM64):
        signed = bool(t.encoding & INT_SIGNED) or any(v < 0 for _, v in t.members)
        return np.dtype(f"<{'i' if signed else 'u'}{t.size}")
    if t.kind is Kind.PTR:
        return np.dtype("<u8")
    if t.kind is Kind.FLOAT:
        return np.dtype(f"<f{t.size}")
    raise BtfError(f"{where}: cannot map BTF kind {t.kind.name} to a column")


def record_layout(btf: Btf, record: BtfType) -> RecordLayout:
    """Flat numpy dtype for a struct: nested structs become ``outer_inner``
    columns, char arrays become byte strings, other arrays subarrays."""
    names: list[str] = []
    formats: list = []
    offsets: list[int] = []
    enums: dict[str, dict[int, str]] = {}
    strings: list[str] = []
    us_cols: dict[str, bool] = {}
    batch_ns: list[str] = []
    batch_gaps: list[str] = []

    def walk(st: BtfType, prefix: str, base: int) -> None:
        for m_name, m_type, bit_off, bf_size in st.members:
            where = f"struct {record.name}.{prefix}{m_name}"
            if bf_size or bit_off % 8:
                raise BtfError(f"{where}: bitfields are not supported in records")
            if not m_name:
                raise BtfError(f"{where}: anonymous members are not supported in records")
            off = base + bit_off // 8
            col = prefix + m_name
            t = btf.resolve(m_type)
            if t.kind is Kind.STRUCT:
                walk(t, col + "_", off)
                continue
            if t.kind is Kind.ARRAY:
                elem = btf.resolve(t.ref)
                is_char = elem.encoding & INT_CHAR or elem.name == "char"
                if elem.kind is Kind.INT and elem.size == 1 and is_char:
                    fmt: object = np.dtype(f"S{t.nelems}")
                    strings.append(col)
                else:
                    full = _full_range(btf, t.ref)
                    fmt = (_scalar(btf, elem, where, full_range=full), (t.nelems,))
            else:
                fmt = _scalar(btf, t, where, full_range=_full_range(btf, m_type))
                if t.kind in (Kind.ENUM, Kind.ENUM64):
                    enums[col] = _enum_labels(t)
                typedefs = _typedefs(btf, m_type)
                scaled = [US_FROM_NS_TYPEDEFS[n] for n in typedefs if n in US_FROM_NS_TYPEDEFS]
                if scaled:
                    us_cols[col] = scaled[0]
                if BATCH_NS_TYPEDEF in typedefs:
                    batch_ns.append(col)
                if BATCH_GAP_TYPEDEF in typedefs:
                    batch_gaps.append(col)
            names.append(col)
            formats.append(fmt)
            offsets.append(off)

    if record.kind is not Kind.STRUCT:
        raise BtfError(f"{record.name!r} is not a struct")
    walk(record, "", 0)
    dtype = np.dtype(
        {"names": names, "formats": formats, "offsets": offsets, "itemsize": record.size}
    )
    return RecordLayout(record.name, dtype, enums, tuple(strings), us_from_ns=us_cols,
                        batch_ns=tuple(batch_ns), batch_gaps=tuple(batch_gaps))  # fmt: skip


def btf_ring_layouts(btf: Btf) -> dict[str, RecordLayout]:
    """Layouts of every ring buffer declared in an object's BTF."""
    out = {}
    for ring in btf.rings():
        layout = record_layout(btf, btf.ring_record(ring))
        batch = btf.ring_batch(ring)
        if batch is not None:
            layout = replace(layout, batch=batch_dtype(btf, batch, layout))
        out[ring] = layout
    return out


def batch_dtype(btf: Btf, batch: BtfType, record: RecordLayout) -> np.dtype:
    """The dtype of a KMO_BATCHED_RING batch: its count ``n``, ``recs`` (an array
    of records) and the rest of its header (``cpu``, ``first_ns``)."""
    members = {name: (type_id, bit_off // 8) for name, type_id, bit_off, _ in batch.members}
    if "n" not in members or "recs" not in members:
        raise BtfError(f"struct {batch.name}: a batch needs members n and recs")
    recs = btf.resolve(members["recs"][0])
    if recs.kind is not Kind.ARRAY or btf.resolve(recs.ref).name != record.name:
        raise BtfError(f"struct {batch.name}.recs is not an array of struct {record.name}")
    names, formats, offsets = [], [], []
    for name, (type_id, off) in members.items():
        t = btf.resolve(type_id)
        if name == "recs":
            fmt: object = (record.dtype, (recs.nelems,))
        elif t.kind is Kind.INT:
            fmt = _scalar(btf, t, f"struct {batch.name}.{name}")
        else:
            continue
        names.append(name)
        formats.append(fmt)
        offsets.append(off)
    return np.dtype(
        {"names": names, "formats": formats, "offsets": offsets, "itemsize": batch.size}
    )


def unbatch(batches: np.ndarray, layout: RecordLayout | None = None) -> np.ndarray:
    """The valid records of batches (a batch dtype array), in order.

    Records with kmo_batch_ns or kmo_batch_gap_ns columns (``layout.batch_ns``,
    ``layout.batch_gaps``) need their batch: those columns come back as int64
    nanoseconds (the batch's ``first_ns`` added to the offset, or to the sum of the
    gaps up to the record), and the batch's other header fields (``cpu``) become
    columns of each record."""
    recs = batches["recs"]
    n = np.minimum(batches["n"], recs.shape[1])
    valid = recs[np.arange(recs.shape[1])[None, :] < n[:, None]]
    timed = () if layout is None else layout.batch_ns + layout.batch_gaps
    if not timed:
        return valid
    assert layout is not None
    skip = ("n", "recs", "first_ns", "last_ns")
    header = [f for f in batches.dtype.names or () if f not in skip]
    fields = valid.dtype.names or ()
    out = np.empty(
        len(valid),
        [(f, "<i8" if f in timed else valid.dtype[f]) for f in fields]
        + [(f, batches.dtype[f]) for f in header if f not in fields],
    )
    first = np.repeat(batches["first_ns"], n)
    starts = np.cumsum(n) - n  # each batch's first valid record
    for f in fields:
        if f in layout.batch_gaps:
            # the gaps' running sum, less the sum before the record's batch
            total = np.cumsum(valid[f], dtype=np.int64)
            before = np.concatenate([[0], total])[starts]
            out[f] = first + total - np.repeat(before, n)
        else:
            out[f] = first + valid[f] if f in layout.batch_ns else valid[f]
    for f in header:
        if f not in fields:
            out[f] = np.repeat(batches[f], n)
    return out


# --- the running kernel's types, found by name through libbpf --------------------
_vmlinux: int | None = None


def kernel_type(kind: Kind, name: str) -> BtfType | None:
    """One type of the running kernel (/sys/kernel/btf/vmlinux) by kind and name.

    libbpf parses the kernel's BTF in C (milliseconds, once per process); only
    the record asked for is decoded here, with the same decoder as Btf.parse.
    None when the kernel has no such type or no BTF.
    """
    from kernmlops.ebpf.libbpf import lib

    if not _load_vmlinux():
        return None
    type_id = lib.btf__find_by_name_kind(_vmlinux, name.encode(), int(kind))
    if type_id <= 0:
        return None
    return kernel_type_by_id(type_id)


def _load_vmlinux() -> int:
    from kernmlops.ebpf.libbpf import lib

    global _vmlinux
    if _vmlinux is None:
        _vmlinux = lib.btf__load_vmlinux_btf() or 0
    return _vmlinux


def kernel_type_by_id(type_id: int) -> BtfType | None:
    """One type of the running kernel by id (a member's type, say); None
    without kernel BTF."""
    import ctypes

    from kernmlops.ebpf.libbpf import lib

    if not _load_vmlinux() or type_id <= 0:
        return None
    ptr = lib.btf__type_by_id(_vmlinux, type_id)
    if not ptr:
        return None
    _name, info, _size = struct.unpack("<III", ctypes.string_at(ptr, 12))
    vlen, k = info & 0xFFFF, Kind((info >> 24) & 0x1F)
    extra = {
        Kind.INT: 4, Kind.ARRAY: 12, Kind.VAR: 4, Kind.DECL_TAG: 4,
        Kind.STRUCT: 12 * vlen, Kind.UNION: 12 * vlen, Kind.ENUM: 8 * vlen,
        Kind.ENUM64: 12 * vlen, Kind.FUNC_PROTO: 8 * vlen, Kind.DATASEC: 12 * vlen,
    }.get(k, 0)  # fmt: skip

    def name_at(off: int) -> str:
        return (lib.btf__name_by_offset(_vmlinux, off) or b"").decode()

    t, _ = decode_type(ctypes.string_at(ptr, 12 + extra), 0, type_id, name_at)
    return t
