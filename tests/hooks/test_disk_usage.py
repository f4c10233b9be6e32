"""disk_usage: filesystem space against df (coreutils), which it does not call."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from kernmlops.errors import HookUnavailable
from kernmlops.hooks.disk_usage import TABLE, DiskUsageHook, block_mounts, mount_of
from tests.rows import polled

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
proc /proc proc rw 0 0
/dev/vdb /data\\040disk xfs rw 0 0
/dev/vda /srv/bind ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw 0 0
"""


def test_block_mounts_unescape_and_skip_bind_repeats() -> None:
    mounts = block_mounts(MOUNTS)
    assert mounts == [("/", "/dev/vda", "ext4"), ("/data disk", "/dev/vdb", "xfs")]
    assert mount_of("/data disk/x/y", mounts) == ("/data disk", "/dev/vdb", "xfs")
    assert mount_of("/etc", mounts) == ("/", "/dev/vda", "ext4")


def test_a_missing_path_is_one_clear_error(tmp_path: Path) -> None:
    hook = DiskUsageHook(DiskUsageHook.Options(paths=[str(tmp_path / "nope")]))
    with pytest.raises(HookUnavailable, match="no such path"):
        hook.start()


def _df(path: str) -> dict[str, int]:
    out = subprocess.run(
        ["df", "-B1", "--output=size,used,avail,itotal,iavail", path],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()[1].split()  # fmt: skip
    return dict(zip(["size", "used", "avail", "itotal", "iavail"], map(int, out), strict=True))


def test_rows_agree_with_df(tmp_path: Path) -> None:
    hook = DiskUsageHook(DiskUsageHook.Options(poll_hz=20, paths=[str(tmp_path)]))
    hook.start()
    try:
        time.sleep(0.2)
        df = _df(str(tmp_path))
        out = polled(hook.stop())
        assert {t for t, _ in out} == {TABLE}
        rows = pl.concat([f for _, f in out])
    finally:
        hook.close()
    assert rows.height >= 3 and rows["mount_point"].n_unique() == 1
    last = rows.row(-1, named=True)
    assert last["total_bytes"] == df["size"] and last["inodes_total"] == df["itotal"]
    # the disk is shared: others write between the sample and df (64 MiB of slack)
    assert last["used_bytes"] == pytest.approx(df["used"], abs=64 << 20)
    assert last["available_bytes"] == pytest.approx(df["avail"], abs=64 << 20)
    assert last["inodes_free"] == pytest.approx(df["iavail"], abs=10_000)
    assert last["used_bytes"] + last["free_bytes"] == last["total_bytes"]
    assert rows.schema["used_bytes"] == pl.Int64


def test_default_follows_every_block_device_df_lists() -> None:
    hook = DiskUsageHook()
    hook.start()
    try:
        rows = pl.concat([f for _, f in polled(hook.stop())])
    finally:
        hook.close()
    out = subprocess.run(
        ["df", "--output=source", "-a"], check=True, capture_output=True, text=True
    ).stdout.split()[1:]
    assert set(rows["device"]) == {s for s in out if s.startswith("/dev/")}
