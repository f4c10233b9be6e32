"""disk_usage: filesystem space against df (coreutils), which it does not call."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from kernmlops.errors import HookUnavailable
from kernmlops.hooks.disk_usage import (
    TABLE,
    DiskUsageHook,
    block_mounts,
    mount_of,
    parse_mountinfo,
)
from kernmlops.tables import UPTIME_TIMESTAMP
from tests.rows import polled

# id parent major:minor root point options - type source super-options
MOUNTINFO = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
22 27 0:21 / /proc rw - proc proc rw
44 27 254:16 / /data\\040disk rw - xfs /dev/vdb rw
45 27 254:0 /srv/real /srv/bind rw - ext4 /dev/vda rw
25 27 0:23 / /dev/shm rw - tmpfs tmpfs rw
30 25 0:27 / /dev/shm rw - tmpfs tmpfs rw
"""


def test_block_mounts_unescape_and_skip_bind_repeats() -> None:
    mounts = block_mounts(parse_mountinfo(MOUNTINFO))
    assert [(m.point, m.source, m.fs_type) for m in mounts] == [
        ("/", "/dev/vda", "ext4"),
        ("/data disk", "/dev/vdb", "xfs"),
    ]


def test_mount_of_goes_by_the_device_number_then_the_longest_point() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    dev = os.makedev
    assert mount_of("/data disk/x", mounts, dev(254, 16)).point == "/data disk"
    assert mount_of("/etc", mounts, dev(254, 0)).point == "/"
    assert mount_of("/srv/bind/x", mounts, dev(254, 0)).point == "/srv/bind"
    # /dev/shm mounted twice: the visible one is the device the path has, not the first
    assert mount_of("/dev/shm/x", mounts, dev(0, 27)).dev == dev(0, 27)
    assert mount_of("/dev/shm/x", mounts, dev(0, 23)).dev == dev(0, 23)
    # a number no mount has (a btrfs subvolume): the longest point, the last made
    assert mount_of("/dev/shm/x", mounts, dev(0, 99)).dev == dev(0, 27)


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
        # three samples taken, as its thread counts them: waited for, not 0.2 s (at
        # 20 Hz, a starved thread in CI's idle lane may take fewer in that time)
        deadline = time.monotonic() + 60
        while hook.status.events < 3:
            assert time.monotonic() < deadline, f"{hook.status.events} samples in 60 s"
            time.sleep(0.02)
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


def _df_source(path: str) -> tuple[str, str]:
    out = (
        subprocess.run(
            ["df", "--output=source,target", path], check=True, capture_output=True, text=True
        )
        .stdout.splitlines()[1]
        .split()
    )
    return out[0], out[1]


def _collect(paths: list[str]) -> pl.DataFrame:
    hook = DiskUsageHook(DiskUsageHook.Options(poll_hz=50, paths=paths))
    hook.start()
    try:
        time.sleep(0.1)
        return pl.concat([f for _, f in polled(hook.stop())])
    finally:
        hook.close()


def test_each_path_is_its_own_filesystem_not_the_root(tmp_path: Path) -> None:
    """/ and /dev/shm (a tmpfs, not a /dev device) and a tmpfs mounted here: each
    row is its filesystem's own statvfs, under the mount df names."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "kmotest", str(small)], check=True)
    try:
        paths = ["/", "/dev/shm", str(small)]
        rows = _collect(paths)
        last = rows.group_by("mount_point").last()
        assert last.height == 3
        for path in paths:
            source, target = _df_source(path)
            st = os.statvfs(path)
            row = last.filter(pl.col("mount_point") == target).row(0, named=True)
            assert row["device"] == source
            assert row["total_bytes"] == st.f_blocks * st.f_frsize
            assert row["inodes_total"] == st.f_files
            assert row["total_bytes"] == _df(path)["size"]
        tiny = last.filter(pl.col("mount_point") == str(small)).row(0, named=True)
        assert (tiny["fs_type"], tiny["total_bytes"]) == ("tmpfs", 8 << 20)
        assert last.filter(pl.col("mount_point") == "/dev/shm")["fs_type"].item() == "tmpfs"
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_paths_on_one_filesystem_give_it_one_row_per_sample(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    rows = _collect([str(tmp_path), str(tmp_path / "sub"), str(tmp_path / ".")])
    target = _df_source(str(tmp_path))[1]
    assert rows["mount_point"].unique().to_list() == [target]
    assert rows[UPTIME_TIMESTAMP].is_unique().all()
