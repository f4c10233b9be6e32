"""The libbpf layer against the real kernel: load, attach, maps, iterators, errors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf import libbpf
from kernmlops.ebpf.build import build, compile_object, object_path
from kernmlops.ebpf.libbpf import LibbpfError
from kernmlops.ebpf.objects import BpfObject, open_and_load

pytestmark = pytest.mark.bpf
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def objects() -> Path:
    build()
    return object_path("filter").parent


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_hash_map_update_lookup_delete_iterate(objects: Path) -> None:
    with open_and_load(object_path("filter")) as obj:
        tracked = obj.map("kmo_tracked")
        assert (tracked.key_size, tracked.value_size) == (4, 8)
        for tgid in (11, 22, 33):
            tracked.update(tgid, tgid.to_bytes(8, "little"))
        assert tracked.lookup(22) == (22).to_bytes(8, "little")
        assert tracked.lookup(44) is None
        assert sorted(int.from_bytes(k, "little") for k in tracked) == [11, 22, 33]
        assert tracked.delete(22) and not tracked.delete(22)
        assert dict(tracked.items()) == {
            (11).to_bytes(4, "little"): (11).to_bytes(8, "little"),
            (33).to_bytes(4, "little"): (33).to_bytes(8, "little"),
        }


def test_percpu_map_has_one_value_per_cpu(objects: Path) -> None:
    with open_and_load(object_path("quanta_runtime")) as obj:
        drops = obj.map("drops")
        assert drops.percpu
        ncpu = libbpf.num_possible_cpus()
        values = np.arange(ncpu, dtype="<u8") + 7
        drops.update(2, values.tobytes())
        got = drops.lookup_percpu(2)
        assert got.shape == (ncpu,)
        assert got.tolist() == values.tolist()
        assert drops.lookup_percpu(3).tolist() == [0] * ncpu


def test_attach_counts_events_and_close_detaches(objects: Path) -> None:
    """The quantum program sees context switches while attached and none after."""
    obj = open_and_load(
        object_path("quanta_runtime"), globals_={"kmo_self_tgid": 0}, max_entries={}
    )
    links = obj.attach_all()
    assert {link.program for link in links} == {"switch_btf"}
    time.sleep(0.2)
    oncpu = obj.map("oncpu")
    layout = [("sum_exec_at_in", "<u8"), ("pid", "<u4"), ("seen", "<u2"), ("wanted", "<u2"),
              ("clock_offset", "<i8"), ("clock_least", "<i8"), ("clock_synced", "<u8"),
              ("clock_window", "<u8"), ("clock_last", "<u8"), ("clock_count", "<u4"),
              ("clock_sure", "<u4"), ("wanted_tgid", "<u4", (8,)),
              ("wanted_leader", "<u8", (8,))]  # fmt: skip
    per_cpu = oncpu.lookup_percpu(0, dtype=layout)
    assert per_cpu.shape == (libbpf.num_possible_cpus(),)
    assert (per_cpu["seen"] == 1).any()
    assert (per_cpu["sum_exec_at_in"] > 0).any()
    assert (per_cpu["clock_synced"] > 0).any()  # a switch out of a task read the offset
    # system-wide: the filter is a compare
    assert (per_cpu["wanted_tgid"] == 0).all() and (per_cpu["wanted_leader"] == 0).all()
    with pytest.raises(ValueError, match="160-byte"):
        oncpu.lookup_percpu(0, dtype="<u8")
    obj.close()
    obj.close()  # idempotent
    assert not any(link._ptr for link in links)


def test_raw_tp_variant_is_chosen_when_asked(objects: Path) -> None:
    with open_and_load(object_path("process_trace"), variants=("raw",)) as obj:
        assert obj.variant == "raw"
        loaded = {p.name for p in obj.programs.values() if p.autoload}
        assert loaded == {"fork_raw", "exec_raw", "exit_raw"}
        assert len(obj.attach_all()) == 3


def test_iterator_lists_every_task(tmp_path: Path, objects: Path) -> None:
    obj_path = compile_object(DATA / "iter_tasks.bpf.c", tmp_path / "iter.bpf.o")
    with BpfObject(obj_path) as obj:
        obj.load()
        link = obj.programs["dump_task"].attach_iter()
        pids = {int(x) for x in link.read_iter().split()}
    assert os.getpid() in pids
    # Every process in /proc is a task the iterator saw (threads add more).
    procs = {int(p) for p in os.listdir("/proc") if p.isdigit()}
    assert len(procs - pids) <= 2  # processes that came and went in between


def test_verifier_rejection_carries_the_log(tmp_path: Path, objects: Path) -> None:
    obj_path = compile_object(DATA / "rejected.bpf.c", tmp_path / "rejected.bpf.o")
    with pytest.raises(LibbpfError) as info:
        open_and_load(obj_path)
    err = info.value
    assert err.errno != 0
    assert "unchecked_lookup" in err.log
    # The verifier's own words about the NULL dereference.
    assert "map_value_or_null" in str(err)


def test_set_globals_reaches_the_kernel(objects: Path) -> None:
    """A const volatile set before load is what the program sees: here the
    filter follows no children, so a fork from a tracked tgid adds nothing (with
    children followed, it adds the child while it lives, with its start time)."""

    def fork_and_look(tracked) -> bytes | None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write)
            os.read(read, 1)  # until the parent has looked
            os._exit(0)
        os.close(read)
        value = tracked.lookup(pid)
        os.close(write)
        os.waitpid(pid, 0)
        return value

    with open_and_load(object_path("filter"), globals_={"kmo_follow_children": False}) as obj:
        obj.attach_all()
        tracked = obj.map("kmo_tracked")
        tracked.update(os.getpid(), bytes(8))
        assert fork_and_look(tracked) is None
    with open_and_load(object_path("filter"), globals_={"kmo_follow_children": True}) as obj:
        obj.attach_all()
        tracked = obj.map("kmo_tracked")
        tracked.update(os.getpid(), bytes(8))
        value = fork_and_look(tracked)
        assert value is not None and 0 < int.from_bytes(value, "little") <= time.monotonic_ns()


def test_no_fd_leaks_over_load_attach_close_cycles(tmp_path: Path, objects: Path) -> None:
    rejected = compile_object(DATA / "rejected.bpf.c", tmp_path / "rejected.bpf.o")
    fds = _open_fds()
    for _ in range(5):
        with open_and_load(object_path("quanta_runtime")) as obj:
            obj.attach_all()
    for _ in range(3):  # a failed load frees everything too
        with pytest.raises(LibbpfError):
            open_and_load(rejected)
    assert _open_fds() == fds


def test_prog_info_names_the_program_like_bpftool(objects: Path) -> None:
    import json
    import shutil
    import subprocess

    with open_and_load(object_path("quanta_runtime")) as obj:
        obj.attach_all()
        time.sleep(0.1)
        prog = obj.programs["switch_btf"]
        info = libbpf.prog_info(prog.fd)
        tool = shutil.which("bpftool") or "/usr/sbin/bpftool"
        shown = json.loads(
            subprocess.run(
                [tool, "-j", "prog", "show", "id", str(info.id)],
                capture_output=True, text=True, check=True,
            ).stdout
        )  # fmt: skip
    assert shown["id"] == info.id
    assert shown["name"] == info.name.decode() == "switch_btf"
    assert info.recursion_misses == shown.get("recursion_misses", 0)
