"""The runway's reservation follows the rate the spool is fed (native/runway.c): a
spool fed ~4.8 MB/s into a memory budget that lasts keeps a token on disk, and one
whose budget ends holds a lead of about 5 s, then a minute of its frames' real size.

Quiet (tests/lanes.py): the rate is the copier's and the runway thread's, measured in
0.1-s windows of the wall clock; at the idle lane's policy they are fed and look far
more slowly, and the lead is never taken (the other runway tests, in test_runway.py,
wait for what they check and run there)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf import copier as native
from kernmlops.ebpf.copier import RUNWAY_MIN
from kernmlops.ebpf.ringbuf import HEADER_SIZE, record_stride
from kernmlops.spool.copy import RingSpool
from tests.ebpf.test_copier import spool_on
from tests.ebpf.test_ringbuf import EVENT, MappedRing, events
from tests.ebpf.test_runway import _allocated, _read_all, _wait

pytestmark = pytest.mark.quiet


@pytest.fixture(autouse=True)
def _built(bpf_build_dir: Path) -> None:
    assert native.available(), f"no {native.LIBRARY} in {bpf_build_dir}"


def _paced(
    spool: RingSpool, ring: MappedRing, records: np.ndarray, batch: int, period: float
) -> float:
    """Feed ``records`` a batch, then a pause of ``period`` s (never faster: a window
    of the copier's rate holds two batches at most); Python looks at what the copier
    did, as the poll loop does. The raw bytes a second it was offered on average."""
    t0 = time.monotonic()
    for i in range(0, len(records), batch):
        _put_batch(ring, records[i : i + batch])
        _wait(lambda: ring.consumer() == ring.prod, "the copier")
        spool.take(None)  # type: ignore[arg-type]
        time.sleep(period)
    return len(records) * record_stride(EVENT.itemsize) / (time.monotonic() - t0)


def _put_batch(ring: MappedRing, records: np.ndarray) -> None:
    """Append ``records`` committed, as the kernel does (the records, then the producer
    position), writing only the bytes they take, in both copies of the data area
    (MappedRing.write_records goes a record at a time: too slow for a rate)."""
    stride = record_stride(EVENT.itemsize)
    rows = np.zeros((len(records), stride), np.uint8)
    rows[:, :4] = np.frombuffer(np.uint32(EVENT.itemsize).tobytes(), np.uint8)
    rows[:, HEADER_SIZE : HEADER_SIZE + EVENT.itemsize] = records.view(np.uint8).reshape(
        len(records), -1
    )
    raw = rows.tobytes()
    assert ring.prod + len(raw) - ring.consumer() <= ring.size, "ring full"
    at = ring.prod & (ring.size - 1)
    first = min(len(raw), ring.size - at)
    for copy in (2 * ring.page, 2 * ring.page + ring.size):
        os.pwrite(ring.fd, raw[:first], copy + at)
        os.pwrite(ring.fd, raw[first:], copy)  # past the end: the area's start
    ring.prod += len(raw)
    os.pwrite(ring.fd, np.uint64(ring.prod).tobytes(), ring.page)


def _disk_segments(folder: Path) -> list[Path]:
    return sorted((folder / "spool").glob("events.*.ring"))


#: records a batch of _paced and its pause: at most ~4.8 MB/s of 24-byte records, and
#: twice that in one of the runway's 0.1-s windows
BATCH, PERIOD = 20_000, 0.1
FASTEST = 2 * BATCH * record_stride(EVENT.itemsize) / PERIOD


def test_a_spool_that_stays_in_memory_reserves_a_token_on_disk(tmp_path: Path) -> None:
    # Memory that lasts (rows are made as fast as it fills, or the run is short): the
    # standby is taken up only at the end of the budget, so it keeps RUNWAY_MIN on
    # disk, not a minute of the spool's writes at the full rate (253 MB for a
    # `stress-ng --switch 1` run whose every record stayed in memory).
    ring = MappedRing(1 << 21)
    stride = record_stride(EVENT.itemsize)
    with spool_on(ring, tmp_path, budget_records=(256 << 20) // stride, runway_s=60,
                  start=True) as (spool, copier):  # fmt: skip
        rate = _paced(spool, ring, events(15 * BATCH), BATCH, PERIOD)
        # the old rule's reservation: a minute at a quarter of the raw rate
        assert rate * 0.25 * 60 > 20 << 20, f"fed only {rate / 1e6:.1f} MB/s"
        time.sleep(0.3)  # the runway thread looks every 0.1 s
        standby = spool._standby
        assert standby is not None and standby.native.state == native.STANDBY
        assert all(s.in_memory for s in spool._live)  # nothing went to disk
        assert _allocated(standby.path) == RUNWAY_MIN  # the filesystem's count
        assert sum(_allocated(p) for p in _disk_segments(tmp_path)) == RUNWAY_MIN
        assert copier.runway["allocated_bytes"] == RUNWAY_MIN


def test_the_standby_gets_a_lead_as_the_budget_ends_and_disk_gets_the_frames_real_size(
    tmp_path: Path,
) -> None:
    # A budget of ~8 MB filled at ~4.8 MB/s: once it would be spent within the lead
    # (5 s of the spool's disk writes), the standby holds that lead, so the switch
    # finds blocks ready; then the active segment holds a minute of the spool's writes
    # as its frames really are on disk (these records shrink ~100x), not at the
    # starting guess (the old 1/4 reserved ~70 MB here, 608 MB in a 20-s storm).
    ring = MappedRing(1 << 21)
    budget = 350_000
    want = events(30 * BATCH)
    with spool_on(ring, tmp_path, budget_records=budget, runway_s=60,
                  start=True) as (spool, copier):  # fmt: skip
        first = 12 * BATCH  # ~70% of the budget
        rate = _paced(spool, ring, want[:first], BATCH, PERIOD)
        assert rate * 0.1 * 5 > RUNWAY_MIN, f"fed only {rate / 1e6:.1f} MB/s"
        time.sleep(0.3)
        standby = spool._standby
        assert standby is not None and standby.native.state == native.STANDBY
        lead = _allocated(standby.path)
        # the lead: more than the token, about 5 s at the guessed ratio (1/10) of the
        # fastest 0.1-s window (two batches at most)
        assert RUNWAY_MIN < lead <= FASTEST * 0.1 * 5 + RUNWAY_MIN
        _paced(spool, ring, want[first:], BATCH, PERIOD)
        time.sleep(0.3)
        spool.take(None)  # type: ignore[arg-type]
        disk = [s for s in spool._live if not s.in_memory]
        assert disk and disk[0] is standby  # the switch went on in the lead
        assert copier.runway["outside_bytes"] == 0  # every frame into allocated blocks
        # the frames' real ratio, from the files and the records they hold
        written = sum(p.stat().st_size for p in _disk_segments(tmp_path))
        raw = sum(int(s.native.written) for s in disk)
        assert raw > 0 and written > 0
        ratio = written / raw
        allocated = sum(_allocated(p) for p in _disk_segments(tmp_path))
        # a minute at the fastest window's rate in real frames (or the lead, if the
        # active segment is still in it), the next standby's token, the MiB the runway
        # rounds to
        ahead = max(FASTEST * ratio * 60, lead)
        assert allocated <= written + ahead + 2 * RUNWAY_MIN, (
            f"{allocated} allocated for {written} written at a ratio of {ratio:.4f}"
        )
        copier.stop()
        spool.detach()
        assert np.array_equal(_read_all(spool), want)
