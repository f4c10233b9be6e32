"""Duet config: the duet.yml form, inheritance, and errors that name the key path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from kernmlops.duet.config import load_duet_config, parse_cpus, validate_duet_config
from kernmlops.errors import ConfigError
from tests.yamlbomb import alias_bomb

BASE = """
duetbench:
  suite: renaissance
  seed: 42
  duet_repetitions: 3
  sequential_repetitions: 2
  schedule: randomized_interleaving_trials
  artifacts: {java: java -version}
  timeout: 600
  run_base: java -jar renaissance.jar --json results.json
  results: [results.json]
  duets: [scrabble, chi-square]

scrabble:
  A: {run: scrabble}
  B: {run: scrabble, run_base: java17 -jar renaissance.jar --json results.json}

chi-square:
  duet_repetitions: 5
  timeout: 0
  A: {run: chi-square}

unused:
  A: {run: whatever}
"""


def _load(text: str):
    return validate_duet_config(yaml.safe_load(text), "duet.yml")


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        _load(text)
    return str(info.value)


def test_resolves_inheritance_and_aa():
    suite = _load(BASE)
    assert suite.suite == "renaissance"
    assert suite.seed == 42
    assert suite.schedule == "randomized_interleaving_trials"
    assert suite.artifacts == {"java": "java -version"}
    assert [d.name for d in suite.duets] == ["scrabble", "chi-square"]  # 'unused' does not run
    scrabble, chi = suite.duets
    assert scrabble.a.command == "java -jar renaissance.jar --json results.json scrabble"
    assert scrabble.b.command == "java17 -jar renaissance.jar --json results.json scrabble"
    assert scrabble.a.results == ("results.json",)
    assert not scrabble.aa and scrabble.duet_repetitions == 3 and scrabble.timeout_s == 600
    # chi-square: no B -> A/A; its own repetitions and timeout override duetbench's
    assert chi.aa and chi.b.command == chi.a.command and chi.b.pair == "B"
    assert chi.duet_repetitions == 5 and chi.sequential_repetitions == 2
    assert chi.timeout_s is None  # 0 means none


def test_harness_adds_its_output_to_results(tmp_path: Path):
    path = tmp_path / "duet.yml"
    path.write_text(
        "duetbench: {name: loops, duets: [d], harness: {iterations: 5}}\n"
        "d: {A: {run: ./loop 10}, B: {run: ./loop 11, harness: {budget_s: 2, output: b.jsonl}}}\n"
    )
    suite = load_duet_config(path)
    d = suite.duets[0]
    assert suite.suite == "loops"  # `name` is the original tool's spelling of suite
    assert d.a.harness.iterations == 5 and d.a.results == ("harness.csv",)
    assert d.b.harness.budget_s == 2 and d.b.harness.iterations is None
    assert d.b.results == ("b.jsonl",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE.replace("  seed: 42", "  sed: 42"),
         "duetbench.sed: unknown key; did you mean 'duetbench.seed'?"),
        (BASE.replace("  duet_repetitions: 5", "  duet_repetition: 5"),
         "chi-square.duet_repetition: unknown key; did you mean 'chi-square.duet_repetitions'?"),
        (BASE.replace("A: {run: chi-square}", "A: {runn: chi-square}"),
         "chi-square.A.runn: unknown key; did you mean 'chi-square.A.run'?"),
        (BASE.replace("  seed: 42", "  harness: {iterations: 3, budget: 2}"),
         "duetbench.harness.budget: unknown key; did you mean 'duetbench.harness.budget_s'?"),
        (BASE.replace("randomized_interleaving_trials", "random"),
         "duetbench.schedule: Input should be 'sequential' or 'randomized_interleaving_trials'"),
        (BASE.replace("[scrabble, chi-square]", "[scrabble, chi_square]"),
         "duetbench.duets: no section for duet 'chi_square'; did you mean 'chi-square'?"),
        (BASE.replace("[scrabble, chi-square]", "[scrabble, scrabble]"),
         "duetbench.duets: duet 'scrabble' is listed twice"),
        (BASE.replace("  timeout: 600", "  timeout: -1"),
         "duetbench.timeout: Input should be greater than or equal to 0"),
        (BASE.replace("  suite: renaissance\n", ""), "duetbench.name: required"),
        (BASE.replace("  results: [results.json]\n", ""),
         "scrabble.A.results: no result files and no harness: nothing to measure"),
    ],
)  # fmt: skip
def test_errors_name_the_key_path(text: str, expected: str):
    assert expected in _error(text)


def test_every_error_is_reported_at_once():
    text = BASE.replace("  seed: 42", "  sed: 42").replace("A: {run: scrabble}", "A: {rn: x}")
    msg = _error(text)
    assert "duetbench.sed" in msg and "scrabble.A.rn" in msg
    assert msg.startswith("invalid duet configuration in duet.yml:")


def test_sections_must_be_mappings_and_duetbench_present():
    assert "duetbench: missing section" in _error("scrabble: {A: {run: x}}")
    assert "x: expected a duet section" in _error(
        "duetbench: {suite: s, duets: [x], results: [r]}\nx: 3\n"
    )


def test_cpus_and_protocol_checks():
    one = "duetbench: {suite: s, duets: [d], results: [r]}\nd: {A: {run: x}, cpus: %s}\n"
    assert "cpus: Value error" not in _error(one % '["0"]')  # pydantic wording removed
    assert "two CPU lists, one per side" in _error(one % '["0"]')
    assert "the two CPU lists overlap" in _error(one % '["0-1", "1"]')
    assert "bad CPU list" in _error(one % '["zero", "1"]')
    assert "not available here" in _error(one % '["0", "4095"]')
    sync = (
        "duetbench: {suite: s, duets: [d], results: [r], syncduet_repetitions: 2}\n"
        "d: {A: {run: x}}\n"
    )
    assert "syncduet_repetitions needs a side that speaks the sync protocol" in _error(sync)
    img = (
        "duetbench: {suite: s, duets: [d]}\n"
        "d: {A: {run: x, image: img, harness: {iterations: 2}}}\n"
    )
    assert "the built-in harness runs local commands only" in _error(img)


def test_harness_with_syncduet_run_base_is_refused_for_sync_trials():
    # sync-duet trials used to run syncduet_run_base in place of the harness: the
    # side then failed for want of harness.csv, with a "no $$" warning
    both = (
        "duetbench: {suite: s, duets: [d], syncduet_repetitions: %d, duet_repetitions: 1,\n"
        "            harness: {iterations: 2}}\n"
        "d: {results: [out.csv], A: {run: 'true', syncduet_run_base: nice}}\n"
    )
    message = _error(both % 2)
    assert message == (
        "invalid duet configuration in duet.yml: "
        "d.A: harness and syncduet_run_base are both set, but a sync-duet trial runs "
        "syncduet_run_base in place of the harness (the harness synchronizes by itself: "
        "drop syncduet_run_base, or set harness: null)"
    )
    # without sync-duet trials the base is never run: the harness alone is used
    side = validate_duet_config(yaml.safe_load(both % 0)).duets[0].a
    assert side.harness is not None and side.results == ("out.csv", "harness.csv")
    # each alone still speaks the sync protocol
    for alone in ("syncduet_run_base: nice, harness: null", "syncduet_run_base: null"):
        fixed = (both % 2).replace("syncduet_run_base: nice", alone)
        assert validate_duet_config(yaml.safe_load(fixed)).duets[0].syncduet_repetitions == 2


def test_pinned_sides_trade_cpus_every_10_ms_unless_told():
    base = (
        "duetbench: {suite: s, duets: [d, e], results: [r]%s}\n"
        "d: {A: {run: x}%s}\ne: {A: {run: x}}\n"
    )

    def swaps(bench: str, duet: str = "") -> list[float | None]:
        return [
            d.cpu_swap_s for d in validate_duet_config(yaml.safe_load(base % (bench, duet))).duets
        ]

    assert swaps(", cpus: none") == [None, None]  # not pinned: nothing to trade
    assert swaps(', cpus: ["0", "1"]') == [0.01, 0.01]  # the default
    assert swaps(', cpus: ["0", "1"], cpu_swap_ms: 0') == [None, None]  # kept all trial
    assert swaps(', cpus: ["0", "1"]', ", cpu_swap_ms: 50") == [0.05, 0.01]  # per duet
    assert swaps("", ', cpus: ["0", "1"], cpu_swap_ms: 0') == [None, 0.01]  # e: auto
    assert "cpu_swap_ms" in _error(base % (', cpus: ["0", "1"], cpu_swap_ms: -1', ""))
    assert "nice" in _error(base % (", nice: -21", ""))
    assert "a nice value from -20 to 19, or auto (got x)" in _error(base % (", nice: x", ""))


def test_nice_auto_is_the_default_and_needs_root(monkeypatch):
    text = "duetbench: {suite: s, duets: [d, e], results: [r]}\nd: {A: {run: x}, nice: %s}\n"
    text += "e: {A: {run: x}}\n"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert [d.nice for d in validate_duet_config(yaml.safe_load(text % "auto")).duets] == [-10, -10]
    assert [d.nice for d in validate_duet_config(yaml.safe_load(text % "0")).duets] == [0, -10]
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # not root: the runner's own
    assert [d.nice for d in validate_duet_config(yaml.safe_load(text % "3")).duets] == [3, None]
    assert [d.nice for d in validate_duet_config(yaml.safe_load(text % "auto")).duets] == [None] * 2


def test_cpus_auto_is_the_default_two_halves_of_the_allowed_cpus(monkeypatch):
    text = "duetbench: {suite: s, duets: [d, e], results: [r]}\nd: {A: {run: x}, cpus: %s}\n"
    text += "e: {A: {run: x}}\n"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 6, 7})
    d, e = validate_duet_config(yaml.safe_load(text % "auto")).duets
    for duet in (d, e):  # e says nothing: auto
        assert duet.cpus == (frozenset({0, 1, 2}), frozenset({3, 4, 6}))  # 7 left out
        assert duet.cpus_auto and duet.cpu_swap_s == 0.01
    d, e = validate_duet_config(yaml.safe_load(text % "none")).duets
    assert d.cpus is None and not d.cpus_auto and d.cpu_swap_s is None and e.cpus_auto
    d, _ = validate_duet_config(yaml.safe_load(text % '["0", "1"]')).duets
    assert d.cpus == (frozenset({0}), frozenset({1})) and not d.cpus_auto
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    d, _ = validate_duet_config(yaml.safe_load(text % "auto")).duets
    assert d.cpus is None and not d.cpus_auto  # one CPU: nothing to split
    assert "cpus" in _error(text % "half")


def test_parse_cpus():
    assert parse_cpus("0-2,5") == {0, 1, 2, 5}
    assert parse_cpus("3") == {3}
    with pytest.raises(ValueError):
        parse_cpus("3-1")


def test_file_errors(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read duet config"):
        load_duet_config(tmp_path / "missing.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("duetbench: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_duet_config(bad)


def test_hostile_duet_files_are_refused_in_one_line(tmp_path: Path):
    bomb = tmp_path / "bomb.yml"
    bomb.write_text(alias_bomb("duetbench: {suite: s, duets: *a8}\n"))
    with pytest.raises(ConfigError) as info:
        load_duet_config(bomb)
    assert str(info.value) == (
        f"{bomb}: refused: line 5: more than 50,000 values once its aliases are expanded "
        "(an alias bomb?)"
    )
    latin1 = tmp_path / "latin1.yml"
    latin1.write_bytes(b"duetbench: {suite: caf\xe9}\n")
    with pytest.raises(ConfigError) as info:
        load_duet_config(latin1)
    assert str(info.value) == f"{latin1} is not UTF-8 text (byte 0xe9 at offset 22): expected YAML"
    big = tmp_path / "big.yml"
    big.write_text("#" * (2 << 20))
    with pytest.raises(ConfigError, match=r"is 2 MiB: a duet config file may be at most 1 MiB"):
        load_duet_config(big)


def test_the_example_config_validates():
    import kernmlops.duet

    example = Path(kernmlops.duet.__file__).parent / "example.duet.yml"
    suite = load_duet_config(example)
    assert [d.name for d in suite.duets] == ["gzip-levels", "gzip-aa"]
    assert suite.duets[1].aa and suite.duets[0].cpus == (frozenset({0}), frozenset({1}))


def test_ready_made_configs_load_and_the_cpu_loop_runs(tmp_path: Path):
    from importlib.resources import files

    from kernmlops.duet.runner import run_suite

    folder = files("kernmlops.duet") / "configs"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".duet.yml"))
    assert names == ["cpu-loop.duet.yml", "pyperformance.duet.yml"]
    suites = {n: load_duet_config(Path(str(folder / n))) for n in names}
    loop = suites["cpu-loop.duet.yml"]
    assert [(d.name, d.aa) for d in loop.duets] == [("loop-aa", True), ("loop-plus-2pct", False)]
    assert all(d.b.results for d in suites["pyperformance.duet.yml"].duets)
    # the loop itself, shortened: every side writes harness rows
    raw = {
        **loop.raw,
        "duetbench": {
            **loop.raw["duetbench"],
            "duet_repetitions": 1,
            "sequential_repetitions": 0,
            "syncduet_repetitions": 1,
            "harness": {"iterations": 2},
            "duets": ["loop-plus-2pct"],
        },
    }
    result = run_suite(validate_duet_config(raw, "cpu-loop"), tmp_path)
    assert not result.failed and len(result.trials) == 2
    assert all(len(s.results) == 1 for t in result.trials for s in t.sides.values())


NULLS = """
duetbench:
  suite: s
  harness: {budget_s: 1}
  image: "bench:1"
  run_base: ./loop
  timeout: 30
  env: {SUITE: "1"}
  cpus: none
  nice: 5
  duets: [local, plain]
local:
  # run here, not in the suite's image, and not under its harness
  harness: null
  image: null
  timeout: null
  env: null
  cpus: null
  nice: null
  A: {run: "true", results: [out.json], env: {OWN: "1"}}
  B: {run: "true", run_base: null, results: [out.json]}
plain:
  harness: null
  A: {run: "20", harness: null}
"""


def test_an_explicit_null_stops_inheritance_and_means_the_default(monkeypatch):
    monkeypatch.setattr("kernmlops.duet.config.auto_cpus", lambda: ["0", "1"])
    suite = _load(NULLS.replace("  duets: [local, plain]", "  duets: [local]"))
    [d] = suite.duets
    for side in (d.a, d.b):
        assert side.harness is None and side.image is None  # not the suite's
        assert side.results == ("out.json",)  # no harness.csv added
    assert d.a.command == "./loop true" and d.b.command == "true"  # run_base: null on B
    assert d.a.env == {"OWN": "1"} and d.b.env == {}  # env: null drops the suite's
    assert d.timeout_s is None  # no timeout, not the suite's 30 s
    assert d.cpus_auto and d.nice == (-10 if os.geteuid() == 0 else None)  # the defaults
    # without the nulls the duet inherits every one of them
    text = NULLS.replace("  duets: [local, plain]", "  duets: [local]").replace("harness", "h")
    for key in ("h", "image", "timeout", "env", "cpus", "nice"):
        text = text.replace(f"  {key}: null\n", "")
    inherited = _load(text.replace("  h: {budget_s: 1}\n", "").replace("run_base: null, ", ""))
    d = inherited.duets[0]
    assert d.a.image == d.b.image == "bench:1" and d.timeout_s == 30
    assert d.a.env == {"SUITE": "1", "OWN": "1"} and d.b.env == {"SUITE": "1"}
    assert d.cpus is None and d.nice == 5 and d.b.command == "./loop true"


def test_a_side_without_harness_or_results_is_one_error():
    # harness: null with nothing else to measure: said once, for the side that has it
    msg = _error(NULLS.replace('  image: "bench:1"\n', ""))
    assert msg.split(": ", 1)[1] == (
        "plain.A.results: no result files and no harness: nothing to measure "
        "(give results: [...] or harness: {iterations: N})"
    )


def test_one_missing_command_is_one_error():
    msg = _error("duetbench: {name: x, duets: [d]}\nd:\n  A: {}\n")
    # one line, as every other error (a list only for more than one)
    assert msg == (
        "invalid duet configuration in duet.yml: d.A.run: no command (set run, or run_base)"
    )
    msg = _error("duetbench: {name: x, duets: [d], harness: {iterations: 2}}\n"
                 "d: {A: {run: a}, B: {}}\n")  # fmt: skip
    assert msg.endswith("duet.yml: d.B.run: no command (set run, or run_base)")
    two = _error("duetbench: {name: x, duets: [d]}\nd:\n  A: {}\n  B: {}\n")
    assert two.splitlines() == [
        "invalid duet configuration in duet.yml:",
        "  - d.A.run: no command (set run, or run_base)",
        "  - d.B.run: no command (set run, or run_base)",
    ]


def test_an_empty_duet_configuration_says_it_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "duet.yml"
    path.write_text("# to be written\n")
    with pytest.raises(ConfigError, match=r"duet configuration in .*duet\.yml: it is empty"):
        load_duet_config(path)
