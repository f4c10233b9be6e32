"""BTF -> numpy dtype: the C compiler's layout is the only source of truth.

A test object is compiled from C whose static asserts pin every offset and
size listed in FIELDS, so the expected values below are checked by clang
itself; the dtype derived from the object's BTF must match them exactly.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

from kernmlops.ebpf.btf import (
    BTF_MAGIC,
    Btf,
    BtfError,
    BtfType,
    Kind,
    RecordLayout,
    _enum_labels,
    kernel_type,
    record_layout,
    unbatch,
)
from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.spec import ObjectSpec, ring_layouts, spec_path

# (column, C member designator, numpy format, offset) of struct kmo_test_record
FIELDS: list[tuple[str, str, object, int]] = [
    ("a_u8", "a_u8", "<u1", 0),
    ("a_u16", "a_u16", "<u2", 2),
    ("a_u32", "a_u32", "<u4", 4),
    ("a_u64", "a_u64", "<i8", 8),  # u64 columns are signed (Spark has no uint64)
    ("a_s32", "a_s32", "<i4", 16),
    ("a_s64", "a_s64", "<i8", 24),
    ("flag", "flag", "?", 32),
    ("comm", "comm", "S16", 33),
    ("raw", "raw", ("<u1", (3,)), 49),
    ("color", "color", "<u4", 52),
    ("inner_port", "inner.port", "<u2", 56),
    ("inner_addr", "inner.addr", "<u4", 60),
    ("inner_pos_x", "inner.pos.x", "<i2", 64),
    ("inner_pos_y", "inner.pos.y", "<i2", 66),
    ("samples", "samples", ("<i4", (3,)), 68),
    ("delta", "delta", "<i4", 80),
    ("quals", "quals", "<u2", 84),
    ("a_s8", "a_s8", "<i1", 86),
    ("ptr", "ptr", "<u8", 88),
    ("addr", "addr", "<u8", 96),  # kmo_full_u64: the full unsigned range is kept
    ("addrs", "addrs", ("<u8", (2,)), 104),
]
RECORD_SIZE = 120

SMALL_FIELDS = [("a", "<u4", 0), ("b", "<u1", 4)]
SMALL_SIZE = 8

RECORDS_C = r"""
#include "common.h"

enum kmo_test_color {
	KMO_TEST_COLOR_RED = 0,
	KMO_TEST_COLOR_GREEN = 1,
	KMO_TEST_COLOR_DEEP_BLUE = 7,
};

enum kmo_test_delta {
	KMO_TEST_DELTA_DOWN = -1,
	KMO_TEST_DELTA_UP = 1,
};

struct kmo_test_point {
	s16 x;
	s16 y;
};
typedef struct kmo_test_point kmo_test_point_t;

struct kmo_test_inner {
	u16 port;
	u32 addr;
	kmo_test_point_t pos;
};

struct kmo_test_record {
	u8 a_u8;
	u16 a_u16;
	u32 a_u32;
	u64 a_u64;
	s32 a_s32;
	s64 a_s64;
	bool flag;
	char comm[16];
	u8 raw[3];
	enum kmo_test_color color;
	struct kmo_test_inner inner;
	int samples[3];
	enum kmo_test_delta delta;
	const volatile u16 quals;
	s8 a_s8;
	u64 *ptr;
	kmo_full_u64 addr;
	kmo_full_u64 addrs[2];
};

struct kmo_test_small {
	u32 a;
	u8 b;
};

KMO_RING(test_rb, kmo_test_record);
KMO_RING(test_small_rb, kmo_test_small);
"""

BAD_C = r"""
#include "common.h"

struct kmo_bad_bits {
	u32 a : 3;
	u32 b : 5;
};

struct kmo_bad_anon {
	u32 a;
	union {
		u32 b;
		u64 c;
	};
};

union kmo_bad_u {
	u32 x;
	u64 y;
};

struct kmo_bad_union {
	u32 a;
	union kmo_bad_u u;
};

struct kmo_good {
	u64 ok;
};

KMO_RING(bits_rb, kmo_bad_bits);
KMO_RING(anon_rb, kmo_bad_anon);
KMO_RING(union_rb, kmo_bad_union);
KMO_RING(good_rb, kmo_good);
"""


def _static_asserts(struct_name: str, fields, size: int) -> str:
    lines = [
        f'_Static_assert(__builtin_offsetof(struct {struct_name}, {member}) == {off}, "{member}");'
        for member, off in fields
    ]
    lines.append(f'_Static_assert(sizeof(struct {struct_name}) == {size}, "size");')
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def records_obj(compile_bpf) -> Path:
    source = (
        RECORDS_C
        + _static_asserts("kmo_test_record", [(m, o) for _, m, _, o in FIELDS], RECORD_SIZE)
        + _static_asserts("kmo_test_small", [(n, o) for n, _, o in SMALL_FIELDS], SMALL_SIZE)
    )
    return compile_bpf("records", source)


@pytest.fixture(scope="module")
def bad_obj(compile_bpf) -> Path:
    return compile_bpf("bad_records", BAD_C)


@pytest.fixture(scope="module")
def layouts(records_obj):
    return ring_layouts(records_obj)


def _bpftool() -> str:
    bpftool = shutil.which("bpftool") or shutil.which("bpftool", path="/usr/sbin:/sbin")
    assert bpftool, "bpftool is needed (make test installs it)"
    return bpftool


def _btf_bytes(path: Path) -> bytes:
    with path.open("rb") as fh:
        return ELFFile(fh).get_section_by_name(".BTF").data()


# --- record layouts from a compiled object ------------------------------------
def test_rings_found_by_marker(records_obj):
    btf = Btf.from_elf(records_obj)
    assert sorted(btf.rings()) == ["test_rb", "test_small_rb"]
    assert btf.ring_record("test_rb").name == "kmo_test_record"
    assert btf.ring_record("test_small_rb").name == "kmo_test_small"


def test_record_dtype_matches_c_layout(layouts):
    layout = layouts["test_rb"]
    assert layout.name == "kmo_test_record"
    dtype = layout.dtype
    assert list(dtype.names) == [col for col, *_ in FIELDS]
    for col, _member, fmt, off in FIELDS:
        got, got_off = dtype.fields[col][:2]
        assert got == np.dtype(fmt), col
        assert got_off == off, col
    assert dtype.itemsize == layout.itemsize == RECORD_SIZE
    expected = np.dtype(
        {
            "names": [c for c, *_ in FIELDS],
            "formats": [f for _, _, f, _ in FIELDS],
            "offsets": [o for *_, o in FIELDS],
            "itemsize": RECORD_SIZE,
        }
    )
    assert dtype == expected


def test_subarrays_and_strings(layouts):
    layout = layouts["test_rb"]
    assert layout.strings == ("comm",)  # only char arrays; u8 raw[3] stays numbers
    assert layout.dtype["samples"].shape == (3,)
    assert layout.dtype["samples"].base == np.dtype("<i4")
    assert layout.dtype["raw"].shape == (3,)
    assert layout.dtype["raw"].base == np.dtype("u1")
    assert layout.dtype["comm"] == np.dtype("S16")


def test_enum_labels_lowercase_without_common_prefix(layouts):
    layout = layouts["test_rb"]
    assert layout.enums == {
        "color": {0: "red", 1: "green", 7: "deep_blue"},
        "delta": {-1: "down", 1: "up"},
    }
    # a negative enumerator makes the column signed
    assert layout.dtype["color"] == np.dtype("<u4")
    assert layout.dtype["delta"] == np.dtype("<i4")


def test_second_ring_layout(layouts):
    small = layouts["test_small_rb"]
    assert small.name == "kmo_test_small"
    assert small.dtype == np.dtype(
        {
            "names": [n for n, _, _ in SMALL_FIELDS],
            "formats": [f for _, f, _ in SMALL_FIELDS],
            "offsets": [o for _, _, o in SMALL_FIELDS],
            "itemsize": SMALL_SIZE,
        }
    )
    assert small.enums == {}
    assert small.strings == ()


def test_layout_decodes_bytes_written_like_c(layouts):
    """Bytes packed with struct at the C offsets read back through the dtype."""
    dtype = layouts["test_rb"].dtype
    buf = bytearray(RECORD_SIZE)
    struct.pack_into("<BxHIQ", buf, 0, 0xAB, 0xBEEF, 0xDEADBEEF, 2**64 - 2)
    struct.pack_into("<i", buf, 16, -5)
    struct.pack_into("<q", buf, 24, -(2**40))
    buf[32] = 1
    buf[33:37] = b"bash"
    buf[49:52] = b"\x01\x02\x03"
    struct.pack_into("<IHxxIhh3iiHbx", buf, 52, 7, 8080, 0x7F000001, -3, 4, 10, -20, 30, -1, 9, -7)
    struct.pack_into("<Q", buf, 88, 0xFFFF8880_00001000)
    struct.pack_into("<QQQ", buf, 96, 0xFFFFFFFF_81000000, 0xFFFF8880_00002000, 1)
    rec = np.frombuffer(bytes(buf), dtype=dtype)[0]
    # A plain u64 is read as signed (the same bytes): only values past 2**63,
    # never a real timestamp or count, read differently; kmo_full_u64 keeps all.
    assert rec["addr"] == 0xFFFFFFFF_81000000
    assert rec["addrs"].tolist() == [0xFFFF8880_00002000, 1]
    assert rec["a_u8"] == 0xAB
    assert rec["a_u16"] == 0xBEEF
    assert rec["a_u32"] == 0xDEADBEEF
    assert rec["a_u64"] == -2
    assert rec["a_s32"] == -5
    assert rec["a_s64"] == -(2**40)
    assert rec["flag"] is np.True_
    assert rec["comm"] == b"bash"
    assert rec["raw"].tolist() == [1, 2, 3]
    assert rec["color"] == 7
    assert rec["inner_port"] == 8080
    assert rec["inner_addr"] == 0x7F000001
    assert (rec["inner_pos_x"], rec["inner_pos_y"]) == (-3, 4)
    assert rec["samples"].tolist() == [10, -20, 30]
    assert rec["delta"] == -1
    assert rec["quals"] == 9
    assert rec["a_s8"] == -7
    assert rec["ptr"] == 0xFFFF8880_00001000


def test_parsed_members_agree_with_bpftool(records_obj):
    """Our BTF reader and bpftool's see the same members at the same bit offsets."""
    out = subprocess.run(
        [_bpftool(), "btf", "dump", "file", str(records_obj)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    btf = Btf.from_elf(records_obj)
    for name in ("kmo_test_record", "kmo_test_inner", "kmo_test_point", "kmo_test_small"):
        block = re.search(rf"STRUCT '{name}' size=(\d+) vlen=\d+\n((?:\t.*\n)*)", out)
        assert block, name
        theirs = re.findall(r"'(\w+)' type_id=\d+ bits_offset=(\d+)", block.group(2))
        ours = btf.find(Kind.STRUCT, name)
        assert ours.size == int(block.group(1))
        assert [(m, b) for m, _, b, _ in ours.members] == [(m, int(b)) for m, b in theirs]
    # the type count matches too (ids are positions)
    last_id = max(int(i) for i in re.findall(r"^\[(\d+)\]", out, re.M))
    assert len(btf.types) == last_id + 1


def test_kernel_btf_parses_like_bpftool():
    """Every kind the kernel uses (FUNC_PROTO, DECL_TAG, ENUM64, TYPE_TAG, ...) is
    skipped or read with the right length: ids, kinds and names line up with bpftool."""
    vmlinux = Path("/sys/kernel/btf/vmlinux")
    btf = Btf.parse(vmlinux.read_bytes())
    out = subprocess.run(
        [_bpftool(), "btf", "dump", "file", str(vmlinux)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    theirs = re.findall(r"^\[(\d+)\] (\w+) '([^']*)'", out, re.M)
    assert len(btf.types) == len(theirs) + 1
    for type_id, kind, name in theirs:
        t = btf.types[int(type_id)]
        assert (t.kind.name, t.name or "(anon)") == (kind, name), type_id
    task = re.search(r"^\[\d+\] STRUCT 'task_struct' size=(\d+) vlen=(\d+)$", out, re.M)
    assert task
    ours = btf.find(Kind.STRUCT, "task_struct")
    assert (ours.size, len(ours.members)) == (int(task.group(1)), int(task.group(2)))
    # 64-bit enumerators keep their high half
    enum64 = dict(re.findall(r"^\t'(\w+)' val=(\d+)ULL$", out, re.M))
    values = {n: v for t in btf.types if t.kind is Kind.ENUM64 for n, v in t.members}
    assert enum64
    assert {n: int(v) for n, v in enum64.items() if n in values} == {
        n: values[n] for n in enum64 if n in values
    }
    assert max(values.values()) > 2**32


# --- the project's objects ----------------------------------------------------
def test_project_ring_layouts(bpf_build_dir):
    pt = ring_layouts(object_path("process_trace", bpf_build_dir))
    assert list(pt) == ["process_trace_rb"]
    layout = pt["process_trace_rb"]
    assert layout.name == "process_trace_event"
    assert layout.dtype == np.dtype(
        {
            "names": ["ts_uptime_us", "pid", "tgid", "ppid", "kind", "comm", "old_pid"],
            "formats": ["<i8", "<u4", "<u4", "<u4", "<u4", "S16", "<u4"],
            "offsets": [0, 8, 12, 16, 20, 24, 40],
            "itemsize": 48,
        }
    )
    assert layout.enums == {"kind": {0: "fork", 1: "exec", 2: "exit"}}
    assert layout.strings == ("comm",)

    qr = ring_layouts(object_path("quanta_runtime", bpf_build_dir))
    assert list(qr) == ["quanta_switch_rb"]
    layout = qr["quanta_switch_rb"]
    # Batched (KMO_BATCHED_RING): n, the CPU, first_ns, last_ns, then 64 records: with
    # the ring's 8-byte header, each record at a multiple of its 32 bytes in the ring.
    assert layout.batch is not None
    assert layout.batch.names == ("n", "cpu", "first_ns", "last_ns", "recs")
    assert [layout.batch.fields[f][1] for f in layout.batch.names] == [0, 4, 8, 16, 24]
    assert layout.batch["recs"].shape == (64,) and layout.batch["recs"].base == layout.dtype
    assert layout.batch.itemsize == 24 + 64 * 32
    assert (8 + layout.batch.itemsize) % 32 == 0
    assert layout.name == "quanta_switch_event"
    assert layout.dtype == np.dtype(
        {
            "names": [
                "at_ns", "run_ns_hi", "queued_ns_hi", "run_ns_lo", "queued_ns_lo",
                "prev_pid", "prev_tgid", "next_pid", "next_tgid",
            ],
            "formats": ["<u4", "<u2", "<u2", "<u4", "<u4", "<u4", "<u4", "<u4", "<u4"],
            "offsets": [0, 4, 6, 8, 12, 16, 20, 24, 28],
            "itemsize": 32,
        }
    )  # fmt: skip
    assert layout.batch_gaps == ("at_ns",) and layout.batch_ns == () and layout.us_from_ns == {}
    assert layout.enums == {}
    assert layout.strings == ()


def test_unbatch_adds_the_batchs_time_and_header_to_batch_relative_records() -> None:
    rec = np.dtype([("at", "<u4"), ("v", "<u2")])
    batch = np.dtype([("n", "<u4"), ("cpu", "<u4"), ("first_ns", "<i8"), ("recs", rec, (3,))])
    batches = np.zeros(2, batch)
    batches["n"], batches["cpu"], batches["first_ns"] = [2, 1], [5, 1], [2**40, 10]
    batches["recs"]["at"] = [[0, 2**32 - 1, 7], [3, 9, 9]]
    batches["recs"]["v"] = [[1, 2, 99], [3, 99, 99]]
    layout = RecordLayout("r", rec, {}, (), batch_ns=("at",))
    got = unbatch(batches, layout)
    assert got.dtype.names == ("at", "v", "cpu") and got.dtype["at"] == np.dtype("<i8")
    assert got.tolist() == [(2**40, 1, 5), (2**40 + 2**32 - 1, 2, 5), (13, 3, 1)]
    assert unbatch(batches).dtype == rec  # without the layout: the records as they lie


def test_unbatch_sums_each_batchs_gaps_from_its_first_ns() -> None:
    rec = np.dtype([("at", "<u4"), ("v", "<u2")])
    batch = np.dtype([("n", "<u4"), ("cpu", "<u4"), ("first_ns", "<i8"), ("last_ns", "<i8"),
                      ("recs", rec, (3,))])  # fmt: skip
    batches = np.zeros(3, batch)
    # an empty batch between two: each batch's sum starts again from its first_ns
    batches["n"], batches["cpu"] = [3, 0, 2], [5, 6, 1]
    batches["first_ns"], batches["last_ns"] = [2**40, 0, 10], [2**40 + 2**33, 0, 12]
    batches["recs"]["at"] = [[0, 2**32 - 1, 2**32 - 1], [7, 7, 7], [0, 2, 99]]
    batches["recs"]["v"] = [[1, 2, 3], [99, 99, 99], [4, 5, 99]]
    layout = RecordLayout("r", rec, {}, (), batch_gaps=("at",))
    got = unbatch(batches, layout)
    assert got.dtype.names == ("at", "v", "cpu")  # last_ns is the program's, not a column
    assert got.tolist() == [
        (2**40, 1, 5), (2**40 + 2**32 - 1, 2, 5), (2**40 + 2**33 - 2, 3, 5), (10, 4, 1), (12, 5, 1),
    ]  # fmt: skip


FINGERPRINT_C = r"""
#include "common.h"

struct kmo_fp_event {{
	{fields}
}};

KMO_RING(fp_rb, kmo_fp_event);
"""


def test_a_layout_fingerprint_tells_apart_what_a_record_size_cannot(compile_bpf) -> None:
    def fingerprint(name: str, fields: str) -> str:
        obj = compile_bpf(f"fp_{name}", FINGERPRINT_C.format(fields=fields))
        (layout,) = ring_layouts(obj).values()
        assert layout.itemsize == 16
        # parsed afresh or read back from the spec's cache file: the same digest
        cached = ObjectSpec.from_json(obj, json.loads(spec_path(obj).read_text()))
        print_ = Btf.from_elf(obj).ring_fingerprint("fp_rb")
        assert cached.btf.ring_fingerprint("fp_rb") == print_
        return print_

    base = fingerprint("base", "u64 at; u32 pid; u32 tgid;")
    assert fingerprint("again", "u64 at;  u32 pid; u32 tgid; ") == base  # the same layout
    others = {
        "swapped": "u64 at; u32 tgid; u32 pid;",  # two fields traded places
        "renamed": "u64 at; u32 pid; u32 tid;",
        "signed": "u64 at; s32 pid; u32 tgid;",
        "split": "u32 at; u32 at_hi; u32 pid; u32 tgid;",
        "scaled": "kmo_us_from_ns at; u32 pid; u32 tgid;",  # a typedef's meaning
        "gap": "kmo_batch_gap_ns at; u32 at_hi; u32 pid; u32 tgid;",
        "offset": "kmo_batch_ns at; u32 at_hi; u32 pid; u32 tgid;",
    }
    prints = {name: fingerprint(name, fields) for name, fields in others.items()}
    assert base not in prints.values() and len(set(prints.values())) == len(others)


def test_the_quanta_rings_fingerprint_covers_its_batch(bpf_build_dir) -> None:
    btf = Btf.from_elf(object_path("quanta_runtime", bpf_build_dir))
    print_ = btf.ring_fingerprint("quanta_switch_rb")
    assert len(print_) == 16 and int(print_, 16) >= 0
    batch = btf.ring_batch("quanta_switch_rb")
    assert batch is not None
    # the batch's header, moved where its records are: the records' own types unchanged
    members = [(n, ref, off + (64 if n == "recs" else 0), bits) for n, ref, off, bits in
               batch.members]  # fmt: skip
    btf.types[batch.id] = replace(batch, members=members)
    assert btf.ring_fingerprint("quanta_switch_rb") != print_


def test_objects_without_rings(bpf_build_dir):
    assert ring_layouts(object_path("probe", bpf_build_dir)) == {}
    assert ring_layouts(object_path("filter", bpf_build_dir)) == {}
    assert Btf.from_elf(object_path("probe", bpf_build_dir)).rings() == []


# --- errors -------------------------------------------------------------------
def test_bitfield_member_is_an_error(bad_obj):
    btf = Btf.from_elf(bad_obj)
    with pytest.raises(BtfError, match=r"kmo_bad_bits\.a: bitfields are not supported"):
        record_layout(btf, btf.ring_record("bits_rb"))


def test_anonymous_member_is_an_error(bad_obj):
    btf = Btf.from_elf(bad_obj)
    with pytest.raises(BtfError, match=r"kmo_bad_anon\.: anonymous members are not supported"):
        record_layout(btf, btf.ring_record("anon_rb"))


def test_union_member_is_an_error(bad_obj):
    btf = Btf.from_elf(bad_obj)
    with pytest.raises(BtfError, match=r"kmo_bad_union\.u: cannot map BTF kind UNION"):
        record_layout(btf, btf.ring_record("union_rb"))


def test_one_bad_ring_fails_the_whole_object(bad_obj):
    btf = Btf.from_elf(bad_obj)
    good = record_layout(btf, btf.ring_record("good_rb"))
    assert good.dtype == np.dtype([("ok", "<i8")])
    with pytest.raises(BtfError):
        ring_layouts(bad_obj)


def test_not_a_struct_is_an_error(bad_obj):
    btf = Btf.from_elf(bad_obj)
    with pytest.raises(BtfError, match="'kmo_bad_u' is not a struct"):
        record_layout(btf, btf.find(Kind.UNION, "kmo_bad_u"))


def test_unknown_ring_and_type(records_obj):
    btf = Btf.from_elf(records_obj)
    with pytest.raises(BtfError, match="no var named '__kmo_ring_nope'"):
        btf.ring_record("nope")
    with pytest.raises(BtfError, match="no struct named 'missing'"):
        btf.find(Kind.STRUCT, "missing")


def test_missing_file(tmp_path):
    path = tmp_path / "absent.bpf.o"
    with pytest.raises(BtfError, match=re.escape(f"cannot read {path}")):
        Btf.from_elf(path)


def test_elf_without_btf_section():
    # the Python interpreter is an ELF file built without BTF
    with pytest.raises(BtfError, match=r"no \.BTF section"):
        Btf.from_elf(Path(sys.executable).resolve())


def test_non_elf_file(tmp_path):
    path = tmp_path / "text.bpf.o"
    path.write_text("not an ELF object\n" * 10)
    with pytest.raises(BtfError, match=r"text\.bpf\.o"):
        Btf.from_elf(path)


def test_bad_magic(records_obj):
    data = bytearray(_btf_bytes(records_obj))
    assert struct.unpack_from("<H", data)[0] == BTF_MAGIC
    data[0:2] = b"\x12\x34"
    with pytest.raises(BtfError, match="bad BTF magic 0x3412"):
        Btf.parse(bytes(data))


def test_too_short():
    with pytest.raises(BtfError, match="too short"):
        Btf.parse(struct.pack("<HBBI", BTF_MAGIC, 1, 0, 24))


@pytest.mark.parametrize("keep", [0.25, 0.5, 0.9])
def test_truncated_blob(records_obj, keep):
    data = _btf_bytes(records_obj)
    with pytest.raises(BtfError):
        Btf.parse(data[: int(len(data) * keep)])


# --- enum labels (pure) -------------------------------------------------------
def _enum(*members: tuple[str, int]) -> BtfType:
    return BtfType(1, Kind.ENUM, "e", size=4, members=list(members))


@pytest.mark.parametrize(
    ("members", "labels"),
    [
        ((("KIND_FORK", 0), ("KIND_EXEC", 1)), {0: "fork", 1: "exec"}),
        # the common prefix ends at a word boundary, not inside a word
        ((("STATE_RUNNING", 0), ("STATE_RUNNABLE", 1)), {0: "running", 1: "runnable"}),
        # one name a prefix of another
        ((("FOO_A", 0), ("FOO_A_B", 1)), {0: "a", 1: "a_b"}),
        # no shared word: names kept, lower-cased
        ((("RED", 0), ("REX", 1)), {0: "red", 1: "rex"}),
        # a single enumerator keeps its whole name
        ((("ONLY_ONE", 3),), {3: "only_one"}),
    ],
)
def test_enum_label_prefixes(members, labels):
    assert _enum_labels(_enum(*members)) == labels


def test_kernel_type_agrees_with_a_full_parse_of_vmlinux() -> None:
    """libbpf's lookup by name decodes to the same type as our own full parse."""
    full = Btf.parse(Path("/sys/kernel/btf/vmlinux").read_bytes())
    for kind, name in [
        (Kind.ENUM, "req_op"),
        (Kind.STRUCT, "task_struct"),
        (Kind.STRUCT, "bpf_prog_info"),
        (Kind.UNION, "bpf_attr"),
        (Kind.INT, "int"),
    ]:
        got = kernel_type(kind, name)
        want = full.find(kind, name)
        assert got is not None, name
        assert (got.id, got.kind, got.name, got.size, got.members) == (
            want.id, want.kind, want.name, want.size, want.members,
        ), name  # fmt: skip
    assert kernel_type(Kind.STRUCT, "no_such_struct_kmo") is None
    assert kernel_type(Kind.STRUCT, "req_op") is None  # an enum, not a struct


def test_unbatch_keeps_the_valid_records_in_order() -> None:
    rec = np.dtype([("a", "<u8"), ("b", "<u4")])
    batch = np.dtype({"names": ["n", "recs"], "formats": ["<u4", (rec, (4,))], "offsets": [0, 8]})
    batches = np.zeros(3, batch)
    batches["n"] = [2, 0, 4]
    batches["recs"]["a"] = [[1, 2, 99, 99], [99, 99, 99, 99], [3, 4, 5, 6]]
    got = unbatch(batches)
    assert got.dtype == rec
    assert got["a"].tolist() == [1, 2, 3, 4, 5, 6]
    batches["n"][0] = 1000  # a count past the array (never written so) is capped
    assert len(unbatch(batches)) == 4 + 4
    assert len(unbatch(batches[:0])) == 0
