"""Config: defaults, the generated defaults.yaml, errors that name the key, precedence."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from kernmlops.config import (
    BenchmarkConfig,
    CollectorConfig,
    Config,
    HooksConfig,
    default_spool_memory_mib,
    defaults_yaml,
    every_section,
    load_config,
    read_overrides,
)
from kernmlops.errors import ConfigError
from kernmlops.hooks.bpf import default_ring_kib

REPO = Path(__file__).resolve().parent.parent


def _error(overrides, flags=None) -> str:
    with pytest.raises(ConfigError) as excinfo:
        load_config(overrides, flags)
    return str(excinfo.value)


def _write(tmp_path: Path, text: str, name: str = "overrides.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- defaults -----------------------------------------------------------------
def test_defaults_validate():
    cfg = Config()
    assert Config.model_validate(cfg.model_dump()) == cfg
    assert load_config() == cfg
    assert load_config({}) == cfg
    assert cfg.collector.output_dir == Path("data")
    assert cfg.collector.hooks == ["process_trace", "quanta_runtime", "memory_usage", "system_info"]
    assert cfg.collector.filter == "auto"
    assert cfg.collector.tgid is None
    assert cfg.collector.poll_interval_ms == 10
    assert cfg.benchmark.name == "stress-ng"
    # the busy rings grow with the machine: 8 MiB per 4 CPUs online (os.cpu_count()
    # counts the same CPUs where none are offline)
    assert cfg.hook_options("quanta_runtime").ring_kib is None
    assert cfg.hook_options("quanta_runtime").ring_bytes == default_ring_kib(os.cpu_count()) << 10
    assert cfg.hook_options("process_trace").ring_kib == 1024
    # "stress-ng" lives under the key stress_ng
    assert cfg.benchmark_options() is cfg.benchmark.stress_ng
    assert cfg.benchmark_options("stress-ng").duration_s == 10
    assert cfg.benchmark_options("command").argv == []


def test_defaults_yaml_parses_back_to_the_defaults():
    text = defaults_yaml()
    data = yaml.safe_load(text)
    assert set(data) == {"collector", "hooks", "benchmark"}
    assert Config.model_validate(data) == Config()
    assert load_config(data) == Config()


def test_the_repositorys_defaults_yaml_is_what_defaults_writes():
    """The checked-in defaults.yaml (what a reader of the repository opens first) says
    what the code does: regenerate it with `kernmlops defaults` after a change."""
    assert (REPO / "defaults.yaml").read_text() == defaults_yaml()


def _leaf_keys(model: BaseModel, path: tuple[str, ...] = ()):
    """(path, description) of every non-section field."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from _leaf_keys(value, (*path, name))
        else:
            yield (*path, name), field.description


def test_defaults_yaml_comments_every_key():
    lines = defaults_yaml().splitlines()
    leaves = list(_leaf_keys(every_section()))
    assert len(leaves) >= 20
    # walk the file, tracking the section path by indentation
    stack: list[str] = []
    seen: dict[tuple[str, ...], str] = {}
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z_][\w-]*):(.*)$", line)
        if not m:
            assert line == "" or line.lstrip().startswith("#"), line
            continue
        depth = len(m.group(1)) // 2
        stack[depth:] = [m.group(2)]
        if m.group(3).strip() in ("", "{}"):
            continue  # a section
        above = lines[i - 1]
        assert above.startswith(m.group(1) + "# "), f"no comment above {'.'.join(stack)}"
        seen[tuple(stack)] = above.strip().removeprefix("# ")
    assert seen == {path: desc for path, desc in leaves}
    assert all(desc for _, desc in leaves)


def test_committed_defaults_yaml_is_current():
    committed = REPO / "defaults.yaml"
    assert committed.exists(), "defaults.yaml is missing: run `make defaults`"
    assert committed.read_text() == defaults_yaml(), "defaults.yaml is stale: run `make defaults`"


# --- only the plug-ins a configuration names --------------------------------------
def _plugins_loaded_after(code: str) -> set[str]:
    """Hook and benchmark modules loaded by ``code`` in a fresh interpreter."""
    script = (
        "import json, sys\nfrom kernmlops.config import load_config\n"
        f"{code}\n"
        "print(json.dumps([m for m in sys.modules if m.startswith(('kernmlops.hooks.', "
        "'kernmlops.benchmarks.')) and m.rsplit('.', 1)[1] not in ('base', 'bpf') "
        "and not m.rsplit('.', 1)[1].startswith('_')]))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout))


def _modules(hooks=(), benchmarks=()) -> set[str]:
    from kernmlops.benchmarks import REGISTRY as BENCHMARKS
    from kernmlops.hooks import REGISTRY as HOOKS

    return {f"kernmlops.hooks.{HOOKS.index()[h][0]}" for h in hooks} | {
        f"kernmlops.benchmarks.{BENCHMARKS.index()[b][0]}" for b in benchmarks
    }


def test_a_configuration_imports_only_the_plugins_it_names_or_runs():
    from kernmlops.hooks import DEFAULT_HOOKS

    loaded = _plugins_loaded_after("load_config({'benchmark': {'name': 'faux'}})")
    assert loaded == _modules(DEFAULT_HOOKS, ["faux"])
    loaded = _plugins_loaded_after(
        "load_config({'collector': {'hooks': ['syscalls']}, 'hooks': {'page_faults': "
        "{'sample_every': 2}}, 'benchmark': {'gap': {}}}, {'collector.strict': True})"
    )
    # syscalls' module imports perf_counters' (its perf events): that is the module's doing
    assert loaded - {"kernmlops.hooks.perf_counters"} == _modules(
        ["syscalls", "page_faults"], ["gap", "stress-ng"]
    )


def test_sections_not_named_have_their_defaults():
    from kernmlops.benchmarks.gap import GapOptions
    from kernmlops.hooks.page_faults import PageFaultsOptions

    cfg = load_config({"benchmark": {"name": "faux"}, "collector": {"hooks": ["perf"]}})
    # the resolved configuration (the manifest's) holds the sections the run uses
    dumped = cfg.model_dump(mode="json")
    assert set(dumped["hooks"]) == {"perf"}
    assert set(dumped["benchmark"]) == {*BenchmarkConfig.model_fields, "faux"}
    assert cfg.hook_options("page_faults") == PageFaultsOptions()
    assert cfg.benchmark_options("gap") == GapOptions()
    assert cfg.hook_options("perf").poll_hz == 10
    with pytest.raises(KeyError):
        cfg.hook_options("nope")


def test_a_section_spelling_out_the_defaults_equals_the_defaults():
    assert load_config({"hooks": {"page_faults": {}}, "benchmark": {"fio": {}}}) == Config()
    assert load_config({"hooks": {"page_faults": {"sample_every": 1}}}) == Config()
    assert load_config({"hooks": {"page_faults": {"sample_every": 2}}}) != Config()
    assert load_config({"benchmark": {"name": "faux"}}) != Config()


def test_a_section_of_a_plugin_the_run_does_not_use_is_still_validated():
    msg = _error({"hooks": {"page_faults": {"sample_evry": 2}}, "benchmark": {"fio": {"bs": [4]}}})
    assert "hooks.page_faults.sample_evry: unknown key" in msg
    assert "did you mean 'hooks.page_faults.sample_every'?" in msg
    assert "benchmark.fio.bs.int: Input should be a valid integer (got [4])" in msg
    msg = _error({"benchmark": {"gap": 5}}, {"benchmark.gap.scale": 10})
    assert msg == "invalid configuration: benchmark.gap: expected a mapping of keys (got 5)"


def test_a_value_the_validator_names_already_is_not_named_twice():
    # fio's size validator says "(got '4x')" itself: the error said it twice
    msg = _error({"benchmark": {"fio": {"bs": "4x"}}})
    assert msg.endswith("benchmark.fio.bs: expected a size like 4096, 4k, 64M or 1G (got '4x')")
    assert msg.count("4x") == 1


# --- unknown keys -------------------------------------------------------------
def test_unknown_top_level_key():
    msg = _error({"colector": {}})
    assert "colector: unknown key" in msg
    assert "did you mean 'collector'?" in msg
    assert "valid here: benchmark, collector, hooks" in msg


def test_unknown_collector_key():
    msg = _error({"collector": {"poll_interval": 5}})
    assert "collector.poll_interval: unknown key" in msg
    assert "did you mean 'collector.poll_interval_ms'?" in msg


def test_unknown_hook_key_suggests_ring_kib():
    msg = _error({"hooks": {"quanta_runtime": {"ring_kb": 4096}}})
    assert "hooks.quanta_runtime.ring_kb: unknown key" in msg
    assert "did you mean 'hooks.quanta_runtime.ring_kib'?" in msg
    assert "(valid here: batch_ms, ring_groups, ring_kib)" in msg


def test_unknown_hook_section():
    msg = _error({"hooks": {"quanta_runtim": {}}})
    assert "hooks.quanta_runtim: unknown key" in msg
    assert "did you mean 'hooks.quanta_runtime'?" in msg


def test_unknown_benchmark_key():
    msg = _error({"benchmark": {"stress_ng": {"worker": 2}}})
    assert "benchmark.stress_ng.worker: unknown key" in msg
    assert "did you mean 'benchmark.stress_ng.workers'?" in msg


def test_benchmark_section_uses_underscores():
    msg = _error({"benchmark": {"stress-ng": {"workers": 2}}})
    assert "benchmark.stress-ng: unknown key" in msg
    assert "did you mean 'benchmark.stress_ng'?" in msg


def test_unknown_key_in_a_section_of_no_keys_says_so():
    msg = _error({"benchmark": {"name": "faux", "faux": {"x": 1}}})
    assert msg.endswith("benchmark.faux.x: unknown key (this section takes no keys)"), msg
    msg = _error({"hooks": {"system_info": {"poll_hz": 1}}})
    assert "hooks.system_info.poll_hz: unknown key (this section takes no keys)" in msg, msg


def test_unknown_key_far_from_any_gets_no_suggestion():
    msg = _error({"collector": {"zzzzzz": 1}})
    assert "collector.zzzzzz: unknown key" in msg
    assert "did you mean" not in msg


# --- wrong types and values ---------------------------------------------------
def test_wrong_type():
    msg = _error({"collector": {"poll_interval_ms": "fast"}})
    assert "collector.poll_interval_ms:" in msg
    assert "valid integer" in msg
    assert "(got 'fast')" in msg
    msg = _error({"collector": {"strict": "maybe"}})
    assert "collector.strict:" in msg
    assert "valid boolean" in msg


def test_section_of_wrong_type():
    msg = _error({"collector": ["a", "b"]})
    assert msg == "invalid configuration: collector: expected a mapping of keys (got ['a', 'b'])"
    msg = _error({"hooks": {"perf": 5}})
    assert msg == "invalid configuration: hooks.perf: expected a mapping of keys (got 5)"


def test_poll_interval_zero():
    msg = _error({"collector": {"poll_interval_ms": 0}})
    assert "collector.poll_interval_ms: Input should be greater than or equal to 1 (got 0)" in msg


def test_default_ring_and_memory_spool_sizes_grow_with_the_cpus_and_stay_bounded():
    # a 16-CPU switch storm fills a ring at ~200 MB/s: 32 MiB bridges ~160 ms
    cpus = (1, 2, 4, 5, 8, 16, 56, 192)
    assert [default_ring_kib(n) for n in cpus] == [
        8192, 8192, 8192, 16384, 16384, 32768, 131072, 262144
    ]  # fmt: skip
    # 64 MiB per CPU, at least 256, at most 1/16 of the RAM
    assert [default_spool_memory_mib(n, 24 << 10) for n in (2, 16, 192)] == [256, 1024, 1536]
    assert default_spool_memory_mib(192, 128 << 10) == 8192
    assert default_spool_memory_mib(16, 2 << 10) == 256
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
    assert Config().collector.spool_memory_mib is None
    assert Config().collector.spool_memory == default_spool_memory_mib(os.cpu_count(), ram)


@pytest.mark.parametrize("kib", [4, 64, 8192, 1 << 20])
def test_ring_kib_power_of_two_is_fine(kib):
    cfg = load_config({"hooks": {"quanta_runtime": {"ring_kib": kib}}})
    assert cfg.hook_options("quanta_runtime").ring_kib == kib
    assert cfg.hook_options("process_trace").ring_kib == 1024


def test_ring_kib_not_a_power_of_two():
    msg = _error({"hooks": {"quanta_runtime": {"ring_kib": 100}}})
    assert "hooks.quanta_runtime.ring_kib: must be a power of two, got 100" in msg


def test_filter_tgid_needs_tgid():
    msg = _error({"collector": {"filter": "tgid"}})
    assert "collector: filter 'tgid' needs collector.tgid" in msg
    cfg = load_config({"collector": {"filter": "tgid", "tgid": 42}})
    assert (cfg.collector.filter, cfg.collector.tgid) == ("tgid", 42)


def test_bad_filter_and_tgid_values():
    msg = _error({"collector": {"filter": "everything"}})
    assert "collector.filter:" in msg
    assert "'auto', 'system', 'tgid' or 'tree'" in msg
    msg = _error({"collector": {"tgid": 0}})
    assert "collector.tgid: Input should be greater than or equal to 1 (got 0)" in msg


def test_unknown_hook_name_suggests():
    msg = _error({"collector": {"hooks": ["process_trace", "quanta_runtme"]}})
    assert "collector.hooks: unknown hook 'quanta_runtme'" in msg
    assert "did you mean 'quanta_runtime'?" in msg
    from kernmlops.hooks import REGISTRY

    assert all(name in msg.split("known: ")[1] for name in REGISTRY)


def test_duplicate_hooks_are_dropped_in_order():
    cfg = load_config({"collector": {"hooks": ["system_info", "process_trace", "system_info"]}})
    assert cfg.collector.hooks == ["system_info", "process_trace"]


def test_unknown_benchmark_name():
    msg = _error({"benchmark": {"name": "stress"}})
    assert "benchmark.name: unknown benchmark 'stress'; did you mean 'stress-ng'?" in msg
    from kernmlops.benchmarks import REGISTRY

    assert msg.split("(known: ")[1].split(")")[0] == ", ".join(REGISTRY)
    assert "(got 'stress')" in msg
    assert "did you mean" not in _error({"benchmark": {"name": "zzzzzz"}})
    assert "benchmark.name: Input should be a valid string" in _error({"benchmark": {"name": 5}})


def test_every_error_is_reported():
    msg = _error({"collector": {"poll_interval_ms": 0, "bogus": 1}, "benchmark": {"name": "x"}})
    assert msg.startswith("invalid configuration:\n")
    assert "collector.poll_interval_ms:" in msg
    assert "collector.bogus: unknown key" in msg
    assert "benchmark.name:" in msg
    assert len(msg.splitlines()) == 4


def test_assignment_is_validated():
    cfg = Config()
    with pytest.raises(ValidationError):
        cfg.collector.poll_interval_ms = 0
    assert cfg.collector.poll_interval_ms == 10


def test_section_models_forbid_extra_keys():
    for model in (CollectorConfig, HooksConfig, BenchmarkConfig):
        with pytest.raises(ValidationError):
            model.model_validate({"nope": 1})


# --- overrides files ----------------------------------------------------------
def test_overrides_file_not_a_mapping(tmp_path):
    path = _write(tmp_path, "- collector\n- hooks\n")
    msg = _error(path)
    assert str(path) in msg
    assert "the top level must be a mapping" in msg


def test_overrides_file_not_yaml(tmp_path):
    path = _write(tmp_path, "collector: [unclosed\n  poll: {\n")
    msg = _error(path)
    assert f"{path} is not valid YAML" in msg


def test_overrides_file_missing(tmp_path):
    path = tmp_path / "absent.yaml"
    msg = _error(path)
    assert f"cannot read config {path}" in msg
    assert "No such file or directory" in msg
    with pytest.raises(ConfigError, match=r"absent\.yaml"):
        read_overrides(str(path))


def test_overrides_file_empty_means_defaults(tmp_path):
    path = _write(tmp_path, "# nothing to change\n")
    assert read_overrides(path) == {}
    assert load_config(path) == Config()
    # ... and the caller hears of it (collect says so): a file meant to change the
    # defaults that holds nothing, or a FIFO nothing was written to
    said: list[str] = []
    assert load_config(path, on_empty=said.append) == Config()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert load_config(fifo, on_empty=said.append) == Config()
    assert said == [str(path), str(fifo)]
    set_one = _write(tmp_path, "collector:\n  flush_interval_s: 2\n")
    assert load_config(set_one, on_empty=said.append).collector.flush_interval_s == 2
    assert len(said) == 2


def test_error_in_a_file_names_the_file(tmp_path):
    path = _write(tmp_path, "collector:\n  poll_interval_ms: 0\n")
    msg = _error(path)
    assert msg.startswith(f"invalid configuration in {path}:")
    assert "collector.poll_interval_ms" in msg


def test_defaults_yaml_as_an_overrides_file(tmp_path):
    path = _write(tmp_path, defaults_yaml())
    assert load_config(path) == Config()
    assert load_config(str(path)) == Config()


# --- precedence ---------------------------------------------------------------
def test_file_beats_defaults(tmp_path):
    path = _write(
        tmp_path,
        "collector:\n  poll_interval_ms: 50\n  hooks: [system_info]\n"
        "hooks:\n  quanta_runtime:\n    ring_kib: 64\n"
        "benchmark:\n  name: faux\n",
    )
    cfg = load_config(path)
    assert cfg.collector.poll_interval_ms == 50
    assert cfg.collector.hooks == ["system_info"]
    assert cfg.hook_options("quanta_runtime").ring_kib == 64
    assert cfg.benchmark.name == "faux"
    # untouched keys keep their defaults
    assert cfg.collector.flush_interval_s == 5.0
    assert cfg.hook_options("process_trace").ring_kib == 1024


def test_flags_beat_the_file(tmp_path):
    path = _write(tmp_path, "collector:\n  poll_interval_ms: 50\n  strict: true\n")
    cfg = load_config(path, {"collector.poll_interval_ms": 20})
    assert cfg.collector.poll_interval_ms == 20
    assert cfg.collector.strict is True  # from the file
    cfg = load_config(path, {"hooks.process_trace.ring_kib": 16, "benchmark.name": "command"})
    assert cfg.collector.poll_interval_ms == 50
    assert cfg.hook_options("process_trace").ring_kib == 16
    assert cfg.benchmark.name == "command"


def test_flag_that_is_none_does_not_override(tmp_path):
    path = _write(tmp_path, "collector:\n  poll_interval_ms: 50\n")
    cfg = load_config(path, {"collector.poll_interval_ms": None, "benchmark.duration_s": None})
    assert cfg.collector.poll_interval_ms == 50
    assert cfg.benchmark.duration_s is None
    assert load_config(None, {"collector.poll_interval_ms": None}) == Config()


def test_flags_are_validated():
    msg = _error(None, {"collector.poll_interval_ms": 0})
    assert "collector.poll_interval_ms: Input should be greater than or equal to 1" in msg
    msg = _error(None, {"collector.poll_intervl_ms": 5})
    assert "did you mean 'collector.poll_interval_ms'?" in msg


@pytest.mark.parametrize("seconds", [float("inf"), float("-inf"), float("nan"), 0.0, -1.0])
def test_a_duration_must_be_finite_and_positive(tmp_path: Path, seconds: float) -> None:
    # -d inf passed gt=0 and the collection never stopped; a file's .inf as well
    msg = _error(None, {"benchmark.duration_s": seconds})
    assert msg.startswith("invalid configuration: benchmark.duration_s: Input should be")
    assert load_config(None, {"benchmark.duration_s": 0.5}).benchmark.duration_s == 0.5
    path = _write(tmp_path, "benchmark:\n  duration_s: .inf\n")
    assert "duration_s: Input should be a finite number (got inf)" in _error(path)


def test_flag_below_a_value_is_an_error(tmp_path):
    path = _write(tmp_path, "collector:\n  poll_interval_ms: 50\n")
    with pytest.raises(ConfigError, match="poll_interval_ms is not a section"):
        load_config(path, {"collector.poll_interval_ms.x": 1})


def test_flags_do_not_change_the_callers_overrides():
    overrides = {"collector": {"poll_interval_ms": 5}}
    cfg = load_config(overrides, {"collector.poll_interval_ms": 20})
    assert cfg.collector.poll_interval_ms == 20
    assert overrides == {"collector": {"poll_interval_ms": 5}}


# --- hostile and broken files (kernmlops.yamlfile does the reading) ----------------
def test_a_section_that_is_not_a_mapping_names_the_file_and_the_section(tmp_path):
    path = _write(tmp_path, "collector: 5\n")
    expected = f"invalid configuration in {path}: collector: expected a mapping of keys (got 5)"
    assert _error(path) == expected
    # a flag below it (-o sets collector.output_dir) must not take the blame
    assert _error(path, {"collector.output_dir": "/tmp/out"}) == expected
    assert _error(path, {"hooks.process_trace.ring_kib": 16}) == expected


def test_errors_from_flags_say_so(tmp_path):
    path = _write(tmp_path, "collector:\n  poll_interval_ms: 50\n")
    msg = _error(path, {"collector.strict": "maybe"})
    # only the flag is wrong: the file is not blamed
    assert msg.startswith("invalid configuration: collector.strict: Input should be a valid")
    assert msg.endswith("(got 'maybe') (set on the command line)")
    path = _write(tmp_path, "collector:\n  poll_interval_ms: 0\n")
    head, *lines = _error(path, {"collector.strict": "maybe"}).splitlines()
    assert head == f"invalid configuration in {path}:"
    by_key = {line.split(":")[0].removeprefix("  - "): line for line in lines}
    assert set(by_key) == {"collector.poll_interval_ms", "collector.strict"}
    assert not by_key["collector.poll_interval_ms"].endswith("(set on the command line)")
    assert by_key["collector.strict"].endswith("(set on the command line)")


def test_thousands_of_errors_are_cut_short(tmp_path):
    path = _write(tmp_path, "collector:\n" + "".join(f"  k{i}: 1\n" for i in range(5000)))
    lines = _error(path).splitlines()
    assert lines[0] == f"invalid configuration in {path}:"
    assert len(lines) == 1 + 20 + 1
    assert lines[1].startswith("  - collector.k0: unknown key")
    assert lines[-1] == "  ... and 4,980 more"


def test_a_long_value_is_shown_cut_short():
    msg = _error({"collector": {"poll_interval_ms": "x" * 100_000}})
    assert len(msg) < 300
    assert "(got 'xxxxxxxxxxxx...xxxxxxxxxxxxx')" in msg


def _bomb(levels: int) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "x:\n" + "".join(f"  {line}\n" for line in lines)


@pytest.mark.parametrize(
    "use",
    [
        "",  # the bomb alone (unknown keys)
        "benchmark:\n  command:\n    argv: *a8\n",  # validated as a list of strings
        "hooks:\n  perf:\n    events: *a8\n",
    ],
)
def test_an_alias_bomb_is_refused_fast_on_the_whole_load_config_path(tmp_path, use):
    # Before: minutes and gigabytes (pydantic walked every alias); a 9-level bomb.
    path = _write(tmp_path, _bomb(9) + use)
    # this thread's CPU time, not the wall clock's: a starved test (CI's idle lane)
    # waits seconds for a CPU, while the bomb itself cost minutes of CPU
    started = time.thread_time()
    msg = _error(path)
    assert time.thread_time() - started < 0.5
    assert msg.startswith(f"{path}: refused: line ")
    assert msg.endswith("more than 50,000 values once its aliases are expanded (an alias bomb?)")


def test_huge_and_binary_config_files(tmp_path):
    big = _write(tmp_path, "#" * (3 << 20) + "\n", "big.yaml")
    assert _error(big) == f"{big} is 3.0 MiB: a config file may be at most 1 MiB"
    binary = _write(tmp_path, "", "bin.yaml")
    binary.write_bytes(bytes(range(256)) * 4)
    assert _error(binary) == f"{binary} is not a text file (a NUL byte at offset 0): expected YAML"
    latin1 = _write(tmp_path, "", "latin1.yaml")
    latin1.write_bytes(b"collector:\n  output_dir: /tmp/caf\xe9\n")
    assert _error(latin1) == (f"{latin1} is not UTF-8 text (byte 0xe9 at offset 33): expected YAML")


@pytest.mark.parametrize(
    ("content", "flags", "expected"),
    [
        (b"collector: 5\n", ["-o", "out"], "collector: expected a mapping of keys (got 5)"),
        (bytes(range(256)), [], "is not a text file (a NUL byte at offset 0)"),
        (b"\xd0\xcf\x11\xe0 office", [], "is not UTF-8 text (byte 0xd0 at offset 0)"),
        (_bomb(9).encode(), [], "(an alias bomb?)"),
        (b"#" * (2 << 20), [], "is 2 MiB: a config file may be at most 1 MiB"),
    ],
)
def test_collect_refuses_a_hostile_config_in_one_line(tmp_path, content, flags, expected):
    path = tmp_path / "hostile.yaml"
    path.write_bytes(content)
    proc = subprocess.run(
        [sys.executable, "-m", "kernmlops", "collect", "-c", str(path), *flags, "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert str(path) in lines[0] and expected in lines[0]


def test_a_longest_poll_wait_below_the_shortest_is_refused(tmp_path: Path) -> None:
    # accepted before without a word
    said = _error(_write(tmp_path, "collector:\n  poll_max_interval_ms: 1\n"))
    assert "poll_max_interval_ms (1) is below poll_interval_ms (10)" in said
    assert "\n" not in said
    ok = "collector:\n  poll_interval_ms: 5\n  poll_max_interval_ms: 5\n"
    assert load_config(_write(tmp_path, ok)).collector.poll_max_interval_ms == 5
    # not given: the default longest wait follows a longer interval (a KernMLOps file's)
    longer = load_config(_write(tmp_path, "collector:\n  poll_interval_ms: 500\n"))
    assert longer.collector.poll_max_interval_ms == 500


# --- output_dir -----------------------------------------------------------------
def test_a_files_output_dir_in_the_home_folder_is_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``output_dir: ~/runs`` made a folder named '~' in the current one."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SUDO_UID", raising=False)
    assert load_config({"collector": {"output_dir": "~/runs"}}).collector.output_dir == (
        tmp_path / "runs"
    )
    assert load_config({"collector": {"output_dir": "~"}}).collector.output_dir == tmp_path
    assert load_config({"collector": {"output_dir": "a~/b"}}).collector.output_dir == Path("a~/b")


def test_under_sudo_the_home_folder_is_the_invoking_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pwd

    from tests.conftest import skip_here

    if os.geteuid() != 0:
        skip_here("sudo's environment counts only for root")
    monkeypatch.setenv("HOME", str(tmp_path))  # root's, as sudo may leave it
    monkeypatch.setenv("SUDO_UID", "65534")
    monkeypatch.setenv("SUDO_GID", "65534")
    home = Path(pwd.getpwuid(65534).pw_dir)
    cfg = load_config({"collector": {"output_dir": "~/runs"}})
    assert cfg.collector.output_dir == home / "runs"
