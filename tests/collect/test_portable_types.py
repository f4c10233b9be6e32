"""Collections read by DuckDB with portable types (issue 13.8): 64-bit values are
signed BIGINT (Spark and Hive have no unsigned 64-bit type, Spark reads one as
decimal(20,0)); only fields declared kmo_full_u64 in C (kernel addresses) stay
UBIGINT. The whole folder of collections is read at once, as a fleet's bucket."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

duckdb = pytest.importorskip("duckdb")

HOOKS = (
    "process_trace,quanta_runtime,memory_usage,system_info,perf,task_perf,page_faults,"
    "syscalls,process_metadata,block_io,sched_migrate,cpu_profile"
)
CORE = {"quanta_runtime", "memory_usage", "perf_counters", "minor_faults", "syscalls"}
#: (table, column) declared kmo_full_u64: the only unsigned 64-bit columns
FULL_RANGE = {("page_faults", "address"), ("page_faults", "ip")}


@pytest.mark.bpf
def test_duckdb_reads_a_folder_of_collections_with_signed_64_bit_types(tmp_path: Path) -> None:
    from kernmlops.ebpf.build import build

    build()
    for _ in range(2):
        subprocess.run(
            [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-o", str(tmp_path),
             "--hooks", HOOKS, "--", "sh", "-c", "ls / > /dev/null; sleep 0.3"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    root = tmp_path / "curated"
    tables = sorted({p.parent.name for p in root.glob("*/*/*/part-*.parquet")})
    assert set(tables) >= CORE
    checked = 0
    for table in tables:
        glob = f"{root}/*/*/{table}/*.parquet"
        rel = duckdb.sql(f"select * from read_parquet('{glob}', hive_partitioning=true)")
        types = dict(zip(rel.columns, (str(t) for t in rel.types), strict=True))
        assert types["collection_id"] == "VARCHAR" and types["benchmark"] == "VARCHAR"
        ids = duckdb.sql(
            f"select count(distinct collection_id) from read_parquet('{glob}', "
            "hive_partitioning=true)"
        ).fetchall()
        # a table with no rows in a collection (block_io without disk I/O) has no file
        assert ids == [(2,)] or table not in CORE, (table, ids)
        for column, kind in types.items():
            if (table, column) in FULL_RANGE:
                assert kind == "UBIGINT", (table, column)
            else:
                assert "UBIGINT" not in kind and "HUGEINT" not in kind, (table, column, kind)
            checked += 1
        if "ts_uptime_us" in types:
            assert types["ts_uptime_us"] == "BIGINT", table
    assert checked > 50
    # KernMLOps' per-task perf columns, as its readers expect them
    faults = duckdb.sql(
        f"describe select * from read_parquet('{root}/*/*/minor_faults/*.parquet')"
    ).fetchall()
    assert {name: kind for name, kind, *_ in faults} == {
        "cpu": "BIGINT", "pid": "BIGINT", "tgid": "BIGINT", "ts_uptime_us": "BIGINT",
        "count": "BIGINT", "cumulative_count": "BIGINT", "pmu_enabled_time_us": "BIGINT",
        "pmu_running_time_us": "BIGINT", "collection_id": "VARCHAR", "benchmark": "VARCHAR",
    }  # fmt: skip
