"""The tests of test_cli.py that need root and BPF (the main lane), apart from the
others so that those run beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import kernmlops


@pytest.mark.bpf
def test_collect_never_breaks_the_collections_path_across_lines(tmp_path: Path) -> None:
    out = tmp_path / ("x" * 90)  # the path alone is wider than rich's 80 columns
    done = kernmlops("collect", "--no-progress", "-o", str(out), "-b", "faux", "-d", "0.3",
                     "--hooks", "process_trace", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (collection,) = (out / "curated" / "benchmark=faux").iterdir()
    last = [line for line in done.stderr.splitlines() if " -> " in line]
    assert len(last) == 1 and last[0].startswith("duration after "), done.stderr
    assert last[0].endswith(f" -> {collection}")


@pytest.mark.bpf  # past the privilege check, where the room is checked
def test_collect_refused_for_room_leaves_no_folder(tmp_path: Path) -> None:
    (tmp_path / "big.yaml").write_text("collector:\n  min_free_mb: 1.0e+12\n")
    out = tmp_path / "out"
    done = kernmlops("collect", "-c", "big.yaml", "-o", str(out), "--", "true", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: only ") and line.endswith(
        f"free on {out} (the minimum is 1e+12 MiB, collector.min_free_mb): free some space "
        "or choose another folder with -o"
    )
    assert not out.exists()  # no empty curated/benchmark=command/collection_id=... left


@pytest.mark.bpf
def test_kernmlops_collect_data_verbose_and_poll_rate(tmp_path: Path) -> None:
    """KernMLOps' `collect data -v -p SECONDS`: progress shown (over a file's
    progress: false) and the rings drained every SECONDS, as its collector polled;
    the collection's manifest says both."""
    import json

    (tmp_path / "quiet.yaml").write_text("collector:\n  progress: false\n")
    runs = {}
    for name, extra in (("typed", ["data", "-v", "-p", "0.25"]), ("plain", [])):
        out = tmp_path / name
        # --duration: in `collect data`, -d is KernMLOps' benchmark folder
        done = kernmlops("collect", *extra, "-c", "quiet.yaml", "-o", str(out), "-b", "faux",
                         "--duration", "0.3", "--hooks", "process_trace", cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
        (collection,) = (out / "curated" / "benchmark=faux").iterdir()
        runs[name] = json.loads((collection / "manifest.json").read_text())["config"]["collector"]
    assert (runs["typed"]["progress"], runs["plain"]["progress"]) == (True, False)
    assert runs["typed"]["poll_interval_ms"] == 250  # 0.25 s
    assert runs["plain"]["poll_interval_ms"] != 250  # the default: -p changed it


@pytest.mark.bpf
def test_kernmlops_collect_data_no_hooks_cpus_and_benchmark_dir(tmp_path: Path) -> None:
    """KernMLOps' `collect data --no-hooks --cpus 1 -d DIR`: the benchmark runs, timed,
    on one CPU, with no hook loaded; the collection's folder holds its manifest alone,
    which says no hook ran, and the benchmark folder reaches the benchmarks' keys."""
    import json

    benchmarks = tmp_path / "kernmlops-benchmark"
    benchmarks.mkdir()
    out = tmp_path / "out"
    done = kernmlops("collect", "data", "--no-hooks", "--cpus", "1", "-d", str(benchmarks),
                     "-o", str(out), "--no-progress", "--",
                     "sh", "-c", "nproc > nproc.txt; sleep 0.4", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no hooks (--no-hooks): the benchmark runs untraced" in done.stderr
    assert (tmp_path / "nproc.txt").read_text() == "1\n"  # it ran, on one CPU
    (collection,) = (out / "curated" / "benchmark=command").iterdir()
    assert [p.name for p in collection.iterdir()] == ["manifest.json"]
    m = json.loads((collection / "manifest.json").read_text())
    assert (m["state"], m["exit_code"], m["hooks"], m["tables"]) == ("completed", 0, {}, {})
    assert m["config"]["collector"]["hooks"] == []
    assert m["filter"]["mode"] == "none"  # not even the process filter was loaded
    bench = m["benchmark"]
    assert bench["exit_code"] == 0
    assert bench["stopped_uptime_us"] - bench["started_uptime_us"] >= 400_000
    assert m["config"]["benchmark"]["cpus"] == 1
    assert m["config"]["benchmark"]["gap"]["source_dir"] == f"{benchmarks}/gap"
    last = done.stderr.splitlines()[-1]
    assert last.startswith("completed after ") and "no hooks; " in last  # after any setup
    assert last.endswith(str(collection))


@pytest.mark.bpf
def test_kernmlops_own_collect_d_is_still_a_duration(tmp_path: Path) -> None:
    import json

    done = kernmlops("collect", "-d", "0.3", "-o", "out", "-b", "faux", "--no-progress",
                     "--hooks", "process_trace", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (collection,) = (tmp_path / "out" / "curated" / "benchmark=faux").iterdir()
    m = json.loads((collection / "manifest.json").read_text())
    assert (m["state"], m["config"]["benchmark"]["duration_s"]) == ("duration", 0.3)
    assert list(m["hooks"]) == ["process_trace"]
