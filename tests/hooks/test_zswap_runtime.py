"""zswap_runtime: zswap's counters, checked against the kernel's files read
independently, and a kernel without zswap reported by name."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from kernmlops.ebpf.probe import probe_all
from kernmlops.errors import HookUnavailable
from kernmlops.hooks.zswap_runtime import PER_CALL, TABLE, ZswapRuntimeHook
from kernmlops.host.zswap import ZSWAP_MODULE, zswap_state
from tests.rows import polled


def _hook_on(module: Path, proc: Path, debugfs: Path) -> type[ZswapRuntimeHook]:
    class Fake(ZswapRuntimeHook):
        pass

    Fake.module, Fake.proc, Fake.debugfs = module, proc, debugfs
    return Fake


def test_a_kernel_without_zswap_is_named(tmp_path: Path) -> None:
    present, why = zswap_state(tmp_path / "zswap")
    assert not present and "no zswap" in why
    hook = _hook_on(tmp_path / "zswap", Path("/proc"), tmp_path)()
    with pytest.raises(HookUnavailable, match="zswap_runtime: this kernel has no zswap"):
        hook.start()


def test_rows_hold_the_files_values(tmp_path: Path) -> None:
    module = tmp_path / "zswap"
    (module / "parameters").mkdir(parents=True)
    (module / "parameters" / "enabled").write_text("Y\n")
    (module / "parameters" / "compressor").write_text("lzo\n")
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal: 100 kB\nZswap:  1200 kB\nZswapped:  5000 kB\n")
    (proc / "vmstat").write_text("nr_free_pages 5\nzswpin 7\nzswpout 1250\nzswpwb 3\n")
    debug = tmp_path / "debug"
    debug.mkdir()
    (debug / "stored_pages").write_text("1250\n")
    (debug / "pool_total_size").write_text("1228800\n")
    hook = _hook_on(module, proc, debug)(ZswapRuntimeHook.Options(poll_hz=50))
    hook.start()
    try:
        rows = pl.concat([f for t, f in polled(hook.stop()) if t == TABLE])
    finally:
        hook.close()
    row = rows.row(0, named=True)
    assert row["enabled"] == 1 and hook.status.reason == "zswap enabled (lzo)"
    assert (row["zswap_bytes"], row["zswapped_bytes"]) == (1200 * 1024, 5000 * 1024)
    assert (row["zswpin"], row["zswpout"], row["zswpwb"]) == (7, 1250, 3)
    assert (row["stored_pages"], row["pool_total_size"]) == (1250, 1228800)
    assert PER_CALL in hook.status.unsupported


@pytest.mark.skipif(not ZSWAP_MODULE.is_dir(), reason="this kernel has no zswap")
def test_this_kernel_against_meminfo_and_vmstat() -> None:
    hook = ZswapRuntimeHook(ZswapRuntimeHook.Options(poll_hz=50))
    hook.start()
    try:
        rows = pl.concat([f for _, f in polled(hook.stop())])
        meminfo = dict(
            (k, int(v.split()[0]) * 1024)
            for k, v in (line.split(":") for line in Path("/proc/meminfo").read_text().splitlines())
            if k in ("Zswap", "Zswapped")
        )
        vmstat = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    finally:
        hook.close()
    last = rows.row(-1, named=True)
    # zswap pool sizes move with swapping elsewhere on the machine: 16 MiB of slack
    assert last["zswap_bytes"] == pytest.approx(meminfo["Zswap"], abs=16 << 20)
    assert last["zswapped_bytes"] == pytest.approx(meminfo["Zswapped"], abs=16 << 20)
    assert last["zswpout"] <= int(vmstat["zswpout"])
    assert last["enabled"] == int((ZSWAP_MODULE / "parameters/enabled").read_text()[0] in "Y1")
    # doctor's line is the hook's reason
    assert probe_all()["zswap"].detail == hook.status.reason
