"""ebpf_exporter's ``cgroup_id_map`` against the kernel: the exporter keeps the
named map holding the cgroups whose paths match, as cgroups come and go, and
the program (ebpf_exporter/cgroup-filter.bpf.c, cgroup-storage.bpf.c) counts
by it."""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.exporter import cgroup_id_map
from kernmlops.exporter.cgroup_id_map import CgroupIdMap
from kernmlops.exporter.cli import export_command
from kernmlops.exporter.config import resolve_sets
from kernmlops.exporter.core import Exporter
from tests.exporter.conftest import (
    exporter_process,
    free_port,
    scratch_cgroup,
    wait_logged,
    wait_serving,
)
from tests.exporter.test_perf_event_array_bpf import _samples, _workload

pytestmark = pytest.mark.bpf

CONFIGS = Path(__file__).parent / "ebpf_exporter"


def _until(check: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _load(name: str) -> Exporter:
    exporter = Exporter(resolve_sets([str(CONFIGS / f"{name}.yaml")]))
    (status,) = exporter.start()
    if status.error is not None:
        exporter.close()
    assert status.error is None, status.error
    assert status.attached == 1, [(p.name, p.error) for p in status.programs]
    return exporter


def _keeper(exporter: Exporter) -> CgroupIdMap:
    (keeper,) = (s for s in exporter.sets[0].services if isinstance(s, CgroupIdMap))
    return keeper


@pytest.fixture(scope="module")
def hash_set() -> Iterator[Exporter]:
    exporter = _load("cgroup-filter")
    try:
        yield exporter
    finally:
        exporter.close()


def test_the_map_follows_matching_cgroups(hash_set: Exporter) -> None:
    obj = hash_set.sets[0].obj
    assert obj is not None
    ids = obj.map("test_cgroup_ids")
    keeper = _keeper(hash_set)
    assert keeper.watched  # fanotify wakes it on this kernel (6.6+)
    with scratch_cgroup("kmo-cgm-in") as inside, scratch_cgroup("kmo-cgm-out") as outside:
        in_id, out_id = os.stat(inside).st_ino, os.stat(outside).st_ino
        assert _until(lambda: ids.lookup(in_id) is not None), "a new matching cgroup is added"
        assert ids.lookup(in_id) == (1).to_bytes(8, "little")
        assert ids.lookup(out_id) is None
        assert set(ids) == {i.to_bytes(8, "little") for i in keeper.present}
        # the program sees the map: calls in the matching cgroup count as matched
        _workload("kmo-cgm-a", 400, inside)
        _workload("kmo-cgm-b", 300, outside)
        text = hash_set.render().decode()
        matched = _samples(text, "ebpf_exporter_test_cgroup_matched_total")
        unmatched = _samples(text, "ebpf_exporter_test_cgroup_unmatched_total")
        # ebpf_exporter's cgroup label: the cgroup's full path, mount point and all
        # (here below the cgroup v2 mount, /sys/fs/cgroup or .../unified)
        assert matched == {(("cgroup", str(inside)),): 400.0}
        assert unmatched[(("cgroup", str(outside)),)] == 300.0
        assert not any(inside.name in dict(k)["cgroup"] for k in unmatched)
    # scratch_cgroup removed both: the matching one's key goes
    assert _until(lambda: ids.lookup(in_id) is None), "a removed cgroup's key is deleted"
    assert in_id not in keeper.present


def test_without_fanotify_a_walk_finds_changes(
    hash_set: Exporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where fanotify cannot watch cgroupfs (kernels before 6.6), the keeper
    walks every POLL_S seconds."""
    obj = hash_set.sets[0].obj
    assert obj is not None
    monkeypatch.setattr(cgroup_id_map, "POLL_S", 0.2)
    mount = _keeper(hash_set).root
    with scratch_cgroup("kmo-cgm-in") as early:
        keeper = CgroupIdMap(
            obj.map("test_cgroup_ids"),
            "hash",
            _keeper(hash_set).patterns,
            mount,
            watch=False,
        )
        try:
            assert not keeper.watched
            assert os.stat(early).st_ino in keeper.present  # filled when made
            keeper.start()
            late = mount / f"kmo-cgm-in-{os.getpid() + 1}"
            late.mkdir()
            try:
                late_id = os.stat(late).st_ino
                assert _until(lambda: late_id in keeper.present)
            finally:
                late.rmdir()
            assert _until(lambda: late_id not in keeper.present)
        finally:
            keeper.close()


def test_cgroup_storage_marks_matching_cgroups() -> None:
    exporter = _load("cgroup-storage")
    try:
        obj = exporter.sets[0].obj
        assert obj is not None
        storage = obj.map("test_cgroup_storage")
        with scratch_cgroup("kmo-cgs-in") as inside, scratch_cgroup("kmo-cgs-out") as outside:
            in_id, out_id = os.stat(inside).st_ino, os.stat(outside).st_ino

            def mark(path: Path) -> bytes | None:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    return storage.lookup(fd.to_bytes(4, "little"))
                finally:
                    os.close(fd)

            assert _until(lambda: mark(inside) is not None), "a matching cgroup is marked"
            assert mark(inside) == (1).to_bytes(8, "little")
            assert mark(outside) is None
            _workload("kmo-cgs-a", 250, inside)
            _workload("kmo-cgs-b", 150, outside)
            text = exporter.render().decode()
            matched = _samples(text, "ebpf_exporter_test_storage_matched_total")
            unmatched = _samples(text, "ebpf_exporter_test_storage_unmatched_total")
            assert matched == {(("cgroup", str(in_id)),): 250.0}
            assert unmatched[(("cgroup", str(out_id)),)] == 150.0
    finally:
        exporter.close()


def test_a_map_that_does_not_fit_is_one_line(tmp_path: Path) -> None:
    """A hash-type id map needs u64 keys: the set is refused, saying why."""
    (tmp_path / "wrong.bpf.c").write_text((CONFIGS / "cgroup-storage.bpf.c").read_text())
    config = (CONFIGS / "cgroup-storage.yaml").read_text()
    (tmp_path / "wrong.yaml").write_text(config.replace("type: cgrp_storage", "type: hash"))
    exporter = Exporter(resolve_sets([str(tmp_path / "wrong.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.error is not None
        assert "test_cgroup_storage has 4-byte keys; type hash needs 8" in status.error
        assert "\n" not in status.error
    finally:
        exporter.close()
    # and --config.check fails with that line, no traceback
    result = CliRunner().invoke(
        export_command, ["--config", str(tmp_path / "wrong.yaml"), "--check"]
    )
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("check failed:")]
    assert "test_cgroup_storage has 4-byte keys; type hash needs 8" in line


def test_served_with_capabilities_dropped(tmp_path: Path) -> None:
    """With --capabilities.keep=none, every thread (the perf event array's
    poller and the id map's keeper among them) holds no capability, and both
    still work: samples are counted, and a cgroup made after the drop is put
    in the map (its calls count as matched)."""
    port = free_port()
    log = tmp_path / "exporter.log"
    args = [
        "--config.dir", str(CONFIGS), "--config.names", "perf-events,cgroup-filter",
        "--web.listen-address", f"127.0.0.1:{port}", "--capabilities.keep=none",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"
    with exporter_process(log, *args) as proc:
        wait_serving(proc, url, log)
        assert "capabilities dropped" in wait_logged(log, "serving")
        threads = {t.name: t for t in Path(f"/proc/{proc.pid}/task").iterdir()}
        assert len(threads) > 1
        for task in threads.values():
            lines = (task / "status").read_text().splitlines()
            status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
            assert int(status["CapEff"], 16) == 0, (task.name, status["CapEff"])
        with scratch_cgroup("kmo-cgm-in") as inside:
            tgid = _workload("kmo-pea-caps", 120)

            def served() -> tuple[dict, dict]:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    text = resp.read().decode()
                return (
                    _samples(text, "ebpf_exporter_test_getppid_events_total"),
                    _samples(text, "ebpf_exporter_test_cgroup_matched_total"),
                )

            # one call at a time until the keeper has put the new cgroup in the map
            key = (("cgroup", str(inside)),)  # ebpf_exporter's label: the full path
            probes = 0
            while key not in served()[1] and probes < 100:
                _workload("kmo-cgm-probe", 1, inside)
                probes += 1
            assert key in served()[1], "the cgroup made after the drop is never matched"
            _workload("kmo-cgm-caps", 80, inside)
            assert _until(lambda: served()[1][key] == 80 + 1)
            perf, matched = served()
            assert matched[key] == 80 + 1  # the probe that first matched, and the 80
            mine = [v for labels, v in perf.items() if dict(labels)["tgid"] == str(tgid)]
            assert mine == [120.0]
