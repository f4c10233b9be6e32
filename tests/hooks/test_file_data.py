"""file_data: the files a test program opens, checked against what the program
did and against os.stat (inode, size), which file_data does not read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from kernmlops.hooks.file_data import TABLE, FileDataHook
from tests.rows import polled

# Creates N empty files, writes 3000 bytes to each, then opens each of them
# twice for reading; also opens one empty file it did not create (not a row).
PROGRAM = r"""
import os, sys
folder, n = sys.argv[1], int(sys.argv[2])
open(os.path.join(folder, "empty-existing"), "rb").close()
for i in range(n):
    with open(os.path.join(folder, f"kmo-file-{i}"), "wb") as f:
        f.write(b"x" * 3000)
for _ in range(2):
    for i in range(n):
        with open(os.path.join(folder, f"kmo-file-{i}"), "rb") as f:
            f.read()
"""


def test_table_is_kernmlops_file_data() -> None:
    assert FileDataHook.tables == (TABLE,) == ("file_data",)


@pytest.mark.bpf
def test_opens_match_what_the_program_did(tmp_path: Path) -> None:
    from kernmlops.ebpf.build import build
    from kernmlops.hooks.base import HookContext

    build()
    n = 40
    (tmp_path / "empty-existing").write_bytes(b"")
    hook = FileDataHook(FileDataHook.Options())
    frames: list[pl.DataFrame] = []
    try:
        hook.start(HookContext("t", process_filter=None, self_tgid=os.getpid()))
        subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path), str(n)], check=True)
        time.sleep(0.05)
        frames = [f for _, f in polled(hook.stop())]
    finally:
        hook.close()
    rows = pl.concat(frames)
    assert set(rows.columns) >= {
        "cpu", "pid", "tgid", "ts_uptime_us", "file_inode", "file_size_bytes", "file_name",
    }  # fmt: skip
    mine = rows.filter(pl.col("file_name").str.starts_with("kmo-file-"))
    assert mine["tgid"].n_unique() == 1
    # each file: one open that created it (empty then), two reads of 3000 bytes
    created = mine.filter(pl.col("created") == 1)
    assert created.height == n and created["file_size_bytes"].to_list() == [0] * n
    reads = mine.filter(pl.col("created") == 0)
    assert reads.height == 2 * n
    for name, group in reads.group_by("file_name"):
        st = os.stat(tmp_path / name[0])
        assert group["file_inode"].to_list() == [st.st_ino] * 2
        assert group["file_size_bytes"].to_list() == [st.st_size] * 2 == [3000] * 2
    # an existing empty file has no data: no row, as in KernMLOps
    assert rows.filter(pl.col("file_name") == "empty-existing").height == 0
    assert hook.status.drops == 0
