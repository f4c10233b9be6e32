"""StressNgBenchmark: argv per scenario, scaled to the CPUs and NUMA nodes;
metrics parsed from stress-ng's YAML; real short runs, and one through the CLI."""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from pathlib import Path

import polars as pl
import pytest
from pydantic import ValidationError

from kernmlops.benchmarks import _tools, stress_ng
from kernmlops.benchmarks.base import BenchmarkRun
from kernmlops.benchmarks.stress_ng import (
    MLLB_SCENARIOS,
    StressNgBenchmark,
    numa_nodes,
    parse_metrics_yaml,
)
from kernmlops.errors import BenchmarkError
from kernmlops.host.cpus import online_cpu_count
from kernmlops.workloads import mllb
from tests.conftest import needs_tools

needs_stress_ng = needs_tools("stress-ng")
ALL_SCENARIOS = [
    "mixed", "cpu", "switch", "vm", "io",
    "numa", "cpu-half", "cache", "oversubscribe", "hdd-seek", "matrixprod", "fft", "mllb-mixed",
]  # fmt: skip


def _bench(**options: object) -> StressNgBenchmark:
    return StressNgBenchmark(StressNgBenchmark.Options(**options))


def _argv(**options: object) -> list[str]:
    bench = _bench(**options)
    launch = bench.launch()
    bench.teardown()  # its metrics folder
    assert launch is not None
    return launch.argv


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _stressors(argv: list[str]) -> set[str]:
    known = {
        "--cpu", "--switch", "--vm", "--hdd", "--iomix", "--malloc", "--numa", "--cache",
        "--seek", "--matrix",
    }  # fmt: skip
    return {a for a in argv if a in known}


@pytest.fixture
def two_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake sysfs: 8 CPUs online, node0 = 0-3, node1 = 4-7, node2 memory only."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "online").write_text("0-7\n")
    for node, cpus in (("node0", "0-3"), ("node1", "4-7"), ("node2", "")):
        (tmp_path / "node" / node).mkdir(parents=True)
        (tmp_path / "node" / node / "cpulist").write_text(cpus + "\n")
    monkeypatch.setattr(stress_ng, "NODE_ROOT", tmp_path / "node")
    monkeypatch.setattr(stress_ng, "CPU_ONLINE", tmp_path / "cpu" / "online")
    monkeypatch.setattr(stress_ng, "online_cpu_count", lambda: 8)
    return tmp_path


def test_class_facts() -> None:
    assert StressNgBenchmark.name == "stress-ng"
    assert StressNgBenchmark.default_filter == "tree"
    opts = StressNgBenchmark.Options()
    assert (opts.scenario, opts.duration_s, opts.workers, opts.extra_args) == ("mixed", 10, 0, [])
    for name in [*ALL_SCENARIOS, "custom"]:
        StressNgBenchmark.Options(scenario=name)  # every scenario is a valid value


@pytest.mark.parametrize(
    "bad", [{"scenario": "disk"}, {"duration_s": 0}, {"workers": -1}, {"timeout": 3}]
)
def test_bad_options(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        StressNgBenchmark.Options(**bad)


def test_mixed_scales_to_online_cpus() -> None:
    n = online_cpu_count()
    argv = _argv(duration_s=5)
    assert argv[0] == "stress-ng"
    assert _flag(argv, "--cpu") == str(n)
    assert _flag(argv, "--switch") == str(max(1, n // 2))
    assert _flag(argv, "--vm") == str(max(1, n // 2))
    assert _flag(argv, "--vm-bytes") == "64M"
    assert _flag(argv, "--hdd") == str(max(1, n // 4))
    assert _flag(argv, "--temp-path") == tempfile.gettempdir()
    assert _flag(argv, "--timeout") == "5s"
    assert "--metrics-brief" in argv


def test_mixed_on_a_big_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stress_ng, "online_cpu_count", lambda: 16)
    argv = _argv()
    assert [_flag(argv, f) for f in ("--cpu", "--switch", "--vm", "--hdd")] == ["16", "8", "8", "4"]
    assert _flag(argv, "--timeout") == "10s"


@pytest.mark.parametrize(
    ("scenario", "flags"),
    [
        ("cpu", {"--cpu": "3"}),
        ("switch", {"--switch": "3"}),
        ("vm", {"--vm": "3", "--vm-bytes": "64M"}),
        ("io", {"--hdd": "3", "--iomix": "1"}),
    ],
)
def test_general_scenarios_use_workers(scenario: str, flags: dict[str, str]) -> None:
    argv = _argv(scenario=scenario, workers=3)
    for flag, value in flags.items():
        assert _flag(argv, flag) == value
    assert _stressors(argv) == _stressors(list(flags))


def test_numa_nodes_from_sysfs(two_nodes: Path) -> None:
    nodes = numa_nodes()
    assert nodes == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}  # memory-only node2 left out


def test_numa_nodes_offline_cpus_and_no_sysfs(tmp_path: Path, two_nodes: Path) -> None:
    (two_nodes / "cpu" / "online").write_text("0-2,4\n")
    assert numa_nodes() == {0: [0, 1, 2], 1: [4]}
    assert numa_nodes(tmp_path / "missing") == {0: [0, 1, 2, 4]}


def test_mllb_scenarios_are_the_shared_forms(two_nodes: Path) -> None:
    # one definition: the stressors are kernmlops.workloads.mllb's (which lb.effect
    # measures with), on this machine's nodes
    assert set(MLLB_SCENARIOS.values()) == set(mllb.BY_NAME)
    nodes = {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    for ours, theirs in MLLB_SCENARIOS.items():
        argv = _argv(scenario=ours)
        want = mllb.BY_NAME[theirs].argv(nodes, mllb.LAB_SIZES)
        assert argv[1 : len(want) + 1] == want
        big = _argv(scenario=ours, mllb_sizes=True)
        assert big[1 : len(want) + 1] == mllb.BY_NAME[theirs].argv(nodes, mllb.Sizes())
    # MLLB's forms on 8 CPUs of 2 nodes, written out (the notes' counts x 8/56)
    assert _argv(scenario="numa")[1:11] == [
        "--vm", "1", "--vm-bytes", "64M", "--vm-method", "rand-set", "--taskset", "0,1,2,3",
        "--mbind", "1",
    ]  # fmt: skip
    assert _argv(scenario="cpu-half")[1:7] == [
        "--cpu", "4", "--cpu-method", "matrixprod", "--taskset", "0,1,2,3",
    ]  # fmt: skip
    assert _argv(scenario="oversubscribe")[1:3] == ["--cpu", "16"]
    assert _argv(scenario="matrixprod", mllb_sizes=True)[1:7] == [
        "--matrix", "5", "--matrix-method", "prod", "--matrix-size", "512",
    ]  # fmt: skip
    assert _stressors(_argv(scenario="mllb-mixed")) == {"--cpu", "--vm", "--hdd"}


def test_mllb_scenarios_refuse_workers() -> None:
    with pytest.raises(BenchmarkError, match="leave workers at 0"):
        _bench(scenario="fft", workers=3).check()


def test_numa_needs_two_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stress_ng, "numa_nodes", lambda: {0: [0, 1]})
    with pytest.raises(BenchmarkError, match="numa needs two NUMA nodes"):
        _bench(scenario="numa").check()


def test_cpu_half_on_this_machine() -> None:
    nodes = numa_nodes()
    argv = _argv(scenario="cpu-half")
    cpus = nodes[min(nodes)] if len(nodes) > 1 else nodes[min(nodes)][: max(1, len(nodes[0]) // 2)]
    assert _flag(argv, "--taskset") == ",".join(map(str, cpus))
    assert len(cpus) <= max(1, online_cpu_count() // 2) or len(nodes) > 1


def test_custom_runs_only_extra_args() -> None:
    argv = _argv(scenario="custom", extra_args=["--sock", "2"])
    assert argv[:3] == ["stress-ng", "--timeout", "10s"]
    assert argv[-2:] == ["--sock", "2"]
    with pytest.raises(BenchmarkError, match="scenario 'custom' runs the stressors in extra_args"):
        _bench(scenario="custom").check()


def test_duration_rounds_up_and_extra_args_last() -> None:
    argv = _argv(scenario="cpu", duration_s=2.5, extra_args=["--verify", "--cpu-method", "fft"])
    assert _flag(argv, "--timeout") == "3s"
    assert argv[-3:] == ["--verify", "--cpu-method", "fft"]
    assert _flag(_argv(scenario="cpu", duration_s=0.1), "--timeout") == "1s"


def test_metrics_go_to_a_private_yaml_file(tmp_path: Path) -> None:
    a, b = _bench(), _bench()
    try:
        # launched before setup (no workdir): a folder of its own, 0700
        assert a.yaml_path.parent != b.yaml_path.parent
        folder = a.yaml_path.parent
        st = os.lstat(folder)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
        assert st.st_uid == os.geteuid() and folder.parent == Path(tempfile.gettempdir())
        launch = a.launch()
        assert launch is not None and launch.capture_output
        assert _flag(launch.argv, "--yaml") == str(a.yaml_path) == _flag(a.launch().argv, "--yaml")
    finally:
        a.teardown()
        b.teardown()
    assert not folder.exists()  # teardown removed its own folder
    # set up by the session first: in the run's private workdir, which stays
    c = _bench()
    c.setup(tmp_path)
    assert c.yaml_path == tmp_path / "stress-ng.yaml"
    c.teardown()
    assert tmp_path.is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_a_neighbour_cannot_plant_a_link_at_the_metrics_file(tmp_path: Path) -> None:
    """The attack as filed: the metrics file's name is in stress-ng's argv, which every
    user reads; nobody plants a link there before root's stress-ng writes its report."""
    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:$6$precious\n")
    secret.chmod(0o600)
    os.chmod(tmp_path, 0o755)
    bench = _bench(scenario="cpu", workers=1, duration_s=1)
    try:
        name = str(bench.yaml_path)
        plant = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "ln", "-s", str(secret), name],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert plant.returncode != 0 and "Permission denied" in plant.stderr, plant
        assert not os.path.lexists(name)
    finally:
        bench.teardown()
    assert secret.read_bytes() == b"root:$6$precious\n"


def test_results_never_read_the_metrics_file_through_a_link(tmp_path: Path) -> None:
    """A benchmark run as the user owns its folder: a link it leaves at the metrics
    file (to a file only root reads) is refused in one line, and its target not read."""
    secret = tmp_path / "shadow"
    secret.write_text("metrics: [{stressor: leaked, bogo-ops: 1}]\n")
    work = tmp_path / "work"
    work.mkdir()
    bench = _bench(scenario="cpu", workers=1, duration_s=1)
    bench.setup(work)
    bench.yaml_path.symlink_to(secret)
    with pytest.raises(BenchmarkError, match=r"stress-ng: .* not read"):
        bench.results(BenchmarkRun(workdir=work, exit_code=0))
    bench.yaml_path.unlink()
    os.link(secret, bench.yaml_path)  # a second name of another file
    with pytest.raises(BenchmarkError, match="not a file of its own"):
        bench.results(BenchmarkRun(workdir=work, exit_code=0))


def test_describe_is_the_command() -> None:
    bench = _bench(scenario="cpu", workers=2, duration_s=1)
    tmp = tempfile.gettempdir()
    assert bench.describe() == f"stress-ng --cpu 2 --timeout 1s --metrics-brief --temp-path {tmp}"


def test_check_missing_stress_ng(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tools.shutil, "which", lambda name: None)
    with pytest.raises(BenchmarkError, match="apt-get install stress-ng"):
        StressNgBenchmark().check()


SAMPLE_YAML = """\
---
system-info:
      stress-ng-version: 0.15.06
      cpus: 2

metrics:
    - stressor: cpu
      bogo-ops: 644
      bogo-ops-per-second-usr-sys-time: 2032.077800
      bogo-ops-per-second-real-time: 321.886765
      wall-clock-time: 2.000704
      user-time: 0.313232
      system-time: 0.003685
      cpu-usage-per-instance: 15.840278
      max-rss: 2996

    - stressor: seek
      bogo-ops: 6382
      bogo-ops-per-second-usr-sys-time: 19903.880040
      bogo-ops-per-second-real-time: 3159.641662
      wall-clock-time: 2.019849
      user-time: 0.038171
      system-time: 0.282470
      cpu-usage-per-instance: 15.874501
      max-rss: 2568
      nanosecs-per-seek: 2747.526536

..."""


def test_parse_metrics_yaml() -> None:
    rows = {(k, m): (v, u) for k, m, v, u in parse_metrics_yaml(SAMPLE_YAML)}
    assert rows[("cpu", "bogo_ops")] == (644.0, "ops")
    assert rows[("cpu", "bogo_ops_per_s_real")] == (321.886765, "1/s")
    assert rows[("cpu", "bogo_ops_per_s_usr_sys")] == (2032.0778, "1/s")
    assert rows[("cpu", "wall_clock_s")] == (2.000704, "s")
    assert rows[("cpu", "max_rss_kib")] == (2996.0, "KiB")
    assert rows[("seek", "nanosecs_per_seek")] == (2747.526536, "ns")  # as its name says
    assert len(rows) == 8 + 9
    assert parse_metrics_yaml("---\nsystem-info:\n  cpus: 2\n...") == []


def test_a_stressors_own_metrics_get_the_unit_their_names_say() -> None:
    from kernmlops.benchmarks.stress_ng import _metric_unit

    # names stress-ng 0.15 writes for switch and hdd
    assert _metric_unit("nanosecs-per-context-switch-pipe-method") == "ns"
    assert _metric_unit("mbsec-read-rate") == "MB/s"
    assert _metric_unit("mbsec-readwrite-combined-rate") == "MB/s"
    assert _metric_unit("context-switches-per-sec") == "1/s"
    assert _metric_unit("average-pages-per-fault") == ""  # no unit in its name: none guessed


@needs_stress_ng
@pytest.mark.parametrize("scenario", ALL_SCENARIOS)
def test_flags_exist_in_installed_stress_ng(scenario: str, monkeypatch: pytest.MonkeyPatch) -> None:
    help_text = subprocess.run(
        ["stress-ng", "--help"], capture_output=True, text=True, check=False
    ).stdout
    if scenario == "numa" and len(numa_nodes()) < 2:
        # remote memory needs a second node: refused here in one line, and its
        # flags checked on a made-up two-node machine (no dry run: --mbind 1
        # names a node this one lacks)
        with pytest.raises(BenchmarkError, match="two NUMA nodes"):
            _bench(scenario="numa").check()
        monkeypatch.setattr(stress_ng, "numa_nodes", lambda: {0: [0], 1: [1]})
        argv = _argv(scenario=scenario)
        assert all(f"{a} " in help_text for a in argv if a.startswith("--"))
        Path(_flag(argv, "--yaml")).unlink(missing_ok=True)
        return
    argv = _argv(scenario=scenario)
    for arg in argv:
        if arg.startswith("--"):
            assert f"{arg} " in help_text, arg
    # --dry-run parses everything (methods, taskset ranges) and runs nothing.
    done = subprocess.run(
        [*argv, "--dry-run"], capture_output=True, text=True, timeout=30, check=False
    )
    Path(_flag(argv, "--yaml")).unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr + done.stdout


def _run(bench: StressNgBenchmark, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list]:
    """Run the benchmark's command the way the session does, then its results()."""
    bench.check()
    launch = bench.launch()
    assert launch is not None
    try:
        done = subprocess.run(launch.argv, capture_output=True, text=True, timeout=60, check=False)
        frame = bench.results(BenchmarkRun(workdir=tmp_path, exit_code=done.returncode))
    finally:
        bench.teardown()
    assert not bench.yaml_path.exists()  # teardown removed it
    assert frame is not None
    return done, frame.rows()


@needs_stress_ng
def test_mixed_runs_for_two_seconds(tmp_path: Path) -> None:
    done, rows = _run(_bench(scenario="mixed", duration_s=2), tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    out = done.stdout + done.stderr
    assert "successful run completed" in out
    got = {(k, m): v for k, m, v, _ in rows}
    for stressor in ("cpu", "switch", "vm", "hdd"):
        assert f"] {stressor} " in out  # a metrics line per stressor
        ops, wall = got[(stressor, "bogo_ops")], got[(stressor, "wall_clock_s")]
        assert ops > 0
        # stress-ng stops every stressor at one alarm, so one forked late on a busy
        # machine runs for less (1.899 s seen); seconds, not ms or the run's whole time
        assert 1.5 <= wall <= 4.0
        assert got[(stressor, "bogo_ops_per_s_real")] == pytest.approx(ops / wall, rel=0.02)


@needs_stress_ng
def test_other_scenarios_run(tmp_path: Path) -> None:
    # The four run side by side: one second in all, not four.
    benches = {
        name: _bench(scenario=name, duration_s=1, workers=1)
        for name in ("cpu", "switch", "vm", "io")
    }
    procs = {}
    try:
        for name, bench in benches.items():
            launch = bench.launch()
            assert launch is not None
            procs[name] = subprocess.Popen(
                launch.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, out
            frame = benches[name].results(BenchmarkRun(workdir=tmp_path, exit_code=0))
            assert frame is not None
            stressors = set(frame.filter(pl.col("metric") == "bogo_ops")["key"].to_list())
            assert stressors == {"io": {"hdd", "iomix"}}.get(name, {name})
    finally:
        for name, bench in benches.items():
            if name in procs and procs[name].poll() is None:
                procs[name].kill()
            bench.teardown()
