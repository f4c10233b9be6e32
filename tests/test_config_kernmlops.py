"""KernMLOps' configuration form (benchmark_config / collector_config): real
KernMLOps-style files mapped onto ours, errors naming the file's own keys with the
nearest valid one, mixing refused, and `kernmlops collect` finding ./overrides.yaml."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernmlops.config import load_config
from kernmlops.errors import ConfigError
from tests.conftest import needs_tools

#: written as a KernMLOps user writes an overrides.yaml (its defaults.yaml's shape)
KERNMLOPS_OVERRIDES = """\
---
benchmark_config:
  generic:
    benchmark: linux_build
    benchmark_dir: /srv/kernmlops-benchmark
    cpus: 2
    skip_clear_page_cache: true
    transparent_hugepages: madvise
  faux: {}
  linux_build: {}
  gap:
    gap_benchmark: pr
    gap_benchmark_size: 18
    trials: 2
  memcached:
    operation_count: 20000
    read_proportion: 0.95
    update_proportion: 0.05
collector_config:
  generic:
    poll_rate: 0.5
    output_dir: data
    output_graphs: true
    hooks:
      - memory_usage
      - process_metadata
      - quanta_runtime
      - block_io
      - mm_rss_stat
      - process_trace
"""


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "overrides.yaml"
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> str:
    path = _file(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "\n" not in message, message
    assert str(path) in message
    return message.split(": ", 1)[1]


def test_a_kernmlops_file_maps_onto_ours(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, KERNMLOPS_OVERRIDES))
    b, c = cfg.benchmark, cfg.collector
    assert b.name == "linux-build"
    assert (b.cpus, b.drop_page_cache, b.transparent_hugepages) == (2, False, "madvise")
    assert b.gap.source_dir == "/srv/kernmlops-benchmark/gap"
    assert b.linux_build.source_dir == "/srv/kernmlops-benchmark/linux_kernel"
    assert (b.gap.kernel, b.gap.scale, b.gap.trials) == ("pr", 18, 2)
    assert (b.memcached.operation_count, b.memcached.read_proportion) == (20000, 0.95)
    assert c.poll_interval_ms == 500 and c.output_graphs is True
    # our longest wait between polls follows a KernMLOps interval longer than its default
    assert c.poll_max_interval_ms == 500
    assert str(c.output_dir) == "data"
    assert c.hooks == ["memory_usage", "process_metadata", "quanta_runtime", "block_io",
                       "mm_rss_stat", "process_trace"]  # fmt: skip


#: KernMLOps' own defaults.yaml as its newer versions write it: `make collect-data`
#: reads it when there is no overrides.yaml, so it is a config as users run it. It
#: fills in sections of benchmarks kernmlops lacks (mongodb, linnos) and has
#: stress_ng run `stress-ng <args>`.
KERNMLOPS_DEFAULTS = """\
---
benchmark_config:
  generic:
    benchmark: faux
    benchmark_dir: ''
    cpus: 0
    skip_clear_page_cache: false
    transparent_hugepages: always
  faux: {}
  linux_build: {}
  gap:
    gap_benchmark: pr
    gap_benchmark_size: 25
    trials: 2
  mongodb:
    operation_count: 1000000
    read_proportion: 0.25
    update_proportion: 0.75
  linnos:
    use_root: false
    shuffle_traces: false
    type: baseline
    devices:
      - /dev/nvme0n1
      - /dev/nvme1n1
  memcached:
    operation_count: 1000000
    read_proportion: 0.99
    update_proportion: 0.01
  stress_ng:
    stress_ng_benchmark: stress-ng
    args:
      - --vm
      - "1"
      - --vm-ops
      - "1000000"
      - --timeout
      - 10s
collector_config:
  generic:
    poll_rate: 0.5
    output_dir: data
    output_graphs: false
    hooks:
      - memory_usage
      - process_trace
"""


def test_kernmlops_defaults_yaml_loads_as_it_is(tmp_path: Path) -> None:
    """Its mongodb and linnos sections were refused, so `kernmlops collect -c
    defaults.yaml` with KernMLOps' own file failed before collecting."""
    cfg = load_config(_file(tmp_path, KERNMLOPS_DEFAULTS))
    b = cfg.benchmark
    assert b.name == "faux"
    assert (b.gap.kernel, b.gap.scale, b.gap.trials) == ("pr", 25, 2)
    assert (b.memcached.operation_count, b.memcached.update_proportion) == (1_000_000, 0.01)
    # stress-ng runs with KernMLOps' arguments, last, so its --timeout 10s wins
    assert b.stress_ng.scenario == "custom"
    assert b.stress_ng.extra_args == ["--vm", "1", "--vm-ops", "1000000", "--timeout", "10s"]
    from kernmlops.benchmarks.stress_ng import StressNgBenchmark

    argv = StressNgBenchmark(b.stress_ng).describe().split()
    assert argv[0].endswith("stress-ng")
    assert argv[-6:] == ["--vm", "1", "--vm-ops", "1000000", "--timeout", "10s"]
    assert "--cpu" not in argv and "--vm-bytes" not in argv  # no stressor of ours


def test_keys_left_out_keep_our_defaults(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, "collector_config:\n  generic:\n    poll_rate: 0.02\n"))
    assert cfg.collector.poll_interval_ms == 20
    assert cfg.collector.poll_max_interval_ms == 100  # the default: longer than 20 ms
    default = load_config({})
    assert cfg.benchmark == default.benchmark
    assert cfg.collector.hooks == default.collector.hooks
    # KernMLOps clears the page cache unless told to skip: that maps to true
    cfg = load_config(_file(tmp_path, "benchmark_config: {generic: {skip_clear_page_cache: no}}"))
    assert cfg.benchmark.drop_page_cache is True


def test_flags_beat_a_kernmlops_file(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, KERNMLOPS_OVERRIDES), {"benchmark.name": "faux"})
    assert cfg.benchmark.name == "faux"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("benchmark_config: {generic: {cpu: 2}}",
         "benchmark_config.generic.cpu: unknown key; did you mean "
         "'benchmark_config.generic.cpus'?"),
        ("collector_config: {generic: {poll_rat: 1}}",
         "collector_config.generic.poll_rat: unknown key; did you mean "
         "'collector_config.generic.poll_rate'?"),
        ("collector_config: {generc: {}}",
         "collector_config.generc: unknown key; did you mean 'collector_config.generic'?"),
        ("benchmark_config: {memcachd: {}}",
         "benchmark_config.memcachd: unknown key; did you mean 'benchmark_config.memcached'?"),
        ("benchmark_config: {gap: {trails: 2}}",
         "benchmark_config.gap.trails: unknown key; did you mean 'benchmark_config.gap.trials'?"),
        ("benchmark_config: {generic: {benchmark: redsi}}",
         "benchmark_config.generic.benchmark: unknown benchmark 'redsi'; did you mean 'redis'?"),
        ("benchmark_config: {generic: {benchmark: mongodb}}",
         "KernMLOps' mongodb benchmark is not in kernmlops (mongodb is not in Debian)"),
        ("benchmark_config: {mongodb: {operation_cont: 5}}",
         "benchmark_config.mongodb.operation_cont: unknown key; did you mean "
         "'benchmark_config.mongodb.operation_count'?"),
        ("benchmark_config: {stress_ng: {stress_ng_benchmark: stress}}",
         "benchmark_config.stress_ng.stress_ng_benchmark: expected 'stress-ng'"),
        ("benchmark_config: {stress_ng: {args: --cpu 1}}",
         "benchmark_config.stress_ng.args: expected a list of arguments"),
        ("benchmark_config: {generic: {transparent_hugepages: sometimes}}",
         "benchmark_config.generic.transparent_hugepages: Input should be 'always', "
         "'madvise' or 'never'"),
        ("benchmark_config: {gap: {gap_benchmark: xx}}",
         "benchmark_config.gap.gap_benchmark: Input should be 'pr'"),
        ("benchmark_config: {memcached: {read_proportion: 0.5}}",
         "read_proportion + update_proportion must be 1"),
        ("collector_config: {generic: {hooks: [memory_usage, cbmm]}}",
         "collector_config.generic.hooks: KernMLOps' cbmm hook is not in kernmlops (it traces "
         "the CBMM kernel patches' own functions"),
        ("collector_config: {generic: {hooks: [quanta_runtim]}}",
         "collector_config.generic.hooks: unknown hook 'quanta_runtim'; did you mean "
         "'quanta_runtime'?"),
        ("collector_config: {generic: {poll_rate: 5}}",
         "collector_config.generic.poll_rate: expected a number of seconds > 0 and <= 1"),
        ("collector_config: {generic: {output_graphs: maybe}}",
         "collector_config.generic.output_graphs: Input should be a valid boolean"),
        ("benchmark_config: {generic: {skip_clear_page_cache: 3}}",
         "benchmark_config.generic.skip_clear_page_cache: expected true or false"),
        ("benchmark_config: [1, 2]", "benchmark_config: expected a mapping of keys"),
    ],
)  # fmt: skip
def test_errors_name_the_files_own_keys(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _error(tmp_path, text)


def test_mixing_both_forms_is_one_clear_error(tmp_path: Path) -> None:
    message = _error(
        tmp_path, "collector_config: {generic: {poll_rate: 0.5}}\nbenchmark: {name: faux}\n"
    )
    assert "mixes KernMLOps' form (collector_config) with kernmlops' (benchmark)" in message


def _collect(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernmlops", "collect", "--no-progress", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )  # fmt: skip


def test_collect_reads_overrides_yaml_here_and_says_so_first(tmp_path: Path) -> None:
    _file(tmp_path, "collector_config: {generic: {hooks: [quanta_runtim]}}\n")
    proc = _collect(tmp_path, "--", "true")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert lines[0].startswith("using overrides.yaml"), proc.stderr
    assert lines[1].startswith("error: invalid configuration in overrides.yaml: ")
    assert "collector_config.generic.hooks" in lines[1] and len(lines) == 2
    # -c wins: the file here is not read
    other = tmp_path / "other.yaml"
    other.write_text("collector: {hokos: []}\n")
    proc = _collect(tmp_path, "-c", str(other), "--", "true")
    assert "using overrides.yaml" not in proc.stderr
    assert "collector.hokos: unknown key" in proc.stderr


def _make_collect(cwd: Path, **env: str) -> str:
    """The command `make collect-data` would run in ``cwd`` (the Makefile's COLLECT)."""
    makefile = Path(__file__).resolve().parents[1] / "Makefile"
    proc = subprocess.run(
        ["make", "-s", "-f", str(makefile), "--eval", "kmo-print: ; @echo $(COLLECT)", "kmo-print"],
        cwd=cwd, capture_output=True, text=True, check=True,
        env={"PATH": os.environ["PATH"], **env},
    )  # fmt: skip
    return proc.stdout.strip()


@needs_tools("make")
def test_make_collect_data_takes_defaults_yaml_without_overrides_yaml(tmp_path: Path) -> None:
    """KernMLOps' Makefile runs with overrides.yaml where there is one, else
    defaults.yaml; ours named overrides.yaml always, which then did not exist."""
    assert _make_collect(tmp_path).endswith("kernmlops collect -c defaults.yaml")
    (tmp_path / "overrides.yaml").write_text("benchmark_config: {}\n")
    assert _make_collect(tmp_path).endswith("kernmlops collect -c overrides.yaml")
    mine = _make_collect(tmp_path, KERNMLOPS_CONFIG_FILE="mine.yaml")
    assert mine.endswith("kernmlops collect -c mine.yaml")


def test_benchmark_names_with_underscores_on_the_command_line(tmp_path: Path) -> None:
    # KernMLOps' -b linux_build picks linux-build (its check names the bad tree)
    (tmp_path / "o.yaml").write_text(f"benchmark: {{linux_build: {{source_dir: {tmp_path}}}}}\n")
    proc = _collect(tmp_path, "-b", "linux_build", "-c", "o.yaml")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"linux-build: {tmp_path} is not a Linux source tree" in proc.stderr


def test_kernmlops_collect_data_flags_map_as_its_config_keys(tmp_path: Path) -> None:
    """`collect data -d DIR --cpus N --no-hooks` reach the keys that a KernMLOps file's
    benchmark_dir and cpus reach, and an empty hooks list that only --no-hooks may give."""
    from kernmlops.config import Flags

    as_file = load_config(_file(tmp_path, KERNMLOPS_OVERRIDES))
    cfg = load_config({}, Flags(benchmark_dir="/srv/kernmlops-benchmark/", cpus=2, no_hooks=True))
    assert cfg.benchmark.gap.source_dir == as_file.benchmark.gap.source_dir
    assert cfg.benchmark.linux_build.source_dir == as_file.benchmark.linux_build.source_dir
    assert cfg.benchmark.linux_build.source_dir == "/srv/kernmlops-benchmark/linux_kernel"
    assert cfg.benchmark.cpus == as_file.benchmark.cpus == 2
    assert cfg.collector.hooks == []
    # the file's hooks give way to --no-hooks; an empty list without it is a slip
    assert load_config({"collector": {"hooks": ["process_trace"]}}, Flags(no_hooks=True)) \
        .collector.hooks == []  # fmt: skip
    with pytest.raises(ConfigError, match="--no-hooks runs the benchmark with none"):
        load_config({"collector": {"hooks": []}})
    with pytest.raises(ConfigError, match="give at least one hook"):
        load_config({}, Flags(hooks=[]))
