"""Ctrl+C while the stop makes rows from the spool: the first says what goes on and
what another does; the second leaves the rest in the spool for ``kernmlops recover``."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import warnings
from pathlib import Path

import polars as pl
import pytest

from kernmlops.collect.manifest import read_manifest
from kernmlops.data import IncompleteCollectionWarning, read_collection
from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.ringbuf import record_stride
from kernmlops.ebpf.spec import object_spec
from kernmlops.errors import CollectionError
from kernmlops.spool.recovery import pending_spools
from tests.conftest import needs_tools
from tests.faults.conftest import (
    parquet_rows,
    recover,
    start_collect,
    wait_until,
)
from tests.faults.test_kill import repeated_runs

pytestmark = [pytest.mark.bpf, needs_tools("stress-ng")]


def _links(pid: int) -> int:
    """The BPF links process ``pid`` holds (its attached programs)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # an fd closed while listed
            count += os.readlink(fd) == "anon_inode:bpf_link"
    return count


@pytest.mark.parametrize("workers", [1, 2])
def test_a_second_ctrl_c_while_rows_are_made_leaves_the_rest_for_recover(
    tmp_path: Path, bpf_baseline, workers: int
) -> None:
    """No CPU to spare: every record waits in the spool for the stop, whose rows are
    made in the collector (1) or in worker processes (2)."""
    ended = tmp_path / "ended"
    storm = f"stress-ng --switch 2 -t 2 --quiet; touch {ended}"
    run = start_collect(
        tmp_path / "out",
        "--", "sh", "-c", storm,
        more_config="  hooks: [quanta_runtime]\n  spool_spare_cpus: 1000\n"
        f"  spool_row_workers: {workers}\n  compact: false\n",
    )  # fmt: skip
    run.wait_for("probes attached")
    attached = _links(run.proc.pid)
    assert attached, "the collector holds no BPF link"
    # The storm is over and the stop began: it detached the programs first (fewer
    # links), and makes the rows of a million records or more (half a second here,
    # more on a busy machine; with workers, their start takes a second more). A
    # Ctrl+C before the stop began would stop the run instead, and none would be
    # said at the stop.
    assert wait_until(lambda: _links(run.proc.pid) < attached, 60)
    assert ended.exists()  # the storm ran its course
    run.proc.send_signal(signal.SIGINT)
    run.wait_for("Ctrl+C again", timeout_s=10)  # said at once, in one line
    run.proc.send_signal(signal.SIGINT)
    code, err = run.finish(timeout_s=20)  # promptly: the rest stays in the spool
    assert "Traceback" not in err, err
    assert code == 128 + signal.SIGINT, err
    assert "kernmlops recover" in err
    col = run.collection()
    manifest = read_manifest(col)
    assert manifest.state == "interrupted", manifest.state
    assert manifest.exit_code == 128 + signal.SIGINT
    assert pending_spools(col), "the rest of the spool was not kept"
    # the summary's events count only the rows made: said, with what waits in the spool
    assert "+ spool" in err, err
    (waits,) = [line for line in err.splitlines() if line.startswith("quanta_runtime: ")]
    shown = re.fullmatch(
        r"quanta_runtime: ([\d.]+) (KiB|MiB|GiB) of spooled records wait in the spool, not "
        r"counted in its events nor rows: `kernmlops recover (.+)` makes their rows",
        waits,
    )
    assert shown is not None and Path(shown[3]) == col, waits
    held = float(shown[1]) * {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[shown[2]]
    # a reader is told the rest waits in the spool: a warning beside the rows made
    # before the Ctrl+C, or the refusal where none were
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            read_collection(col)
            said = [str(w.message) for w in seen
                    if issubclass(w.category, IncompleteCollectionWarning)]  # fmt: skip
        except CollectionError as err:
            said = [str(err)]
    assert any("spool" in s and "kernmlops recover" in s for s in said), said
    counted = read_manifest(col).hooks["quanta_runtime"].events  # the summary's
    before = parquet_rows(col).get("quanta_runtime", 0)
    assert "quanta_runtime" in recover(col)
    # what recover made (its records: each a switch) fits the bytes said: ring records
    # of a batch of switches each, one switch at least, ``recs`` at most
    layout = object_spec(object_path("quanta_runtime")).ring_layouts()["quanta_switch_rb"]
    assert layout.batch is not None
    batches = held / record_stride(layout.batch.itemsize)
    made = read_manifest(col).hooks["quanta_runtime"].events - counted
    most = layout.batch["recs"].shape[0]
    assert batches * 0.99 <= made <= batches * most * 1.01, (batches, made)
    after = parquet_rows(col)["quanta_runtime"]
    assert after > before, (before, after)
    print(
        f"\n[stop] rows before recover {before:,}, after {after:,}; recover made {made:,} "
        f"switches of the {shown[1]} {shown[2]} said ({batches:,.0f} batches)"
    )
    # every record once: none made twice (the rows before the Ctrl+C and recover's
    # meet without overlap) and none missing: a row per switch record the ring gave
    # (the manifest's count), but for those without a run time (prev not followed:
    # the more, the busier the machine), each of which made a wait row alone, at a
    # switch (CPU, time) with no quantum row. A lost record lost both.
    quanta = pl.read_parquet(sorted((col / "quanta_runtime").glob("part-*.parquet")))
    assert repeated_runs(quanta) == 0
    waits = pl.read_parquet(sorted((col / "quanta_queued_time").glob("part-*.parquet")))
    key = ["cpu", "ts_uptime_us"]
    at = waits.group_by(key).len("waits").join(quanta.group_by(key).len("runs"), on=key, how="left")
    alone = (pl.col("waits") - pl.col("runs").fill_null(0)).clip(0).sum()
    waits_alone = int(at.select(alone).item())
    events = read_manifest(col).hooks["quanta_runtime"].events
    print(f"[stop] {events - after:,} records made no quantum row; {waits_alone:,} waits alone")
    # (two switches of a CPU within one microsecond may hide one such record)
    assert 0 <= events - after <= waits_alone + events // 100_000, (after, waits_alone, events)
