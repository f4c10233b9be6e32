"""MemcachedBenchmark: options (KernMLOps' names), memaslap's configuration and
report, a real run checked against memcached's own counters, the server kept on
benchmark.cpus (a run through `kernmlops collect`: test_memcached_bpf.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from kernmlops.benchmarks.base import BenchmarkRun
from kernmlops.benchmarks.memcached import MemcachedBenchmark, parse_memaslap
from kernmlops.host.cpus import online_cpus
from kernmlops.host.environment import Environment
from tests.conftest import needs_tools

needs_memcached = needs_tools("memcached", "memcaslap")

# memaslap's report (libmemcached-tools 1.1.4), shortened
SAMPLE = """\
servers: 127.0.0.1:22122
threads count: 2
concurrency: 8
execute number: 40000
Get Statistics (36000 events)
   Min:        20
   Max:      8958
   Avg:       156
   Geo:    110.70
   Std:    249.14
   Log2 Dist:
       4:        0     1700     7566    11107

Set Statistics (4000 events)
   Min:        21
   Max:      4108
   Avg:       157
   Geo:    112.79
   Std:    214.93

Total Statistics (40000 events)
   Min:        20
   Max:      8958
   Avg:       156
   Geo:    110.91
   Std:    246.00

cmd_get: 36000
cmd_set: 4000
get_misses: 0
written_bytes: 4888000

Run time: 1.0s Ops: 40000 TPS: 41232 Net_rate: 26.0M/s
"""


def _bench(**options: object) -> MemcachedBenchmark:
    return MemcachedBenchmark(MemcachedBenchmark.Options(**options))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"read_proportion": 0.5}, "read_proportion + update_proportion must be 1"),
        ({"scan_proportion": 0.1}, "less than or equal to 0"),
        ({"threads": 8, "concurrency": 4}, "concurrency must be at least threads"),
        ({"operation_count": 0}, "greater than or equal to 1"),
    ],
)
def test_bad_options(bad: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        MemcachedBenchmark.Options(**bad)
    assert message in str(err.value)


def test_client_config_and_argv(tmp_path: Path) -> None:
    bench = _bench(read_proportion=0.9, update_proportion=0.1, key_size=32, value_size=100)
    assert bench.client_config() == "key\n32 32 1\nvalue\n100 100 1\ncmd\n0 0.1\n1 0.9\n"
    bench.workdir = tmp_path
    argv = bench.launch().argv
    assert argv[0] == "memcaslap" and argv[argv.index("-x") + 1] == "100000"
    assert argv[argv.index("-s") + 1] == f"127.0.0.1:{bench.port}"
    assert argv[argv.index("-F") + 1] == str(tmp_path / "memaslap.cfg")


def test_parse_memaslap() -> None:
    rows = {(k, m): (v, u) for k, m, v, u in parse_memaslap(SAMPLE)}
    assert rows[("total", "ops_per_s")] == (41232.0, "1/s")
    assert rows[("total", "ops")] == (40000.0, "1")
    assert rows[("get", "operations")] == (36000.0, "1")
    assert rows[("get", "latency_avg_us")] == (156.0, "us")
    assert rows[("set", "latency_max_us")] == (4108.0, "us")
    assert rows[("total", "latency_std_us")] == (246.0, "us")
    assert rows[("total", "cmd_set")] == (4000.0, "1")
    assert not any(m.startswith("latency") and k == "4" for k, m in rows)


@needs_memcached
def test_real_run_agrees_with_the_servers_counters(tmp_path: Path) -> None:
    ops = 4000
    bench = _bench(operation_count=ops, read_proportion=0.75, update_proportion=0.25,
                   threads=1, concurrency=4)  # fmt: skip
    cpu = online_cpus()[-1]
    bench.environment = Environment(cpus=[cpu])
    bench.setup(tmp_path)
    try:
        server = bench.server
        assert server is not None
        status = Path(f"/proc/{server.pid}/status").read_text()
        assert f"Cpus_allowed_list:\t{cpu}\n" in status  # all its threads: benchmark.cpus
        for task in Path(f"/proc/{server.pid}/task").iterdir():
            assert f"Cpus_allowed_list:\t{cpu}\n" in (task / "status").read_text()
        out = tmp_path / "stdout.txt"
        with out.open("wb") as f:
            done = subprocess.run(bench.launch().argv, stdout=f, stderr=subprocess.PIPE,
                                  timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        stats = bench.server_stats()
        frame = bench.results(BenchmarkRun(tmp_path, 0, stdout_path=out))
    finally:
        bench.teardown()
        bench.environment.restore()  # the server's cpuset (a session does this at stop)
    assert frame is not None
    got = {(k, m): v for k, m, v in frame.select("key", "metric", "value").iter_rows()}
    assert got[("total", "ops")] == ops
    # memcached's own count of what memaslap says it sent
    assert stats["cmd_get"] == got[("total", "cmd_get")] == got[("get", "operations")]
    assert stats["cmd_set"] == got[("total", "cmd_set")] == got[("set", "operations")]
    assert stats["cmd_get"] + stats["cmd_set"] == ops
    assert 0.6 * ops < stats["cmd_get"] < 0.9 * ops
    assert got[("total", "ops_per_s")] > 0
    assert 0 < got[("get", "latency_min_us")] <= got[("get", "latency_avg_us")]
    assert got[("get", "latency_avg_us")] <= got[("get", "latency_max_us")]
    assert server.poll() is not None
