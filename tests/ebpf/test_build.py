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
