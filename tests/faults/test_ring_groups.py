"""Ring groups through ``kernmlops collect``: with one ring per CPU (ring_groups 2 on
2 CPUs) a collection killed after its workload still has every switch of it, once,
after ``kernmlops recover``; and one that stops has them all from the stop's row
workers. The independent count: a plain program on the tracepoint, counting the
workload's switches by its name."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.collect.manifest import read_manifest
from tests.faults.conftest import (
    assert_no_benchmark_left,
    kill_collector,
    read_everything,
    recover,
    start_collect,
    wait_until,
)
from tests.hooks.conftest import build_c
from tests.hooks.test_quanta_runtime import NAPS

pytestmark = pytest.mark.bpf

#: counts each switch in and out of every task, per pid, and notes the pids seen named
#: COMM (a task has its name only from its exec: its switches as the shell's child and
#: as taskset are its rows too)
COUNTER = r"""
#include "common.h"

const volatile u64 comm8 = 0; /* the first 8 bytes of the name noted */

struct switches { u64 ins; u64 outs; };

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, u32);
	__type(value, struct switches);
} switches SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, u32);
	__type(value, u32);
} named SEC(".maps");

static __always_inline void count(struct task_struct *t, bool in)
{
	struct switches zero = {}, *c;
	u32 pid = t->pid, one = 1;
	u64 head = 0;

	if (!pid)
		return;
	bpf_probe_read_kernel(&head, sizeof(head), t->comm);
	if (head == comm8)
		bpf_map_update_elem(&named, &pid, &one, BPF_ANY);
	c = bpf_map_lookup_elem(&switches, &pid);
	if (!c) {
		bpf_map_update_elem(&switches, &pid, &zero, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&switches, &pid);
		if (!c)
			return;
	}
	__sync_fetch_and_add(in ? &c->ins : &c->outs, 1);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(observe, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	count(prev, false);
	count(next, true);
	return 0;
}
"""
COMM = "ringnaps"  # 8 bytes: the counter compares them whole


@pytest.fixture(scope="module")
def ringnaps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, COMM, NAPS)


@pytest.fixture
def counted(
    compile_bpf: Callable[[str, str], Path],
) -> Iterator[Callable[[], dict[int, tuple[int, int]]]]:
    """A reading of pid -> (switches in, switches out) of every task named COMM, counted
    from before the collection starts."""
    from kernmlops.ebpf.objects import open_and_load

    path = compile_bpf("ringnaps_counter", COUNTER)
    comm8 = int.from_bytes(COMM.encode(), "little")
    with open_and_load(path, globals_={"comm8": comm8}) as obj:
        obj.attach_all()

        def read() -> dict[int, tuple[int, int]]:
            found = {}
            for key in obj.map("named"):  # its keys
                value = obj.map("switches").lookup(key)
                assert value is not None
                ins, outs = np.frombuffer(value, "<u8").tolist()
                found[int.from_bytes(key, "little")] = (ins, outs)
            return found

        yield read


def _workload(naps: Path, done: Path, then: str) -> list[str]:
    """Two nap loops, one pinned to each CPU; then a few sleeps on each CPU (a CPU's
    batch goes to its ring at its next record once 50 ms old: these are its records),
    ``done`` written, and ``then``."""
    script = (
        f"taskset -c 0 {naps} 1000 100 >/dev/null & taskset -c 1 {naps} 1000 100 >/dev/null; "
        "wait; for i in 1 2 3; do taskset -c 0 sleep 0.1; taskset -c 1 sleep 0.1; done; "
        f"touch {done}; {then}"
    )
    return ["--", "sh", "-c", script]


def _check(col: Path, counted: dict[int, tuple[int, int]]) -> None:
    """Each nap loop's switches, as the counter saw them, are its rows: none lost,
    none twice."""
    quanta = pl.read_parquet(sorted((col / "quanta_runtime").glob("part-*.parquet")))
    queued = pl.read_parquet(sorted((col / "quanta_queued_time").glob("part-*.parquet")))
    assert len(counted) == 2, counted  # the two nap loops
    cpus = set()
    for pid, (ins, outs) in counted.items():
        ran = quanta.filter(pl.col("pid") == pid)
        assert outs >= 1000 - 20  # a nap each (the tracepoint misses a few in a thousand)
        assert (queued.filter(pl.col("pid") == pid).height, ran.height) == (ins, outs), pid
        cpus.add(ran["cpu"].mode().item())
    assert cpus == {0, 1}  # one loop on each CPU: through both rings


#: (the collector's section goes on) no rows while it runs: every record waits in the
#: spool, past 1 MiB on disk (both kinds of segments)
SPOOL = "  spool_spare_cpus: 1000\n  spool_memory_mib: 1\n"
GROUPS = "hooks:\n  quanta_runtime:\n    ring_groups: 2\n"


def test_killed_after_its_workload_recover_brings_every_switch_of_both_rings(
    tmp_path: Path, bpf_baseline, ringnaps: Path, counted: Callable[[], dict[int, tuple[int, int]]]
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("ring groups are tested with 2 CPUs at least (one ring per CPU)")
    done = tmp_path / "done"
    run = start_collect(tmp_path / "out", *_workload(ringnaps, done, "exec sleep 1000"),
                        more_config=SPOOL + GROUPS)  # fmt: skip
    run.wait_for("probes attached")
    assert wait_until(done.exists, 60)
    time.sleep(1.0)  # the copiers' interval (batch_ms 250) and then some
    kill_collector(run)
    assert_no_benchmark_left(run.marker)
    col = run.collection()
    hook = read_manifest(col).hooks["quanta_runtime"]
    assert hook.copier.get("copiers") == 2  # a copier per ring
    assert read_everything(col).get("quanta_runtime", 0) == 0  # all in the spool
    assert "quanta_runtime" in recover(col)
    assert not (col / ".spool").exists()
    _check(col, counted())


def test_a_stop_makes_every_switch_of_both_rings_in_row_workers(
    tmp_path: Path, bpf_baseline, ringnaps: Path, counted: Callable[[], dict[int, tuple[int, int]]]
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("ring groups are tested with 2 CPUs at least (one ring per CPU)")
    run = start_collect(tmp_path / "out", *_workload(ringnaps, tmp_path / "done", "true"),
                        more_config=SPOOL + "  spool_row_workers: 2\n" + GROUPS)  # fmt: skip
    code, err = run.finish(120)
    assert code == 0, err
    assert "on 2 cores" in err  # the rows were made by the stop's row workers
    col = run.collection()
    assert read_manifest(col).hooks["quanta_runtime"].drops == 0
    _check(col, counted())
