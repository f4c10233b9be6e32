"""BpfHook's batching: a ring is drained once it is 1/16 full or every
batch_ms, and always at stop (after the programs are detached)."""

from __future__ import annotations

import os
import subprocess

import polars as pl
import pytest

from kernmlops.hooks.base import HookContext


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
    # 64 KiB ring: drained at 4 KiB pending, about 90 records of 40 bytes
    hook = ProcessTraceHook(ProcessTraceHook.Options(ring_kib=64, batch_ms=10_000))
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        reader = hook.readers()["process_trace"][0]
        _traced(flt, "/bin/true")
        assert reader.pending_bytes() > 0
        assert list(hook.poll()) == []  # a few records wait for the batch
        _traced(flt, "for i in $(seq 100); do /bin/true; done")
        assert reader.pending_bytes() >= 4096
        polled = [f for _, f in hook.poll()]
        assert reader.pending_bytes() == 0
        assert _execs(polled, "true") == 101  # the first run's rows came along
        _traced(flt, "/bin/true")
        final = [f for _, f in hook.stop()]
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
        assert _execs([f for _, f in hook.poll()], "true") == 1
    finally:
        hook.close()
        flt.close()
