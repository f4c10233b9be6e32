"""build(): a build folder that cannot be created is a clear BuildError, not an
OSError traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernmlops.ebpf.build import BuildError, build


def test_a_build_folder_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    folder = blocker / "bpf"
    with pytest.raises(BuildError) as info:
        build(folder)
    assert str(info.value) == (
        f"cannot create the BPF build folder {folder}: Not a directory "
        "(set KERNMLOPS_BPF_DIR, or run `kernmlops build-bpf` as its owner)"
    )


def test_a_development_tree_rebuilds_what_is_older_than_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from kernmlops.ebpf import build as b

    built: list[str] = []
    monkeypatch.setattr(b, "compile_object", lambda src, obj, **_: built.append(obj.name))
    monkeypatch.setattr(b, "sources", lambda: [b.SOURCE_DIR / "filter.bpf.c"])
    monkeypatch.setattr("kernmlops.ebpf.spec.object_spec", lambda obj: None)
    obj = tmp_path / "filter.bpf.o"
    obj.write_bytes(b"")
    newest = max(p.stat().st_mtime for p in [b.SOURCE_DIR / "filter.bpf.c",
                                             *b.SOURCE_DIR.glob("*.h")])  # fmt: skip
    os.utime(obj, (newest + 10, newest + 10))
    b.build(tmp_path)
    assert built == []  # newer than every input: kept
    os.utime(obj, (newest - 10, newest - 10))
    b.build(tmp_path)
    assert built == ["filter.bpf.o"]  # older than a source or header: rebuilt


def test_shipped_objects_are_used_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernmlops.ebpf import build as b

    monkeypatch.setattr(b, "PACKAGED_DIR", tmp_path)
    monkeypatch.setattr(b, "compile_object", lambda *a, **k: pytest.fail("compiled"))
    names = [s.name.removesuffix(".c") + ".o" for s in b.sources()]
    for name in names[:-1]:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(BuildError) as info:
        b.build(tmp_path)
    assert f"this installation lacks {names[-1]} in {tmp_path}: reinstall" in str(info.value)
    (tmp_path / names[-1]).write_bytes(b"")
    # Older than the sources (an install sets times in no useful order): still used.
    assert [p.name for p in b.build(tmp_path)] == names
    assert b.shipped()


# --- an installation's own objects, copied into another folder ------------------------
def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installation's bpf_objects, made by the real ship() from two objects (bytes
    of their own, each with a spec naming its digest, as build-bpf writes it) and the
    native library; two sources (the real filter and probe); compile_object records
    what it is asked to build. Returns the shipped folder."""
    import json

    from kernmlops.ebpf import build as b
    from kernmlops.ebpf.spec import spec_path

    built = tmp_path / "built"
    built.mkdir()
    objs = []
    for name in ("filter", "probe"):
        obj = built / f"{name}.bpf.o"
        obj.write_bytes(f"\x7fELF the {name} object".encode())
        spec_path(obj).write_text(json.dumps({"format": 1, "sha256": _digest(obj)}))
        objs.append(obj)
    (built / b.NATIVE_LIBRARY).write_bytes(b"\x7fELF the ring copier")
    real_build = b.build
    monkeypatch.setattr(b, "build", lambda *a, **k: objs)
    monkeypatch.setattr("kernmlops.ebpf.spec.object_spec", lambda obj: None)
    shipped = tmp_path / "site" / "bpf_objects"
    b.ship(shipped)
    monkeypatch.setattr(b, "build", real_build)
    monkeypatch.setattr(b, "PACKAGED_DIR", shipped)
    monkeypatch.setattr(b, "sources", lambda: [b.SOURCE_DIR / "filter.bpf.c",
                                               b.SOURCE_DIR / "probe.bpf.c"])  # fmt: skip

    def compile_object(src: Path, obj: Path, **_: object) -> Path:
        compiled.append(obj.name)
        obj.write_bytes(b"compiled here")
        return obj

    compiled: list[str] = []
    monkeypatch.setattr(b, "compile_object", compile_object)
    monkeypatch.setattr(b, "compiled", compiled, raising=False)
    monkeypatch.setenv("CC", str(tmp_path / "no-cc"))  # the copier is never compiled here
    return shipped


def _same_as_shipped(folder: Path, shipped: Path, name: str) -> bool:
    from kernmlops.ebpf.spec import spec_path

    ours, theirs = folder / name, shipped / name
    same = ours.read_bytes() == theirs.read_bytes() and not ours.is_symlink()
    if name.endswith(".bpf.o"):
        same &= spec_path(ours).read_bytes() == spec_path(theirs).read_bytes()
    return same


def test_another_folder_takes_the_installations_own_objects_not_clang(
    installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KERNMLOPS_BPF_DIR of an installed wheel (the systemd unit's cache, empty at
    the first start): every object and the ring copier are the shipped files, byte
    for byte with their specs; nothing is compiled, then or at the next start."""
    import json

    from kernmlops.ebpf import build as b

    record = json.loads((installed / b.SHIPPED_RECORD).read_text())
    assert record["objects"] == {
        name: _digest(installed / name)
        for name in ("filter.bpf.o", "probe.bpf.o", b.NATIVE_LIBRARY)
    }
    assert record["sources"]["bpf/filter.bpf.c"] == _digest(b.SOURCE_DIR / "filter.bpf.c")
    cache = tmp_path / "cache"
    cache.mkdir()
    objs = b.build(cache)
    assert [o.name for o in objs] == ["filter.bpf.o", "probe.bpf.o"]
    assert b.compiled == []  # type: ignore[attr-defined]
    for name in ("filter.bpf.o", "probe.bpf.o", b.NATIVE_LIBRARY):
        assert _same_as_shipped(cache, installed, name), name
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    b.build(cache)
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == before  # kept
    # the source checkout's rule still holds there: older than its source, replaced
    import os

    os.utime(cache / "probe.bpf.o", (1, 1))
    (cache / "probe.bpf.o").write_bytes(b"stale")
    os.utime(cache / "probe.bpf.o", (1, 1))
    b.build(cache)
    assert _same_as_shipped(cache, installed, "probe.bpf.o")
    assert b.compiled == []  # type: ignore[attr-defined]
    # build-bpf --force compiles, as before
    monkeypatch.setattr(b, "build_native", lambda *a, **k: None)  # no C compiler here
    b.build(cache, force=True)
    assert b.compiled == ["filter.bpf.o", "probe.bpf.o"]  # type: ignore[attr-defined]


def test_a_shipped_object_that_does_not_fit_is_compiled_not_copied(
    installed: Path, tmp_path: Path
) -> None:
    """Copied only when the shipped file is the one recorded, its spec is its own, and
    the sources are those it was built from: a damaged object, a stale spec, or a
    source edited since the install is compiled (clang), never copied."""
    import json

    from kernmlops.ebpf import build as b
    from kernmlops.ebpf.spec import spec_path

    record_path = installed / b.SHIPPED_RECORD
    record = json.loads(record_path.read_text())
    cases = {
        "damaged object": lambda: (installed / "filter.bpf.o").write_bytes(b"other bytes"),
        "its spec another's": lambda: spec_path(installed / "filter.bpf.o").write_text(
            json.dumps({"format": 1, "sha256": "0" * 64})
        ),
        "source edited since": lambda: record_path.write_text(
            json.dumps({**record, "sources": {**record["sources"], "bpf/filter.bpf.c": "1" * 64}})
        ),
    }
    pristine = {p: p.read_bytes() for p in installed.iterdir()}
    for why, spoil in cases.items():
        for path, data in pristine.items():
            path.write_bytes(data)
        spoil()
        cache = tmp_path / why.replace(" ", "-")
        b.compiled.clear()  # type: ignore[attr-defined]
        b.build(cache)
        assert b.compiled == ["filter.bpf.o"], why  # type: ignore[attr-defined]
        assert (cache / "filter.bpf.o").read_bytes() == b"compiled here", why
        assert _same_as_shipped(cache, installed, "probe.bpf.o"), why
    # a header the objects were not built with: nothing is copied
    for path, data in pristine.items():
        path.write_bytes(data)
    sources = {k: v for k, v in record["sources"].items() if k != "bpf/common.h"}
    record_path.write_text(json.dumps({**record, "sources": sources}))
    b.compiled.clear()  # type: ignore[attr-defined]
    b.build(tmp_path / "header")
    assert b.compiled == ["filter.bpf.o", "probe.bpf.o"]  # type: ignore[attr-defined]


def test_a_link_planted_in_the_folder_is_replaced_not_written_through(
    installed: Path, tmp_path: Path
) -> None:
    """The folder may be writable by others: a link where an object goes (older than
    its source, so replaced) is replaced by the copy; its target is left as it was."""
    import os

    from kernmlops.ebpf import build as b
    from kernmlops.ebpf.spec import spec_path

    cache = tmp_path / "cache"
    cache.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"not yours")
    os.utime(victim, (1, 1))
    (cache / "filter.bpf.o").symlink_to(victim)
    spec_path(cache / "filter.bpf.o").symlink_to(victim)
    b.build(cache)
    assert victim.read_bytes() == b"not yours"
    assert _same_as_shipped(cache, installed, "filter.bpf.o")
    assert b.compiled == []  # type: ignore[attr-defined]
