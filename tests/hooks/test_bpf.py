"""BpfHook's batching: a ring is drained once it is 1/16 full or every
batch_ms, and always at stop (after the programs are detached)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import polars as pl
import pytest

from kernmlops.hooks.base import HookContext
from tests.rows import polled


def _traced(flt: object, script: str) -> None:
    """Run ``sh -c script`` in the filter from its first instruction."""
    proc = subprocess.Popen(
        ["/bin/sh", "-c", 'read _ && exec /bin/sh -c "$1"', "sh", script],
        stdin=subprocess.PIPE, text=True,
    )  # fmt: skip
    flt.add(proc.pid)  # type: ignore[attr-defined]
    proc.communicate("go\n", timeout=60)
    assert proc.returncode == 0


def _execs(frames: list[pl.DataFrame], comm: str) -> int:
    if not frames:
        return 0
    df = pl.concat(frames)
    return df.filter((pl.col("kind") == "exec") & (pl.col("comm") == comm)).height


@pytest.mark.bpf
def test_rings_drain_when_full_enough_or_at_stop() -> None:
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.hooks.process_trace import ProcessTraceHook

    flt = ProcessFilter(follow_children=True)
    # 64 KiB ring: drained at a quarter (16 KiB) pending, about 340 records of 48 bytes
    hook = ProcessTraceHook(ProcessTraceHook.Options(ring_kib=64, batch_ms=10_000))
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        reader = hook.readers()["process_trace"][0]
        _traced(flt, "/bin/true")
        assert reader.pending_bytes() > 0
        assert list(polled(hook.poll())) == []  # a few records wait for the batch
        _traced(flt, "for i in $(seq 150); do /bin/true; done")
        assert reader.pending_bytes() >= 16384
        drained = [f for _, f in polled(hook.poll())]
        assert reader.pending_bytes() == 0
        assert _execs(drained, "true") == 151  # the first run's rows came along
        _traced(flt, "/bin/true")
        final = [f for _, f in polled(hook.stop())]
        assert _execs(final, "true") == 1
    finally:
        hook.close()
        flt.close()


@pytest.mark.bpf
def test_batch_ms_zero_drains_every_poll() -> None:
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.hooks.process_trace import ProcessTraceHook

    flt = ProcessFilter(follow_children=True)
    hook = ProcessTraceHook(ProcessTraceHook.Options(batch_ms=0))
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        _traced(flt, "/bin/true")
        assert _execs([f for _, f in polled(hook.poll())], "true") == 1
    finally:
        hook.close()
        flt.close()


@pytest.mark.bpf
def test_spilled_records_come_first_and_none_is_lost() -> None:
    # While the decoding libraries load, the loop only spills: a ring past 1/4
    # full is copied out as bytes. The next poll decodes those, then the ring.
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.hooks.process_trace import ProcessTraceHook

    flt = ProcessFilter(follow_children=True)
    # 16 KiB ring: spilled past 4 KiB, about 90 records of 40 bytes
    hook = ProcessTraceHook(ProcessTraceHook.Options(ring_kib=16, batch_ms=10_000))
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        reader, _ = hook._rings["process_trace"]
        for _ in range(3):  # each run about 180 records (8.6 KiB): 1.6 rings' worth in all
            _traced(flt, "for i in $(seq 60); do /bin/true; done")
            assert reader.pending_bytes() >= reader.size // 4
            hook.spill()
            assert reader.pending_bytes() < reader.size // 4
        assert hook.drops() == 0
        _traced(flt, "/bin/true")  # and some left in the ring
        assert reader.pending_bytes() > 0 and reader.spilled
        frames = [f for _, f in polled(hook.poll())]
        assert not reader.spilled and reader.pending_bytes() == 0
        assert _execs(frames, "true") == 181
    finally:
        hook.close()
        flt.close()


def test_only_hooks_whose_rows_come_from_their_records_alone_are_spooled() -> None:
    from kernmlops.hooks import REGISTRY
    from kernmlops.hooks.bpf import BpfHook

    spooled = {n for n, h in REGISTRY.items() if issubclass(h, BpfHook) and h.spoolable}
    assert {"quanta_runtime", "process_trace", "block_io", "page_faults"} <= spooled
    # these read their rings themselves (stacks symbolized live, perf events resolved
    # at start): their records must never wait in a spool nobody reads
    assert not spooled & {"cpu_profile", "task_perf", "syscalls"}


def test_ring_groups_one_per_16_cpus_and_none_without_a_cpu() -> None:
    from kernmlops.hooks.bpf import default_ring_groups, ring_group_plan

    # up to 16 CPUs one ring (the most one ring served without a loss); then one per 16
    assert [default_ring_groups(n) for n in (1, 2, 16, 17, 64, 65, 192)] == [1, 1, 1, 2, 4, 5, 12]
    assert ring_group_plan(1, 192) == (1, 192)
    assert ring_group_plan(3, 192) == (3, 64)
    assert ring_group_plan(2, 2) == (2, 1)  # one CPU per ring
    assert ring_group_plan(8, 2) == (2, 1)  # never a ring without a CPU
    assert ring_group_plan(4, 10) == (4, 3)  # 3, 3, 3, 1
    assert ring_group_plan(3, 8) == (3, 3)  # 3, 3, 2
    assert ring_group_plan(4, 9) == (3, 3)  # 4 x 3 would leave the 4th empty


def test_a_rings_default_size_follows_its_groups_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernmlops.hooks import bpf
    from kernmlops.hooks.quanta_runtime import QuantaRuntimeHook

    Options = QuantaRuntimeHook.Options  # ring_kib null: the default size
    monkeypatch.setattr(bpf, "online_cpu_count", lambda: 192)
    opts = Options()
    assert opts.groups == 12 and opts.ring_bytes == bpf.default_ring_kib(16) << 10 == 32 << 20
    assert Options(ring_groups=1).ring_bytes == bpf.default_ring_kib(192) << 10 == 256 << 20
    assert Options(ring_groups=2, ring_kib=64).ring_bytes == 64 << 10
    monkeypatch.setattr(bpf, "online_cpu_count", lambda: 16)
    assert Options().groups == 1 and Options().ring_bytes == bpf.default_ring_kib(16) << 10


def _cpu_span() -> int:
    """One past the highest CPU online, as the kernel lists them (``0-3,8-11``)."""
    text = Path("/sys/devices/system/cpu/online").read_text().strip()
    return max(int(r.split("-")[-1]) for r in text.split(",")) + 1


def test_ring_groups_past_the_cpus_is_said_with_the_rings_that_run() -> None:
    """More ring groups than CPUs: not refused (a config moves between machines), one
    note naming what was asked and what runs; none when what was asked runs."""
    from kernmlops.hooks.quanta_runtime import QuantaRuntimeHook

    cpus = _cpu_span()
    Options = QuantaRuntimeHook.Options
    hook = QuantaRuntimeHook(Options(ring_groups=cpus + 62))
    assert hook.ring_plan() == (cpus, 1)
    assert hook.notes() == [
        f"hooks.quanta_runtime.ring_groups is {cpus + 62}, but this machine's {cpus} CPU(s) "
        f"make {cpus} ring(s) per table (1 CPU(s) a ring; at most one ring per CPU): "
        f"{cpus} run"
    ]
    assert QuantaRuntimeHook(Options(ring_groups=1)).notes() == []
    assert QuantaRuntimeHook(Options(ring_groups=cpus)).notes() == []
    assert QuantaRuntimeHook(Options()).notes() == []  # the default never asks past them


def test_ring_groups_must_be_a_positive_count() -> None:
    from pydantic import ValidationError

    from kernmlops.hooks.process_trace import ProcessTraceHook

    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        ProcessTraceHook.Options(ring_groups=0)


def test_a_ring_group_reads_each_ring_in_its_own_order() -> None:
    import numpy as np

    from kernmlops.ebpf.ringbuf import RingBuffer, RingGroup
    from tests.ebpf.test_ringbuf import EVENT, MappedRing, events

    rings = [MappedRing(4096), MappedRing(4096)]
    a, b = events(40), events(30, first=1000)
    for ring, recs in zip(rings, (a, b), strict=True):
        ring.write_records(recs)
        ring.sync()
    group = RingGroup([RingBuffer(r.fd, 4096, name="rb") for r in rings])
    try:
        assert group.fds == [r.fd for r in rings] and group.size == 4096
        assert group.pending_bytes() == 40 * 24  # the fullest ring's
        group.dtype = EVENT
        got = group.drain()
        assert np.array_equal(got, np.concatenate([a, b])) and group.records == 70
        assert all(r.consumer() == r.prod for r in rings)
        rings[1].cons = rings[1].consumer()
        rings[1].write_records(events(5, first=2000))
        rings[1].sync()
        raw = b"".join(group.take_bytes(EVENT.itemsize))
        assert len(raw) == 5 * 24 and group.pending_bytes() == 0
    finally:
        group.close()
        for r in rings:
            os.close(r.fd)


def test_a_copiers_busiest_second_is_watched_beside_its_average() -> None:
    """busy_peak: the busiest copier's share of a core over windows of a second or
    more, as often as the loop looks; a burst the run's average hides."""
    from collections.abc import Callable
    from types import SimpleNamespace

    from kernmlops.hooks.bpf import COPIER_WINDOW_S
    from kernmlops.hooks.quanta_runtime import QuantaRuntimeHook

    hook = QuantaRuntimeHook()
    a, b = SimpleNamespace(cpu_s=0.0), SimpleNamespace(cpu_s=0.0)
    hook._copiers = [a, b]  # type: ignore[list-item]
    hook._copier_seen = (100.0, [0.0, 0.0])

    def clock(*readings: float) -> Callable[[], float]:
        """The wall clock as a look reads it: before the CPU clocks, then after."""
        return iter(readings).__next__

    a.cpu_s, b.cpu_s = 0.1, 0.9  # b: 90% of the second
    hook._watch_copiers(clock(100.0 + COPIER_WINDOW_S / 2))  # too soon: nothing measured
    assert hook._copier_peak == 0
    hook._watch_copiers(clock(100.0 + COPIER_WINDOW_S, 100.0 + COPIER_WINDOW_S))
    assert hook._copier_peak == pytest.approx(0.9)
    # the next window, from before this look read the CPU to after the next one
    # did: 0.5 s of b's CPU in 2 s
    a.cpu_s, b.cpu_s = 0.5, 1.4
    hook._watch_copiers(clock(103.0, 103.0))
    assert hook._copier_peak == pytest.approx(0.9)  # the peak stays
    # a look that waited between its readings (the loop taken off its CPU): its window
    # runs to after the CPU was read, so the CPU in it is never more than the window
    b.cpu_s = 3.4  # 2 s more, read at some time between 104 and 105
    hook._watch_copiers(clock(104.0, 105.0))
    assert hook._copier_peak == pytest.approx(2.0 / 2.0)
    assert hook._copier_seen == (104.0, [0.5, 3.4])


def test_a_share_of_a_core_is_at_most_one() -> None:
    """What the clocks' rates add (the scheduler's clock against CLOCK_MONOTONIC) is
    cut off at a whole core; a clock read as less than before counts as none."""
    from kernmlops.hooks.bpf import core_share

    assert core_share([0.0, 1.0], [0.25, 1.5], 1.0) == 0.5
    assert core_share([0.0], [1.0004], 1.0) == 1.0
    assert core_share([0.5], [0.4], 1.0) == 0.0
    assert core_share([], [], 1.0) == 0.0


@pytest.mark.bpf
def test_a_copier_of_a_hook_refused_at_attach_is_busy_a_share_of_its_own_life(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hook whose tracepoint is refused started its copier and stopped it a few ms
    later: busy (CPU seconds over the seconds the thread existed) is at most 1, a
    thread's CPU clock never outrunning its life (2.5 was seen, the span measured from
    after the thread's start)."""
    from kernmlops.ebpf import copier
    from kernmlops.errors import HookUnavailable
    from kernmlops.hooks.process_trace import ProcessTraceHook
    from tests.conftest import skip_here

    if not copier.available():
        skip_here(f"{copier.LIBRARY} is not built (`make`)")

    def refused(obj: object) -> None:
        raise OSError(22, "tracepoint refused")

    for run in range(5):  # the old span was short by the thread's start every time
        hook = ProcessTraceHook()
        monkeypatch.setattr(hook, "attach", refused)
        ctx = HookContext("t", process_filter=None, self_tgid=os.getpid(),
                          spool_dir=tmp_path / str(run), copier_priority=1)  # fmt: skip
        (tmp_path / str(run)).mkdir()
        with pytest.raises(HookUnavailable, match="tracepoint refused"):
            hook.start(ctx)
        status = hook.status.copier
        assert status["native"] is True and not hook.status.attached
        assert 0 <= status["busy"] <= status["busy_peak"] <= 1, status
