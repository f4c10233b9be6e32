"""Small files made huge (sparse: no disk taken, but every byte read whole into memory
before): a collection's manifest, a spool's done mark, a fleet's index row, _damaged/
marker and published manifest. Each reader refuses one past its limit in one line,
exit non-zero, and leaves it as it was; and, as root, a manifest that is a link a user
planted is not read."""

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
from tests.fleet.conftest import make_collection
from tests.nobody import as_nobody, reachable_folder

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
