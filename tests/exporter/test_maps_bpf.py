"""Reading whole maps at scrape time: batched (in chunks) and key by key give
the same keys and values, per-CPU values summed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from kernmlops.ebpf import libbpf
from kernmlops.exporter.config import resolve_sets
from kernmlops.exporter.core import Exporter, JobFilter
from kernmlops.exporter.maps import MapReader

pytestmark = pytest.mark.bpf

KEYS = 3000


@pytest.fixture
def quiet_exporter() -> Iterator[Exporter]:
    """syscalls_comm restricted to a sleeping process: the kernel adds nothing."""
    idle = subprocess.Popen(["sleep", "60"])
    exporter = Exporter(resolve_sets(["syscalls_comm"]), job=JobFilter(tgid=idle.pid))
    try:
        (status,) = exporter.start()
        assert status.error is None
        yield exporter
    finally:
        exporter.close()
        idle.kill()
        idle.wait()


def test_batched_chunked_and_one_by_one_reads_agree(quiet_exporter: Exporter) -> None:
    loaded = quiet_exporter.sets[0].obj
    assert loaded is not None
    bpf_map = loaded.map("syscalls_total")
    ncpu = libbpf.num_possible_cpus()
    expected = {}
    for i in range(KEYS):
        key = f"k{i}".encode().ljust(16, b"\0") + (i % 7).to_bytes(4, "little")
        per_cpu = [(i + 1) * (cpu + 1) for cpu in range(ncpu)]  # a different count per CPU
        bpf_map.update(key, b"".join(v.to_bytes(8, "little") for v in per_cpu))
        expected[key] = sum(per_cpu)
    results = []
    for chunk, batched in ((None, True), (64, True), (None, False)):
        reader = MapReader(bpf_map, chunk=chunk)
        if not batched:
            reader.batched = False  # as on a kernel without batch lookups
        keys, values = reader.read()
        assert values.shape == (KEYS, 1)
        results.append(dict(zip(keys, values[:, 0].tolist(), strict=True)))
        assert reader.batched is batched
    assert results[0] == results[1] == results[2] == expected
