"""A local dataset other users may write in (a fleet's folder on a shared mount, one
folder for many machines), pushed to and reindexed as root: what a user (nobody, in a
forked child) plants there makes root write nowhere else, through no link."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.cli import cli
from tests.fleet.conftest import make_collection
from tests.nobody import NOBODY, as_nobody, reachable_folder

SECRET = b"root's own: never to be overwritten\n"


@pytest.fixture
def top() -> Iterator[Path]:
    with reachable_folder("kmo-hostile-fleet-") as folder:
        yield folder


def shared(tmp_path: Path) -> tuple[Path, Path]:
    """(a dataset folder any user may write in, sticky as /tmp; a folder of root's only
    beside it, holding root's files)."""
    dest = tmp_path / "fleet"
    dest.mkdir()
    dest.chmod(0o1777)
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    (victim / "secret.json").write_bytes(SECRET)
    return dest, victim


def test_reindex_writes_no_marker_outside_the_dataset_for_a_name_with_slashes(top: Path) -> None:
    """A damaged collection in a folder whose id unquotes to '../..': its _damaged/
    marker is written in _damaged/, not where the '..'s lead (root's secret.json)."""
    dest, victim = shared(top)
    src = top / "src"
    make_collection(src, "c1", quanta=300)
    assert CliRunner().invoke(cli, ["push", str(src), str(dest)]).exit_code == 0

    def plant() -> None:
        folder = dest / "benchmark=mine" / "collection_id=..%2F..%2Froot-only%2Fsecret"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text("{damaged\n")

    as_nobody(plant)
    result = CliRunner().invoke(cli, ["fleet", "reindex", str(dest)])
    assert "Traceback" not in result.output
    assert result.exit_code == 1, result.output  # one damaged collection, said
    assert "not indexed, damaged" in result.stderr
    assert (victim / "secret.json").read_bytes() == SECRET
    assert sorted(p.name for p in victim.iterdir()) == ["secret.json"]
    (marker,) = (dest / "_damaged").iterdir()
    assert marker.name.endswith(".json") and "/" not in marker.name
    # ls names it, from that marker
    listed = CliRunner().invoke(cli, ["fleet", "ls", str(dest)])
    assert "collection_id=..%2F..%2Froot-only%2Fsecret" in listed.stderr, listed.output


def test_push_writes_through_no_link_a_user_planted_in_the_dataset(top: Path) -> None:
    """nobody makes the collection's folder in the shared dataset first and plants
    links at the names push writes (the temporary ones, a table's folder): root's
    files stay as they were, and the pushed collection is whole in the dataset."""
    dest, victim = shared(top)
    src = top / "src"
    col = make_collection(src, "c1", quanta=300)
    tables = sorted(p.name for p in col.iterdir() if p.is_dir())

    def plant() -> None:
        there = dest / "benchmark=faux" / "collection_id=c1"
        there.mkdir(parents=True)
        (there / ".manifest.json.push-tmp").symlink_to(victim / "secret.json")
        (there / tables[0]).symlink_to(victim)  # a table's folder, a link to root's
        index = dest / "_index"
        index.mkdir()
        (index / ".c1.parquet.push-tmp").symlink_to(victim / "secret.json")

    as_nobody(plant)
    result = CliRunner().invoke(cli, ["push", str(src), str(dest)])
    assert "Traceback" not in result.output
    assert (victim / "secret.json").read_bytes() == SECRET
    assert sorted(p.name for p in victim.iterdir()) == ["secret.json"]
    assert result.exit_code != 0, result.output  # the linked table folder is refused
    assert "is a link" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_reindex_deletes_nothing_through_a_linked_index_folder(top: Path) -> None:
    """nobody replaces _index and _damaged with links to a folder of root's: reindex
    deletes no file of root's there (it took them for stale index rows and markers)."""
    dest, victim = shared(top)
    (victim / "stale.parquet").write_bytes(SECRET)
    src = top / "src"
    make_collection(src, "c1", quanta=300)
    assert CliRunner().invoke(cli, ["push", str(src), str(dest)]).exit_code == 0
    # the dataset's top folders, as a user who writes there may leave them
    for name in ("_index", "_damaged"):
        (dest / name).mkdir(exist_ok=True)
        os.chown(dest / name, NOBODY, NOBODY)
    (dest / "_index" / "c1.parquet").unlink()

    def plant() -> None:
        for name in ("_index", "_damaged"):
            os.rename(dest / name, dest / f"{name}.old")
            (dest / name).symlink_to(victim)

    as_nobody(plant)
    result = CliRunner().invoke(cli, ["fleet", "reindex", str(dest)])
    assert "Traceback" not in result.output
    assert sorted(p.name for p in victim.iterdir()) == ["secret.json", "stale.parquet"]
    assert (victim / "stale.parquet").read_bytes() == SECRET
    assert result.exit_code != 0, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_reindex_and_ls_follow_no_link_a_user_put_in_the_dataset(top: Path) -> None:
    """nobody links a collection folder, a manifest and an index row in the shared
    dataset to root's own (a collection in a folder only root can read): reindex as root
    indexes none of them, and ls lists none (both read them, and wrote the private
    collection's row, where every user reads it)."""
    dest, victim = shared(top)
    src = top / "src"
    make_collection(src, "c1", quanta=300)
    private = make_collection(victim, "private-run", quanta=300)
    assert CliRunner().invoke(cli, ["push", str(src), str(dest)]).exit_code == 0
    elsewhere = top / "root-index"
    elsewhere.mkdir(mode=0o700)
    assert CliRunner().invoke(cli, ["push", str(victim), str(elsewhere)]).exit_code == 0
    (dest / "_index").chmod(0o1777)  # as a shared mount may leave it: any user adds rows

    def plant() -> None:
        mine = dest / "benchmark=mine"
        mine.mkdir()
        (mine / "collection_id=stolen").symlink_to(private)
        linked = mine / "collection_id=linked"
        linked.mkdir()
        (linked / "manifest.json").symlink_to(private / "manifest.json")
        (dest / "_index" / "stolen.parquet").symlink_to(
            elsewhere / "_index" / "private-run.parquet"
        )

    as_nobody(plant)
    result = CliRunner().invoke(cli, ["fleet", "reindex", str(dest)])
    assert "Traceback" not in result.output
    rows = sorted(p.name for p in (dest / "_index").iterdir())
    assert rows == ["c1.parquet", "stolen.parquet"], result.output  # no row of private-run
    assert (dest / "_index" / "stolen.parquet").is_symlink()  # left as planted, not read
    listed = CliRunner().invoke(cli, ["fleet", "ls", "--json", str(dest)])
    assert "private-run" not in listed.output, listed.output


def test_ls_names_a_link_and_a_fifo_in_the_index_folder(top: Path) -> None:
    """A link (never followed as root) and a FIFO at row names in _index/ were left out
    of `fleet ls` without a word. Now one warning line names both, the other rows are
    listed, and the exit code says so; reindex leaves both, so the line does not send
    the user to it (it says so after a reindex too)."""
    dest = top / "fleet"
    src = top / "src"
    make_collection(src, "c1", quanta=300)
    assert CliRunner().invoke(cli, ["push", str(src), str(dest)]).exit_code == 0
    index = dest / "_index"
    os.mkfifo(index / "piped.parquet")
    (index / "linked.parquet").symlink_to(index / "c1.parquet")
    for _ in range(2):
        listed = CliRunner().invoke(cli, ["fleet", "ls", str(dest)])
        assert "Traceback" not in listed.output
        assert listed.exit_code == 1, listed.output
        assert "c1" in listed.stdout and "1 collections at" in listed.stdout, listed.output
        (line,) = [x for x in listed.stderr.splitlines() if "linked.parquet" in x]
        assert line == (
            f"warning: {dest}/_index: not read, not a plain file: linked.parquet (a symbolic "
            "link), piped.parquet (a FIFO); their rows, if any, are not listed (reindex "
            "leaves them: remove them)"
        )
        assert "reindex`" not in listed.stderr
        CliRunner().invoke(cli, ["fleet", "reindex", str(dest)])
    assert (index / "linked.parquet").is_symlink() and (index / "piped.parquet").exists()
