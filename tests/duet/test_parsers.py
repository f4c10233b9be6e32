"""Each result-file parser on a small file written here in the tool's format."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from kernmlops.duet.parsers import Anchor, ParseError, parse_file
from kernmlops.duet.process import process_dirs, write_processed

ANCHOR = Anchor(monotonic_ns=5_000_000_000, epoch_ms=1_700_000_000_000)


def test_harness_csv_and_jsonl(tmp_path: Path):
    csv = tmp_path / "h.csv"
    csv.write_text(
        "iteration,iteration_start_ns,iteration_end_ns,iteration_time_ns,epoch_start_ms,exit_code\n"
        "0,100,250,150,1700000000000,0\n"
        "1,260,400,140,1700000000000,0\n"
        "2,410,4"  # a run killed mid-write: the partial last line is dropped
    )
    name, rows = parse_file(csv)
    assert name == "harness"
    assert rows["iteration_time_ns"].to_list() == [150, 140]
    assert rows["iteration_start_ns"].to_list() == [100, 260]
    assert rows["timing"].unique().to_list() == ["measured"]
    jl = tmp_path / "h.jsonl"
    jl.write_text(
        json.dumps(dict(iteration=0, iteration_start_ns=5, iteration_end_ns=9, iteration_time_ns=4,
                        epoch_start_ms=1, exit_code=0)) + "\n"
        + json.dumps(dict(iteration=1, iteration_start_ns=9, iteration_end_ns=19,
                          iteration_time_ns=10, epoch_start_ms=1, exit_code=3)) + "\n"
    )  # fmt: skip
    name, rows = parse_file(jl)
    assert name == "harness" and rows["iteration_time_ns"].to_list() == [4]  # failed one dropped


def test_renaissance_json(tmp_path: Path):
    doc = {
        "format_version": 5,
        "benchmarks": ["scrabble"],
        "environment": {"vm": {"start_unix_ms": 1_650_000_000_000, "name": "OpenJDK"}},
        "data": {
            "scrabble": {
                "results": [
                    {"duration_ns": 900_000_000, "uptime_ns": 1_000_000_000},
                    {"duration_ns": 800_000_000, "uptime_ns": 1_950_000_000},
                ]
            }
        },
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    name, rows = parse_file(path)
    assert name == "renaissance"
    assert rows["iteration_start_ns"].to_list() == [
        1_650_000_000_000 * 10**6 + 1_000_000_000,
        1_650_000_000_000 * 10**6 + 1_950_000_000,
    ]
    assert rows["iteration_time_ns"].to_list() == [900_000_000, 800_000_000]
    assert rows["epoch_start_ms"].to_list() == [1_650_000_001_000, 1_650_000_001_950]


def test_dacapo_csv_with_total_ms_and_repeated_header(tmp_path: Path):
    path = tmp_path / "results.csv"
    path.write_text(
        "benchmark,iteration_time_ns,total_ms\n"
        "avrora,2000000000,2100\n"
        "avrora,1500000000,3650\n"
        "benchmark,iteration_time_ns,total_ms\n"
        "avrora,1400000000,5100\n"
    )
    name, rows = parse_file(path, ANCHOR)
    assert name == "dacapo"
    assert rows["iteration_time_ns"].to_list() == [2_000_000_000, 1_500_000_000, 1_400_000_000]
    # total_ms is the end since start: start = anchor + total - duration
    assert rows["iteration_start_ns"].to_list() == [
        5_000_000_000 + 100_000_000, 5_000_000_000 + 2_150_000_000, 5_000_000_000 + 3_700_000_000,
    ]  # fmt: skip
    assert rows["timing"][0] == "derived"
    wall = tmp_path / "wall.csv"
    wall.write_text("iteration_time_ns,wallclock_start_ms\n10,1000\n20,2000\n")
    _, rows = parse_file(wall)
    assert rows["iteration_start_ns"].to_list() == [10**9, 2 * 10**9]
    assert rows["timing"][0] == "measured"


def test_spec_cpu_log(tmp_path: Path):
    block = (
        "Benchmark Times:\n"
        "  Run Start:    2022-06-01 14:04:52 (1654092292)\n"
        "  Rate Start:   2022-06-01 14:04:52 (1654092292.28303)\n"
        "  Rate End:     2022-06-01 14:12:37 (1654092757.17651)\n"
        "  Run Stop:     2022-06-01 14:12:37 (1654092757)\n"
    )
    second = block.replace("1654092292.28303", "1654092800.5").replace(
        "1654092757.17651", "1654093200.25"
    )
    folder = tmp_path / "result"
    folder.mkdir()
    (folder / "CPU2017.002.log").write_text("runcpu v6612\n" + block + "noise\n" + second)
    name, rows = parse_file(folder)
    assert name == "spec"
    assert rows["iteration_start_ns"].to_list() == [1654092292283030000, 1654092800500000000]
    assert rows["iteration_time_ns"][0] == 1654092757176510000 - 1654092292283030000
    assert rows.height == 2


def test_pyperf_json(tmp_path: Path):
    date = "2024-03-01 10:00:00.000000"
    doc = {
        "version": "1.0",
        "metadata": {"loops": 4, "unit": "second"},
        "benchmarks": [
            {
                "metadata": {"name": "bench"},
                "runs": [
                    {"metadata": {"date": "2024-03-01 09:59:59"}, "warmups": [[1, 0.5]]},
                    {"metadata": {"date": date}, "warmups": [[4, 0.01]], "values": [0.02, 0.03]},
                ],
            }
        ],
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    name, rows = parse_file(path)
    assert name == "pyperf"
    t0 = int(datetime.fromisoformat(date).timestamp() * 1e9)
    assert rows["iteration_time_ns"].to_list() == [20_000_000, 30_000_000]  # per loop
    # 4 warm-up loops of 10 ms, then values spanning 4 loops each
    assert rows["iteration_start_ns"].to_list() == [t0 + 40_000_000, t0 + 120_000_000]
    assert rows["iteration_end_ns"].to_list() == [t0 + 120_000_000, t0 + 240_000_000]


def test_hyperfine_json(tmp_path: Path):
    doc = {"results": [{"command": "sleep 0.1", "mean": 0.1, "stddev": 0.001,
                        "times": [0.1, 0.2, 0.15], "exit_codes": [0, 0, 1]}]}  # fmt: skip
    path = tmp_path / "hf.json"
    path.write_text(json.dumps(doc))
    name, rows = parse_file(path, ANCHOR)
    assert name == "hyperfine"
    assert rows["iteration_time_ns"].to_list() == [100_000_000, 200_000_000]
    assert rows["iteration_start_ns"].to_list() == [5_000_000_000, 5_100_000_000]
    assert rows["epoch_start_ms"].to_list() == [1_700_000_000_000, 1_700_000_000_100]
    with pytest.raises(ParseError, match="side's start is unknown"):
        parse_file(path)


def test_hyperfine_failed_run_delays_the_runs_after_it(tmp_path: Path):
    """hyperfine --ignore-failure keeps a failed run's time and exit code: it is
    no iteration, but the runs after it started that much later (back to back
    from the release at 5 s: 0.1 s ok, 0.3 s failed, 0.2 s ok)."""
    doc = {"results": [{"command": "flaky", "times": [0.1, 0.3, 0.2],
                        "exit_codes": [0, 1, 0]}]}  # fmt: skip
    path = tmp_path / "hf.json"
    path.write_text(json.dumps(doc))
    _, rows = parse_file(path, ANCHOR)
    assert rows["iteration_time_ns"].to_list() == [100_000_000, 200_000_000]
    assert rows["iteration_start_ns"].to_list() == [5_000_000_000, 5_400_000_000]
    assert rows["iteration_end_ns"].to_list() == [5_100_000_000, 5_600_000_000]
    assert rows["epoch_start_ms"].to_list() == [1_700_000_000_000, 1_700_000_000_400]


def test_unparseable_files_are_named_with_the_reason(tmp_path: Path):
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\n")
    with pytest.raises(ParseError, match=r"junk.txt: not a result file of any known tool"):
        parse_file(junk)
    broken = tmp_path / "broken.json"
    broken.write_text('{"data": {}, "environment": {}}')
    with pytest.raises(
        ParseError, match=r"broken\.json: renaissance: no environment\.vm\.start_unix_ms"
    ):
        parse_file(broken)


def test_process_original_layout_keeps_going_past_bad_files(tmp_path: Path):
    good = (
        "iteration,iteration_start_ns,iteration_end_ns,iteration_time_ns,epoch_start_ms,exit_code\n"
        "0,0,10,10,1,0\n1,10,22,12,1,0\n"
    )
    (tmp_path / "s.b.0.duet.AB.A.harness.csv").write_text(good)
    (tmp_path / "s.b.0.duet.AB.B.harness.csv").write_text(good)
    (tmp_path / "s.b.0.seqn.None.A.harness.csv").write_text(good)
    (tmp_path / "s.b.1.duet.BA.A.results.json").write_text("not json")
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "uname").write_text("Linux x\n")
    p = process_dirs([tmp_path])
    assert p.files == 4 and len(p.errors) == 1 and "s.b.1.duet.BA.A.results.json" in p.errors[0]
    r = p.results
    assert r.height == 6
    assert sorted(r["kind"].unique().to_list()) == ["duet", "sequential"]
    assert r.filter(r["kind"] == "sequential")["order"].to_list() == [None, None]
    assert r["artifact_uname"].unique().to_list() == ["Linux x"]
    written = write_processed(p, tmp_path / "out")
    assert {w.name for w in written} == {"duet-results.parquet", "duet-results.csv"}


def test_artifact_columns_are_one_line():
    from kernmlops.duet.process import artifact_value

    lscpu = "Architecture:  x86_64\nCPU(s):  2\nModel name:  Intel(R) Xeon(R) Processor\n"
    assert artifact_value("lscpu", lscpu) == "Intel(R) Xeon(R) Processor, 2 CPU(s)"
    assert artifact_value("meminfo", "MemTotal:  24576000 kB\nMemFree: 1 kB\n") == "24576000 kB"
    assert artifact_value("uname", "\nLinux host 6.18 x86_64\n") == "Linux host 6.18 x86_64"
    assert artifact_value("gcc", "") is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"results": [{"times": ["fast"]}]}', "could not convert string to float: 'fast'"),
        ('{"results": [{"times": [1.0]}], "x": 1}'.replace("[{", "[[{").replace("}]", "}]]"),
         "'list' object has no attribute 'get'"),
        ('{"results": [{"times": [Infinity]}]}', "cannot convert float infinity to integer"),
    ],
)  # fmt: skip
def test_a_malformed_file_is_said_in_words_not_a_python_repr(
    tmp_path: Path, text: str, said: str
) -> None:
    """A file that sniffs as hyperfine's but holds the wrong types said
    "malformed (ValueError(...))": Python's repr of the error."""
    path = tmp_path / "s.b.1.hyperfine.AB.0.json"
    path.write_text(text)
    with pytest.raises(ParseError) as err:
        parse_file(path)
    assert str(err.value) == f"{path.name}: hyperfine: malformed ({said})"
