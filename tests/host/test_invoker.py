"""The user behind sudo: who it is, and what is handed to it (only what kernmlops made,
never through a link)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernmlops.errors import ConfigError
from kernmlops.host.invoker import created_by_mkdir, hand_over, invoker

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files away")


@needs_root
def test_the_invoker_is_sudos_user_and_only_under_sudo() -> None:
    who = invoker({"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY)})
    assert who is not None and (who.uid, who.gid, who.name) == (NOBODY, NOBODY, "nobody")
    assert NOBODY in who.groups and who.env()["USER"] == "nobody"
    assert invoker({}) is None  # root logged in as root
    assert invoker({"SUDO_UID": "0", "SUDO_GID": "0"}) is None  # sudo from root
    with pytest.raises(ConfigError, match="SUDO_UID/SUDO_GID are not numbers"):
        invoker({"SUDO_UID": "x", "SUDO_GID": "1"})


def test_created_by_mkdir_is_only_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    b = tmp_path / "a" / "b"
    assert created_by_mkdir(b / "c") == [b, b / "c"]
    assert created_by_mkdir(tmp_path / "a") == []


@needs_root
def test_hand_over_gives_what_kernmlops_made_and_nothing_else(tmp_path: Path) -> None:
    who = invoker({"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY)})
    before = tmp_path / "existing"  # a folder that was there: stays root's
    before.mkdir()
    made = before / "data" / "col"
    (made / "table").mkdir(parents=True)
    (made / "table" / "part-00000.parquet").write_bytes(b"x")
    (made / "manifest.json").write_text("{}")
    secret = tmp_path / "shadow"  # root's, outside: reached by a link and a hard link
    secret.write_text("s")
    (made / "link").symlink_to(secret)
    os.link(secret, made / "second-name")
    foreign = made / "theirs"  # someone else's file in the tree stays theirs
    foreign.write_text("t")
    os.chown(foreign, 1, 1)

    hand_over(made, who, [before / "data", made])

    def owner(p: Path) -> int:
        return os.lstat(p).st_uid

    for p in (before / "data", made, made / "table", made / "table" / "part-00000.parquet",
              made / "manifest.json", made / "link"):  # fmt: skip
        assert owner(p) == NOBODY, p
    assert owner(before) == 0 and owner(tmp_path) == 0
    assert owner(secret) == 0 and owner(made / "second-name") == 0  # not through either link
    assert owner(foreign) == 1
    hand_over(made, None)  # not under sudo: nothing
