"""`kernmlops push` shows the bytes copied and `fleet reindex` the collections read, on
a terminal only; logs and pipes get what they got before."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.cli import cli
from kernmlops.fleet.index import reindex
from kernmlops.fleet.store import open_dataset
from tests.progress import force_terminal, frames, last_count, shown_bytes

# what a quick run says, however long a starved one takes (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("unhurried")


def _published_bytes(root: Path) -> int:
    """What a push copies: every file of the collections but their manifests and
    hidden ones."""
    return sum(
        p.stat().st_size
        for p in root.rglob("*")
        if p.is_file() and p.name != "manifest.json" and not p.name.startswith((".", "_"))
    )


def test_push_shows_the_bytes_copied_up_to_the_collections_size(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "dest"
    force_terminal(monkeypatch)
    first = CliRunner().invoke(cli, ["push", str(fleet), str(dest)])
    assert first.exit_code == 0, first.output
    done, total, unit = shown_bytes(_published_bytes(fleet), _published_bytes(fleet))
    assert last_count(first.stderr, "pushing", unit) == (done, total)
    # nothing to copy the second time: the collections there count as done
    again = CliRunner().invoke(cli, ["push", str(fleet), str(dest)])
    assert again.exit_code == 0, again.output
    assert last_count(again.stderr, "pushing", unit) == (done, total)
    assert frames(again.stderr)[-1] == f"0 published, 3 already there ({dest})"


def test_push_and_reindex_without_a_terminal_say_their_lines_alone(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    dest = tmp_path / "dest"
    pushed = CliRunner().invoke(cli, ["push", str(fleet), str(dest)])
    assert pushed.exit_code == 0, pushed.output
    lines = pushed.stderr.splitlines()
    assert len(lines) == 4 and lines[-1].startswith("3 published, 0 already there")
    assert all(line.startswith(("c1: ", "c2: ", "c3: ")) for line in lines[:3]), lines
    redone = CliRunner().invoke(cli, ["fleet", "reindex", str(dest)])
    assert redone.stderr == f"3 collections indexed, 0 stale rows removed ({dest})\n"
    force_terminal(monkeypatch)
    off = CliRunner().invoke(cli, ["fleet", "reindex", "--no-progress", str(dest)])
    assert off.stderr == redone.stderr


def test_reindex_tells_each_collection_read(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "dest"
    assert CliRunner().invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    told: list[tuple[int, int]] = []
    done = reindex(open_dataset(str(dest)), progress=lambda n, total: told.append((n, total)))
    assert done.written == 3
    assert told == [(0, 3), (1, 3), (2, 3), (3, 3)]
    force_terminal(monkeypatch)
    shown = CliRunner().invoke(cli, ["fleet", "reindex", str(dest)])
    assert shown.exit_code == 0, shown.output
    assert last_count(shown.stderr, "reindexing", "collections") == ("3", "3")
