"""Object specs: one parse of each object's ELF, checked against llvm-readelf
and libbpf, and the cache beside the object (kept, refreshed, or bypassed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernmlops.ebpf import spec as spec_mod
from kernmlops.ebpf.btf import Btf, BtfError
from kernmlops.ebpf.build import sources
from kernmlops.ebpf.objects import BpfObject
from kernmlops.ebpf.spec import (
    GlobalVar,
    ObjectSpec,
    object_spec,
    parse_object,
    ring_layouts,
    spec_path,
)

READELF = shutil.which("llvm-readelf")


def _objects(build_dir: Path) -> list[Path]:
    return [build_dir / (s.name.removesuffix(".bpf.c") + ".bpf.o") for s in sources()]


def _readelf_symbols(obj: Path) -> tuple[dict[str, GlobalVar], dict[str, str]]:
    """(globals, programs) as llvm-readelf lists them: OBJECT symbols with their
    section, offset and size; FUNC symbols outside .text with their section."""
    assert READELF, "llvm-readelf missing: apt-get install llvm"
    sections = {}
    out = subprocess.run([READELF, "-S", "--wide", str(obj)], capture_output=True, text=True)
    for m in re.finditer(r"^\s*\[\s*(\d+)\]\s+(\S+)", out.stdout, re.M):
        sections[m.group(1)] = m.group(2)
    symbols = subprocess.run([READELF, "-s", "--wide", str(obj)], capture_output=True, text=True)
    globals_, programs = {}, {}
    for line in symbols.stdout.splitlines():
        parts = line.split()
        if len(parts) != 8 or not parts[6].isdigit():
            continue
        _num, value, size, kind, _bind, _vis, ndx, name = parts
        where = sections[ndx]
        if kind == "OBJECT":
            globals_[name] = GlobalVar(where, int(value, 16), int(size))
        elif kind == "FUNC" and where != ".text":
            programs[name] = where
    return globals_, programs


def test_every_object_spec_matches_readelf_and_libbpf(bpf_build_dir: Path) -> None:
    for obj in _objects(bpf_build_dir):
        spec = parse_object(obj)
        globals_, programs = _readelf_symbols(obj)
        assert spec.globals == globals_, obj.name
        assert spec.programs == programs, obj.name
        with BpfObject(obj) as loaded:  # libbpf's own list of programs
            assert {n: p.section for n, p in loaded.programs.items()} == spec.programs
            variants = any(p.variant for p in loaded.programs.values())
        assert spec.has_variants == variants, obj.name
        # the BTF is the one pyelftools reads from the .BTF section
        assert spec.btf.types == Btf.from_elf(obj).types, obj.name


def test_quanta_runtime_spec_names_its_settings(bpf_build_dir: Path) -> None:
    spec = parse_object(bpf_build_dir / "quanta_runtime.bpf.o")
    tgid = spec.globals["kmo_self_tgid"]
    assert tgid == GlobalVar(".rodata", tgid.offset, 4) and tgid.offset % 4 == 0
    assert spec.globals["kmo_filter_on"].section == ".rodata"
    assert spec.globals["kmo_ring_groups"] == GlobalVar(".rodata", 0, 4)  # common.h's first
    assert spec.programs == {
        "switch_btf": "tp_btf/sched_switch",
        "switch_raw": "raw_tp/sched_switch",
    }
    assert spec.has_variants
    assert spec.btf.rings() == ["quanta_switch_rb"]


@pytest.fixture
def own_copy(bpf_build_dir: Path, tmp_path: Path) -> Path:
    """An object in a folder of the test's own, with no spec beside it yet."""
    obj = tmp_path / "quanta_runtime.bpf.o"
    shutil.copyfile(bpf_build_dir / "quanta_runtime.bpf.o", obj)
    spec_mod._cache.clear()
    yield obj
    spec_mod._cache.clear()


def test_spec_is_cached_beside_the_object_and_read_back_without_the_elf(
    own_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = object_spec(own_copy)
    cached = spec_path(own_copy)
    assert cached.exists()
    assert json.loads(cached.read_text())["sha256"] == first.sha256

    spec_mod._cache.clear()

    def no_elf(*args: object, **kwargs: object) -> ObjectSpec:
        raise AssertionError("the ELF was parsed again")

    monkeypatch.setattr(spec_mod, "parse_object", no_elf)
    again = object_spec(own_copy)
    assert again is not first
    assert again.btf.types == first.btf.types
    assert again.globals == first.globals and again.programs == first.programs
    assert object_spec(own_copy) is again  # then from memory
    layouts, expected = again.ring_layouts(), first.ring_layouts()
    assert layouts.keys() == expected.keys()
    for ring, layout in layouts.items():
        assert layout.dtype == expected[ring].dtype and layout.batch == expected[ring].batch


def test_a_changed_object_is_parsed_again(own_copy: Path, bpf_build_dir: Path) -> None:
    object_spec(own_copy)
    shutil.copyfile(bpf_build_dir / "process_trace.bpf.o", own_copy)  # rebuilt, same name
    spec = object_spec(own_copy)
    assert spec.btf.rings() == ["process_trace_rb"]
    assert json.loads(spec_path(own_copy).read_text())["sha256"] == spec.sha256
    spec_mod._cache.clear()
    assert ring_layouts(own_copy).keys() == {"process_trace_rb"}


def test_a_damaged_cache_is_rebuilt(own_copy: Path) -> None:
    good = object_spec(own_copy)
    spec_mod._cache.clear()
    spec_path(own_copy).write_text("{not json")
    assert object_spec(own_copy).globals == good.globals
    assert json.loads(spec_path(own_copy).read_text())["sha256"] == good.sha256


def test_a_cache_that_cannot_be_written_costs_only_time(own_copy: Path) -> None:
    # A folder where the cache cannot go (a user reading root's build folder; here
    # a directory in the way of the rename): the spec still comes, nothing is left.
    spec_path(own_copy).mkdir()
    assert spec_mod.save_spec(parse_object(own_copy)) is False
    assert object_spec(own_copy).programs["switch_btf"] == "tp_btf/sched_switch"
    assert {p.name for p in own_copy.parent.iterdir()} == {own_copy.name, spec_path(own_copy).name}


def test_missing_and_foreign_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(BtfError, match="cannot read"):
        object_spec(tmp_path / "absent.bpf.o")
    bogus = tmp_path / "bogus.bpf.o"
    bogus.write_bytes(b"not an ELF file at all")
    with pytest.raises(BtfError, match="not an ELF object"):
        object_spec(bogus)
