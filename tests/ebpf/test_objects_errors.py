"""BpfObject before load: open, inspect, configure, close. No root, no kernel.

Opening an object only parses the ELF in libbpf, so all of this runs as any
user; nothing here calls load().
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from kernmlops.ebpf import libbpf
from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.libbpf import LibbpfError
from kernmlops.ebpf.objects import VARIANTS, BpfObject, object_info
from tests.conftest import without_task_storage

RINGBUF = 27  # BPF_MAP_TYPE_RINGBUF

VARIANTS_C = r"""
#include "common.h"

const volatile u32 kmo_test_knob = 7;
const volatile s16 kmo_test_neg = 0;
const volatile bool kmo_test_flag = false;
u64 kmo_test_counter = 0;

SEC("tp_btf/sched_switch")
int kmo_switch_btf(void *ctx) { return kmo_test_knob + kmo_test_neg + kmo_test_flag; }

SEC("raw_tp/sched_switch")
int kmo_switch_raw(void *ctx) { return 0; }

SEC("tp_btf/sched_wakeup")
int kmo_wakeup_btf(void *ctx) { return 0; }

SEC("raw_tp/sched_wakeup")
int kmo_wakeup_raw(void *ctx) { return 0; }

SEC("tracepoint/sched/sched_switch")
int kmo_plain(void *ctx) { __sync_fetch_and_add(&kmo_test_counter, 1); return 0; }

SEC("tracepoint/sched/sched_wakeup")
int kmo_wakeup_prog(void *ctx) { return 0; }
"""

BTF_PROGS = {"kmo_switch_btf", "kmo_wakeup_btf"}
RAW_PROGS = {"kmo_switch_raw", "kmo_wakeup_raw"}
PLAIN_PROGS = {"kmo_plain", "kmo_wakeup_prog"}


@pytest.fixture(scope="module")
def variants_obj(compile_bpf) -> Path:
    return compile_bpf("variants", VARIANTS_C)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rodata(obj: BpfObject) -> bytes:
    """The initial value of the object's .rodata, as set before load."""
    ro = libbpf.lib.bpf_object__find_map_by_name(obj._ptr, b".rodata")
    assert ro
    size = ctypes.c_size_t()
    base = libbpf.lib.bpf_map__initial_value(ro, ctypes.byref(size))
    assert base
    return ctypes.string_at(base, size.value)


def _rodata_offsets(path: Path) -> dict[str, tuple[int, int]]:
    with path.open("rb") as fh:
        elf = ELFFile(fh)
        rodata = elf.get_section_by_name(".rodata")
        assert rodata is not None
        index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == ".rodata")
        return {
            s.name: (s["st_value"], s["st_size"])
            for s in elf.get_section_by_name(".symtab").iter_symbols()
            if s["st_shndx"] == index and s["st_info"]["type"] == "STT_OBJECT"
        }


# --- open ---------------------------------------------------------------------
def test_missing_path_names_the_path(tmp_path):
    path = tmp_path / "nowhere" / "absent.bpf.o"
    with pytest.raises(LibbpfError, match=r"absent\.bpf\.o") as excinfo:
        BpfObject(path)
    assert str(path) in str(excinfo.value)
    # Issue: it said "make bpf", a target an installed wheel's user does not have; the
    # command it names is one the CLI has
    assert "make bpf" not in str(excinfo.value)
    assert "(build it: kernmlops build-bpf)" in str(excinfo.value)
    from click.testing import CliRunner

    from kernmlops.cli import cli

    assert CliRunner().invoke(cli, ["build-bpf", "--help"]).exit_code == 0


@pytest.mark.parametrize("exists", [False, True])
def test_failed_open_leaves_nothing_for_the_garbage_collector(tmp_path, monkeypatch, exists):
    path = tmp_path / "broken.bpf.o"
    if exists:
        path.write_text("not an ELF object\n")
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(LibbpfError, match=r"broken\.bpf\.o"):
        BpfObject(path)
    gc.collect()
    assert [u.exc_value for u in unraisable] == []


def test_non_elf_file_is_a_libbpf_error(tmp_path):
    path = tmp_path / "text.bpf.o"
    path.write_text("not an ELF object\n")
    with pytest.raises(LibbpfError, match=r"open text\.bpf\.o") as excinfo:
        BpfObject(path)
    assert "is not a proper ELF object" in excinfo.value.log


def test_built_object_lists_programs_and_maps(bpf_build_dir):
    with BpfObject(object_path("process_trace", bpf_build_dir)) as obj:
        assert {n: p.section for n, p in obj.programs.items()} == {
            "fork_btf": "tp_btf/sched_process_fork",
            "exec_btf": "tp_btf/sched_process_exec",
            "exit_btf": "tp_btf/sched_process_exit",
            "fork_raw": "raw_tp/sched_process_fork",
            "exec_raw": "raw_tp/sched_process_exec",
            "exit_raw": "raw_tp/sched_process_exit",
        }
        assert {n: p.variant for n, p in obj.programs.items()} == {
            "fork_btf": "btf",
            "exec_btf": "btf",
            "exit_btf": "btf",
            "fork_raw": "raw",
            "exec_raw": "raw",
            "exit_raw": "raw",
        }
        assert all(p.autoload for p in obj.programs.values())
        names = set(obj.maps)
        # the ring, and its array for ring groups (common.h, KMO_RING)
        ours = {"drops", "kmo_tracked", "process_trace_rb", "process_trace_rb_groups"}
        assert ours <= names
        assert [n for n in names - ours] == [next(n for n in names if n.endswith(".rodata"))]
        ring = obj.map("process_trace_rb")
        assert ring.type == RINGBUF
        assert ring.max_entries == 1 << 22
        ring.max_entries = 1 << 16  # allowed before load
        assert ring.max_entries == 1 << 16
        assert obj.map("drops").max_entries == 8
        assert obj.map("drops").key_size == 4
        assert obj.map("drops").value_size == 8
        assert not obj.loaded

    with BpfObject(object_path("quanta_runtime", bpf_build_dir)) as obj:
        assert set(obj.programs) == {f"switch_{v}" for v in VARIANTS}
        assert {"drops", "kmo_tracked", "quanta_switch_rb", "oncpu"} <= set(obj.maps)


def test_unknown_map_is_named(bpf_build_dir):
    with (
        BpfObject(object_path("filter", bpf_build_dir)) as obj,
        pytest.raises(LibbpfError, match=r"filter\.bpf\.o has no map 'nope'"),
    ):
        obj.map("nope")


def test_object_info_lists_autoloaded_programs(variants_obj):
    with BpfObject(variants_obj) as obj:
        obj.select_variant("raw")
        info = object_info(obj)
    assert info["path"] == str(variants_obj)
    assert info["variant"] == "raw"
    assert info["programs"] == {
        "kmo_switch_raw": "raw_tp/sched_switch",
        "kmo_wakeup_raw": "raw_tp/sched_wakeup",
        "kmo_plain": "tracepoint/sched/sched_switch",
        "kmo_wakeup_prog": "tracepoint/sched/sched_wakeup",
    }
    assert "drops" in info["maps"]
    assert info["maps"] == sorted(info["maps"])


# --- variants -----------------------------------------------------------------
def test_program_variants(variants_obj):
    with BpfObject(variants_obj) as obj:
        assert set(obj.programs) == BTF_PROGS | RAW_PROGS | PLAIN_PROGS
        assert {n for n, p in obj.programs.items() if p.variant == "btf"} == BTF_PROGS
        assert {n for n, p in obj.programs.items() if p.variant == "raw"} == RAW_PROGS
        assert {n for n, p in obj.programs.items() if p.variant is None} == PLAIN_PROGS


@pytest.mark.parametrize(
    ("variant", "loaded"),
    [
        ("btf", BTF_PROGS | PLAIN_PROGS),
        ("raw", RAW_PROGS | PLAIN_PROGS),
        (None, PLAIN_PROGS),
    ],
)
def test_select_variant_sets_autoload(variants_obj, variant, loaded):
    with BpfObject(variants_obj) as obj:
        assert obj.variant is None
        obj.select_variant(variant)
        assert obj.variant == variant
        assert {n for n, p in obj.programs.items() if p.autoload} == loaded


def test_select_variant_twice_switches(variants_obj):
    with BpfObject(variants_obj) as obj:
        obj.select_variant("btf")
        obj.select_variant("raw")
        assert {n for n, p in obj.programs.items() if p.autoload} == RAW_PROGS | PLAIN_PROGS


# --- globals ------------------------------------------------------------------
def test_set_globals_writes_rodata(variants_obj):
    offsets = _rodata_offsets(variants_obj)
    # and common.h's own (ring groups, set where a hook has more than one ring)
    ring_groups = {"kmo_ring_groups", "kmo_ring_group_shift", "kmo_ring_group_cpus"}
    assert set(offsets) == {"kmo_test_knob", "kmo_test_neg", "kmo_test_flag", *ring_groups}
    with BpfObject(variants_obj) as obj:
        before = _rodata(obj)
        off, size = offsets["kmo_test_knob"]
        assert before[off : off + size] == (7).to_bytes(4, "little")
        obj.set_globals({"kmo_test_knob": 0xA1B2C3D4, "kmo_test_neg": -2, "kmo_test_flag": True})
        after = _rodata(obj)
    expected = bytearray(before)
    for name, raw in (
        ("kmo_test_knob", b"\xd4\xc3\xb2\xa1"),
        ("kmo_test_neg", b"\xfe\xff"),
        ("kmo_test_flag", b"\x01"),
    ):
        off, size = offsets[name]
        assert size == len(raw)
        expected[off : off + size] = raw
    assert after == bytes(expected)


def test_set_globals_unknown_name(variants_obj):
    with BpfObject(variants_obj) as obj:
        before = _rodata(obj)
        with pytest.raises(LibbpfError, match="has no const volatile global 'kmo_nope'"):
            obj.set_globals({"kmo_nope": 1})
        assert _rodata(obj) == before


def test_set_globals_rejects_a_writable_global(variants_obj):
    with (
        BpfObject(variants_obj) as obj,
        pytest.raises(LibbpfError, match="no const volatile global 'kmo_test_counter'"),
    ):
        obj.set_globals({"kmo_test_counter": 1})


def test_set_globals_without_rodata(bpf_build_dir):
    with BpfObject(object_path("probe", bpf_build_dir)) as obj:
        obj.set_globals({})  # nothing to set: fine
        with pytest.raises(LibbpfError, match=r"probe\.bpf\.o has no \.rodata for \['x'\]"):
            obj.set_globals({"x": 1})


# --- close and fds ------------------------------------------------------------
def test_close_twice(variants_obj):
    obj = BpfObject(variants_obj)
    obj.close()
    obj.close()
    assert obj.links == ()
    with obj:
        pass  # exiting closes again
    del obj
    gc.collect()


def test_no_fd_leak(variants_obj, bpf_build_dir, tmp_path):
    bad = tmp_path / "bad.bpf.o"
    bad.write_text("not an ELF object\n")
    paths = [variants_obj, *(object_path(n, bpf_build_dir) for n in ("process_trace", "filter"))]
    BpfObject(paths[0]).close()  # warm up: libbpf and ctypes set up once
    gc.collect()
    before = _open_fds()
    for i in range(20):
        obj = BpfObject(paths[i % len(paths)])
        obj.select_variant("btf")
        if obj.path == variants_obj:
            obj.set_globals({"kmo_test_knob": i})
        obj.close()
        with BpfObject(paths[(i + 1) % len(paths)]) as obj:
            assert obj.programs
        with pytest.raises(LibbpfError):
            BpfObject(bad)
    gc.collect()
    assert _open_fds() == before


def test_without_task_storage_an_object_that_needs_it_is_refused_in_one_line(
    bpf_build_dir, monkeypatch
):
    """On a kernel without task storage (before Linux 5.11): an object whose programs
    keep their state there (syscalls') is refused before load, in one line; one that
    can do without (quanta_runtime's ``kmo_task_storage``) has the global cleared and
    its storage map made a one-entry hash, which a kernel without storage makes. The
    load itself needs root (tests/hooks/test_quanta_runtime.py loads it)."""
    without_task_storage(monkeypatch)
    with (
        BpfObject(object_path("syscalls", bpf_build_dir)) as obj,
        pytest.raises(LibbpfError) as err,
    ):
        obj.load()
    assert str(err.value) == (
        "syscalls.bpf.o needs BPF task storage (Linux 5.11 or later), which this kernel "
        "does not have"
    )
    path = object_path("quanta_runtime", bpf_build_dir)
    off, size = _rodata_offsets(path)["kmo_task_storage"]
    with BpfObject(path) as obj:
        assert _rodata(obj)[off : off + size] == b"\x01"
        obj._without_task_storage()  # load() but the kernel's part
        store = obj.map("quanta_task_cpu")
        assert (store.type, store.max_entries) == (libbpf.MAP_TYPE_HASH, 1)
        assert _rodata(obj)[off : off + size] == b"\x00"
