"""build(): a build folder that cannot be created is a clear BuildError, not an
OSError traceback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernmlops.ebpf.build import BuildError, build
from tests.conftest import skip_here


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


# --- as root, a build folder another user can change is refused -------------------------

NOBODY = 65534
_EVIL_C = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARK, "w");
    if (f) { fputs("loaded as root", f); fclose(f); }
}
int kmo_abi(void) { return 8; }
"""


@pytest.fixture
def neighbour(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """(a folder any user may write in, one of nobody's, the file a planted library's
    constructor writes when it is loaded) in a folder of root's any user may enter."""
    import shutil

    if os.geteuid() != 0:  # the neighbour's attack is on root
        skip_here("not root: the planted folders need chown")
    import subprocess
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="kmo-bpfdir-"))
    top.chmod(0o755)
    mark = top / "loaded"
    evil = tmp_path / "evil.so"
    src = tmp_path / "evil.c"
    src.write_text(_EVIL_C)
    cc = subprocess.run(["cc", "-shared", "-fPIC", f'-DMARK="{mark}"', "-o", str(evil),
                         str(src)], capture_output=True, text=True)  # fmt: skip
    if cc.returncode != 0:
        skip_here(f"no C compiler to make the planted library: {cc.stderr.strip()}")
    from kernmlops.ebpf import build as b

    shared, theirs = top / "shared", top / "theirs"
    for folder in (shared, theirs):
        folder.mkdir()
    shared.chmod(0o777)  # an administrator's slip: anyone may add files
    os.chown(theirs, NOBODY, NOBODY)
    newest = max(p.stat().st_mtime for p in [*b.NATIVE_SOURCES, *b.NATIVE_HEADERS,
                                             *b.sources(), *b.SOURCE_DIR.glob("*.h")])  # fmt: skip
    for folder in (shared, theirs):
        # planted by the user, newer than every source: nothing would rebuild them
        for name in (b.NATIVE_LIBRARY, *(f"{s.name.removesuffix('.c')}.o" for s in b.sources())):
            shutil.copyfile(evil if name == b.NATIVE_LIBRARY else tmp_path / "evil.c",
                            folder / name)  # fmt: skip
            os.chown(folder / name, NOBODY, NOBODY)
            os.utime(folder / name, (newest + 60, newest + 60))
    try:
        yield shared, theirs, mark
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_root_refuses_a_build_folder_another_user_can_change(
    neighbour: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """KERNMLOPS_BPF_DIR (or --out) that another user can write in or owns: root would
    load their objects and dlopen their ring copier (the library's constructor runs as
    root). build() refuses it in one line, the CLI exits 1, and the copier does not
    load a library from it (the spool copies in Python)."""
    from click.testing import CliRunner

    from kernmlops.cli import cli
    from kernmlops.ebpf import build as b
    from kernmlops.ebpf import copier

    shared, theirs, mark = neighbour
    for folder, why in [(shared, "any user may write in it"),
                        (theirs, "it belongs to nobody")]:  # fmt: skip
        with pytest.raises(BuildError) as info:
            b.build(folder)
        assert str(info.value) == (
            f"the BPF build folder {folder} can be changed by another user ({why}): as "
            "root, kernmlops loads no object or library from it; use a folder only root "
            "can change (KERNMLOPS_BPF_DIR)"
        )
        r = CliRunner().invoke(cli, ["build-bpf", "--out", str(folder)])
        assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
        assert "can be changed by another user" in r.output and "Traceback" not in r.output
        monkeypatch.setenv("KERNMLOPS_BPF_DIR", str(folder))
        monkeypatch.setattr(copier, "_tried", False)
        monkeypatch.setattr(copier, "_lib", None)
        assert copier.load() is None
        assert not mark.exists(), "root ran the planted library's constructor"
    # a link to a root-only folder, planted in nobody's folder: nobody could point it
    # elsewhere once checked
    good = shared.parent / "good"
    good.mkdir()
    (theirs / "link").symlink_to(good)
    with pytest.raises(BuildError, match="is a link in a folder nobody can change"):
        b.build(theirs / "link")


def test_root_refuses_objects_from_such_a_folder_wherever_it_opens_them(
    neighbour: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Objects opened straight from a folder without build(): `recover --bpf-dir`,
    `doctor` under KERNMLOPS_BPF_DIR (whose build went on to probe after the refusal),
    and every library call that opens one (BpfObject, object_spec, a probe). Working
    objects are planted there, so any of them would load: each refuses the folder in
    one line (the CLI exits 2), before an object is parsed or a spec cached there."""
    import shutil
    import subprocess
    import sys

    from kernmlops.ebpf.build import SOURCE_DIR, UnsafeBuildFolder, object_path
    from kernmlops.ebpf.objects import BpfObject
    from kernmlops.ebpf.probe import probe_program
    from kernmlops.ebpf.spec import object_spec
    from kernmlops.spool.recovery import pending_spools
    from tests.collect.test_recover_compaction import killed_collection

    shared, theirs, mark = neighbour
    for folder, why in [(shared, "any user may write in it"),
                        (theirs, "it belongs to nobody")]:  # fmt: skip
        said = (
            f"the BPF build folder {folder} can be changed by another user ({why}): as "
            "root, kernmlops loads no object or library from it; use a folder only root "
            "can change (KERNMLOPS_BPF_DIR)"
        )
        for name in ("probe", "process_trace"):
            shutil.copyfile(object_path(name), folder / f"{name}.bpf.o")
            os.chown(folder / f"{name}.bpf.o", NOBODY, NOBODY)
        for call, arg in (
            (BpfObject, folder / "probe.bpf.o"),
            (object_spec, folder / "process_trace.bpf.o"),
            (lambda where: probe_program("raw_tp", where), folder),
        ):
            with pytest.raises(UnsafeBuildFolder) as info:
                call(arg)
            assert str(info.value) == said
        col = killed_collection(tmp_path / f"col-{folder.name}")
        cmd = [sys.executable, "-m", "kernmlops"]
        env = {**os.environ, "COLUMNS": "400"}
        for args, where in (
            (["recover", str(col), "--bpf-dir", str(folder)], env),
            (["doctor"], {**env, "KERNMLOPS_BPF_DIR": str(folder)}),
        ):
            r = subprocess.run([*cmd, *args], capture_output=True, text=True, env=where,
                               timeout=120)  # fmt: skip
            assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: {said}\n"), args
        assert pending_spools(col)  # recover read nothing: the spool stays for another try
        # a metric set's own .bpf.o beside its YAML: that set fails to load (--check: 1)
        shutil.copyfile(object_path("exp_migrations"), folder / "mig.bpf.o")
        shutil.copyfile(SOURCE_DIR / "exp_migrations.yaml", folder / "mig.yaml")
        args = ["export", "--check", "-c", str(folder / "mig.yaml"), "--listen", "127.0.0.1:0"]
        r = subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 1 and f"check failed: set mig: {said}\n" in r.stderr, r.stderr
        assert not list(folder.glob("*.spec.json")), "root parsed a planted object"
        assert not mark.exists(), "root ran the planted library's constructor"


def test_a_user_who_cannot_reach_the_objects_folder_is_told_in_one_line() -> None:
    # Issue: another user with root's HOME (setpriv, su without -l) found the objects'
    # default folder under /root/.cache: os.stat raised PermissionError, a traceback.
    from tests.nobody import as_nobody, reachable_folder

    with reachable_folder("kernmlops-bpf-dir-") as base:
        private = base / "roots"
        (private / "bpf").mkdir(parents=True)
        private.chmod(0o700)
        said: list[str] = []

        def step() -> None:
            try:
                build(private / "bpf")
            except BuildError as err:
                said.append(str(err))
            assert said == [
                f"cannot read the BPF objects' folder {private / 'bpf'}: permission denied "
                "(set KERNMLOPS_BPF_DIR to a folder this user may read, or HOME to its own)"
            ], said

        as_nobody(step)
