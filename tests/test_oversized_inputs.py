"""Small files made huge (sparse: no disk taken, but every byte read whole into memory
before): a collection's manifest, a spool's done mark, a fleet's index row, _damaged/
marker and published manifest. Each reader refuses one past its limit in one line,
exit non-zero, and leaves it as it was; and, as root, a manifest that is a link a user
planted is not read. A spool segment, which may be large, is read a frame at a time."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.cli import cli
from kernmlops.collect.manifest import read_manifest
from kernmlops.errors import CollectionError
from kernmlops.spool.collection import MANIFEST_MAX_BYTES, spool_done
from kernmlops.spool.frames import FRAME, ZSTD_MAGIC
from tests.fleet.conftest import make_collection
from tests.nobody import NOBODY, as_nobody, reachable_folder

OVER = MANIFEST_MAX_BYTES + (1 << 20)


def _huge(path: Path, size: int = OVER) -> int:
    """``path`` made ``size`` bytes long, its start kept (a sparse tail of zeros)."""
    os.truncate(path, size)
    return size


def test_a_huge_manifest_is_one_line_for_each_reader(tmp_path: Path) -> None:
    col = make_collection(tmp_path / "data", "c1", quanta=200)
    _huge(col / "manifest.json")
    with pytest.raises(CollectionError, match=r"17.0 MiB, over the 16.0 MiB limit: not read"):
        read_manifest(col)
    for args in (["graph", str(col), "-o", str(tmp_path / "g")], ["recover", str(col)],
                 ["push", str(col), str(tmp_path / "fleet")]):  # fmt: skip
        result = CliRunner().invoke(cli, args)
        assert result.exit_code != 0, (args, result.output)
        assert "Traceback" not in result.output
        assert "over the 16.0 MiB limit" in result.output, (args, result.output)
    assert (col / "manifest.json").stat().st_size == OVER


def test_a_huge_done_mark_is_no_mark(tmp_path: Path) -> None:
    spool = tmp_path / ".spool"
    spool.mkdir()
    (spool / "done").write_text('{"segments": {}}')
    assert spool_done(spool)
    _huge(spool / "done", 64 << 20)
    tracemalloc.start()
    try:
        assert not spool_done(spool)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak:,} bytes taken to refuse it"  # read whole before


def test_huge_files_in_a_fleet_are_named_not_read(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_collection(src, "c1", quanta=200)
    make_collection(src, "c2", quanta=200)
    dest = tmp_path / "fleet"
    runner = CliRunner()
    assert runner.invoke(cli, ["push", str(src), str(dest)]).exit_code == 0
    _huge(dest / "_index" / "c1.parquet")
    (dest / "_damaged").mkdir()
    (dest / "_damaged" / "zz.json").write_text('{"path": "x", "reason": "y"}')
    _huge(dest / "_damaged" / "zz.json", (1 << 20) + 1)
    listed = runner.invoke(cli, ["fleet", "ls", str(dest)])
    assert listed.exit_code == 1 and "Traceback" not in listed.output
    assert "_index/c1.parquet: not a readable index file (over the 16.0 MiB limit" in (
        listed.stderr
    ), listed.stderr
    assert "zz: damaged (its marker _damaged/zz.json is not readable)" in listed.stderr
    manifest = dest / "benchmark=faux" / "collection_id=c2" / "manifest.json"
    _huge(manifest)
    again = runner.invoke(cli, ["fleet", "reindex", str(dest)])
    assert again.exit_code == 1 and "Traceback" not in again.output
    assert "manifest.json: over the 16.0 MiB limit" in again.stderr, again.stderr
    assert manifest.stat().st_size == OVER
    assert (dest / "_damaged" / "zz.json").exists() is False  # a stale marker, as before


def test_a_manifest_linked_elsewhere_is_not_read_as_root() -> None:
    """nobody's collection whose manifest.json is a link to a manifest of root's only
    (another collection): read_manifest, which recover and push use, refuses the link
    (it read root's, and recover wrote it back into nobody's folder)."""
    with reachable_folder("kmo-manifest-link-") as top:
        private = make_collection(top / "root-only", "secret-run", quanta=50)
        (top / "root-only").chmod(0o700)
        col = make_collection(top / "alice", "c1", quanta=50)
        for path in [top / "alice", *(top / "alice").rglob("*")]:
            os.chown(path, 65534, 65534, follow_symlinks=False)

        def plant() -> None:
            (col / "manifest.json").unlink()
            (col / "manifest.json").symlink_to(private / "manifest.json")

        as_nobody(plant)
        with pytest.raises(CollectionError, match="cannot read the manifest: a link"):
            read_manifest(col)


def test_a_huge_spool_description_is_damaged_not_read(tmp_path: Path) -> None:
    """A ring's description and a segment's json made 64 MiB: recover names each as
    damaged, over its limit, keeps the spool, and never holds the bytes."""
    from kernmlops.collect.recovery import recover
    from tests.collect.test_recover_compaction import killed_collection

    col = killed_collection(tmp_path / "col")
    described = sorted((col / ".spool").glob("*.json"))
    for path in described:
        _huge(path, 64 << 20)
    tracemalloc.start()
    try:
        done = recover(col)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20, f"{peak:,} bytes held"  # each read whole before (134 MB)
    assert done.lost and all("over the 1.0 MiB limit" in lost.reason for lost in done.lost)
    assert [p.stat().st_size for p in described] == [64 << 20] * len(described)
    assert list((col / ".spool").glob("*.ring")), "the spool stays"


#: a spool segment its user made this long (a sparse tail: no disk taken)
PLANTED = 6 << 30
#: the address space the recover of it runs in: about 5 times what it takes (0.4 GiB),
#: far under the planted segment, which it read whole before (MemoryError)
RECOVER_AS = 2 << 30


@pytest.mark.parametrize("claim", [False, True], ids=["sparse-tail", "frame-claiming-3GiB"])
def test_a_huge_segment_its_user_planted_is_read_a_frame_at_a_time(claim: bool) -> None:
    """nobody makes the spool segment of their killed collection 6 GiB (a sparse tail;
    or first a frame header that claims 3 GiB, which the file then holds): root's
    recover, in 2 GiB of address space, makes every row the real frames hold, as from
    the spool as it was, names the rest in one line, keeps the spool, and its memory
    does not grow with the file."""
    from tests.collect.test_recover_compaction import SPOOLED, _pids, killed_collection

    with reachable_folder("kmo-huge-segment-") as top:
        col = killed_collection(top / "alice" / "col")
        for path in [top / "alice", *(top / "alice").rglob("*")]:
            os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
        (seg,) = (col / ".spool").glob("*.ring")
        end = seg.stat().st_size

        def plant() -> None:
            if claim:
                with open(seg, "ab") as f:
                    f.write(FRAME.pack(3 << 30, 1 << 20) + ZSTD_MAGIC)
            os.truncate(seg, PLANTED)

        as_nobody(plant)
        code, stderr, peak = _recover_bounded(col)
        assert "Traceback" not in stderr and "MemoryError" not in stderr, stderr
        assert code == 2, stderr
        why = "a damaged frame header"
        if claim:
            why += f" (it claims {3 << 30:,} bytes, over the {256 << 20:,} a frame holds at most)"
        lost = [line for line in stderr.splitlines() if line.startswith("lost: ")]
        said = f"lost: {seg}: {PLANTED - end:,} bytes not recovered: {why} at byte {end:,}"
        assert lost == [said], stderr
        assert _pids(col) == list(range(SPOOLED))  # every row, once, in order: as unplanted
        assert seg.stat().st_size == PLANTED  # the spool is kept
        assert peak < 512 << 20, f"{peak:,} bytes resident"


# `kernmlops recover` run in a process that says its own peak resident memory at exit:
# VmHWM of the memory it exec'd into (the rusage's ru_maxrss also holds the memory of
# the pytest process it was forked from, hundreds of MB late in a suite)
_RECOVER_SAYING_ITS_PEAK = """
import atexit, re, runpy, sys
told = sys.argv[2]
def said():
    with open("/proc/self/status") as f:
        kib = re.search(r"^VmHWM:\\s+(\\d+) kB", f.read(), re.M).group(1)
    with open(told, "w") as out:
        out.write(kib)
atexit.register(said)
sys.argv = ["kernmlops", "recover", sys.argv[1]]
runpy.run_module("kernmlops", run_name="__main__", alter_sys=True)
"""


def _recover_bounded(col: Path) -> tuple[int, str, int]:
    """``kernmlops recover col`` as root for nobody (sudo's variables), in RECOVER_AS
    of address space: its exit code, its stderr, and its peak resident bytes."""
    import resource
    import subprocess
    import sys
    import tempfile

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (RECOVER_AS, RECOVER_AS))
        resource.setrlimit(resource.RLIMIT_CPU, (120, 120))  # never a hung test

    env = {**os.environ, "COLUMNS": "400", "SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY),
           "SUDO_USER": "nobody"}  # fmt: skip
    with tempfile.TemporaryFile("w+") as err, tempfile.NamedTemporaryFile("r") as peak:
        proc = subprocess.run(
            [sys.executable, "-c", _RECOVER_SAYING_ITS_PEAK, str(col), peak.name],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
            preexec_fn=limits, check=False,
        )  # fmt: skip
        err.seek(0)
        return proc.returncode, err.read(), int(peak.read()) * 1024
