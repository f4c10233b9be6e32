"""Metric set files: the built-in ones are valid; bad ones are rejected with
the file, the key and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kernmlops.exporter.config import (
    CounterSpec,
    HistogramSpec,
    MetricSetError,
    builtin_sets,
    load_metric_set,
    resolve_sets,
)
from tests.yamlbomb import alias_bomb

GOOD = {
    "name": "demo",
    "metrics": {
        "counters": [
            {
                "name": "demo_events_total",
                "help": "events",
                "map": "events",
                "labels": [{"name": "cpu", "size": 4, "decoders": [{"name": "uint"}]}],
            }
        ],
        "histograms": [
            {
                "name": "demo_latency_seconds",
                "help": "latency",
                "map": "latency",
                "bucket_type": "exp2",
                "bucket_max": 20,
                "bucket_multiplier": 1e-6,
                "labels": [
                    {"name": "comm", "size": 16, "decoders": [{"name": "string"}]},
                    {
                        "name": "op",
                        "size": 4,
                        "padding": 4,
                        "decoders": [
                            {"name": "uint"},
                            {"name": "static_map", "static_map": {0: "read", 1: "write"}},
                        ],
                    },
                ],
            }
        ],
    },
}


def write(tmp_path: Path, data: object, name: str = "demo.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def error_of(tmp_path: Path, data: object) -> str:
    path = write(tmp_path, data)
    with pytest.raises(MetricSetError) as info:
        load_metric_set(path)
    text = str(info.value)
    assert str(path) in text, text  # every error names the file
    return text


def with_change(path: tuple, value: object) -> dict:
    """GOOD with one key (a path of keys and indices) set to value (None: removed)."""
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    node = data
    for part in path[:-1]:
        node = node[part]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


def test_good_file_loads_with_its_layout(tmp_path: Path) -> None:
    ms = load_metric_set(write(tmp_path, GOOD))
    assert ms.name == "demo" and not ms.builtin
    counter, hist = ms.metrics
    assert isinstance(counter, CounterSpec) and isinstance(hist, HistogramSpec)
    assert counter.exposed_name == "demo_events_total"
    assert hist.key_bytes == 16 + 4 + 4  # comm, padding, op
    # YAML's int keys become the decimal text the chain compares
    assert hist.labels[1].decoders[1].static_map == {"0": "read", "1": "write"}
    assert ms.object_path(tmp_path).name.startswith("demo")


def test_name_defaults_to_the_stem_without_exp(tmp_path: Path) -> None:
    data = with_change(("name",), None)
    assert load_metric_set(write(tmp_path, data, "exp_my_io.yaml")).name == "my_io"


def test_every_builtin_set_is_valid_and_has_its_source() -> None:
    sets = builtin_sets()
    assert {"biolatency", "runqlat", "syscalls", "syscalls_comm", "pagefaults"} <= set(sets)
    assert {"migrations", "oncpu"} <= set(sets)
    for ms in sets.values():
        assert ms.builtin and ms.source is not None and ms.source.name.startswith("exp_")
    defaults = [ms.name for ms in resolve_sets([])]
    assert "syscalls_comm" not in defaults and "biolatency" in defaults


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            (("metrics", "histograms", 0, "bucket_type"), "exp3"),
            "metrics.histograms[0] (demo_latency_seconds).bucket_type: Input should be",
        ),
        (
            (("metrics", "histograms", 0, "bucket_max"), None),
            "metrics.histograms[0] (demo_latency_seconds): bucket_type 'exp2' needs bucket_max",
        ),
        (
            (("metrics", "histograms", 0, "bucket_max"), 64),
            "bucket_max of an exp2 histogram is at most 63",
        ),
        (
            (("metrics", "histograms", 0, "bucket_min"), 21),
            "bucket_min 21 is past the last bucket (20)",
        ),
        (
            (("metrics", "counters", 0, "labels", 0, "size"), 3),
            "metrics.counters[0] (demo_events_total).labels[0] (cpu): decoder 'uint' reads "
            "an integer: size must be 1, 2, 4 or 8",
        ),
        (
            (("metrics", "counters", 0, "labels", 0, "decoders", 0, "name"), "unit"),
            "metrics.counters[0] (demo_events_total).labels[0] (cpu).decoders[0] (unit).name: "
            "Input should be 'uint', 'string'",
        ),
        (
            (("metrics", "counters", 0, "labels", 0, "decoders", 0, "static_map"), {1: "x"}),
            "decoder 'uint' takes no static_map (options: signed)",
        ),
        (
            (("metrics", "counters", 0, "labels", 0, "name"), "le"),
            "'le' is reserved for histogram buckets",
        ),
        (
            (("metrics", "counters", 0, "name"), "demo-events"),
            "'demo-events' is not a Prometheus metric name",
        ),
        (
            (("metrics", "histograms", 0, "name"), "demo_latency_count"),
            "a histogram name must not end with _bucket/_sum/_count/_total",
        ),
        (
            (("metrics", "counters", 0, "help"), None),
            "metrics.counters[0] (demo_events_total).help: Field required",
        ),
        (
            (("metrics", "histograms", 0, "bucket_type"), "fixed"),
            "bucket_type 'fixed' needs bucket_keys",
        ),
    ],
)
def test_bad_values_name_the_key_and_reason(tmp_path: Path, change: tuple, expected: str) -> None:
    assert expected in error_of(tmp_path, with_change(*change))


def test_unknown_key_suggests_the_nearest(tmp_path: Path) -> None:
    data = with_change(("metrics", "histograms", 0, "bucket_multipler"), 0.001)
    text = error_of(tmp_path, data)
    assert "metrics.histograms[0] (demo_latency_seconds).bucket_multipler: unknown key" in text
    assert "did you mean 'bucket_multiplier'?" in text


def test_fixed_buckets_must_increase(tmp_path: Path) -> None:
    hist = with_change(("metrics", "histograms", 0, "bucket_type"), "fixed")
    del hist["metrics"]["histograms"][0]["bucket_max"]
    hist["metrics"]["histograms"][0]["bucket_keys"] = [1, 5, 5, 10]
    assert "bucket_keys must increase strictly" in error_of(tmp_path, hist)


def test_static_map_and_regexp_need_their_options(tmp_path: Path) -> None:
    label = ("metrics", "counters", 0, "labels", 0, "decoders")
    text = error_of(tmp_path, with_change(label, [{"name": "uint"}, {"name": "static_map"}]))
    assert "decoder 'static_map' needs a non-empty static_map" in text
    text = error_of(tmp_path, with_change(label, [{"name": "uint"}, {"name": "regexp"}]))
    assert "decoder 'regexp' needs regexps" in text
    bad = [{"name": "uint"}, {"name": "regexp", "regexps": ["(unclosed"]}]
    assert "bad regular expression '(unclosed'" in error_of(tmp_path, with_change(label, bad))
    first = [{"name": "regexp", "regexps": ["x"]}]
    assert "put string or uint before it" in error_of(tmp_path, with_change(label, first))


def test_duplicates_and_empty_sets(tmp_path: Path) -> None:
    data = with_change(("metrics", "histograms", 0, "name"), "demo_events_total")
    data["metrics"]["histograms"][0]["name"] = "demo_events"
    data["metrics"]["counters"].append(dict(data["metrics"]["counters"][0]))
    assert "metric names appear twice: demo_events_total" in error_of(tmp_path, data)
    assert "no metrics: give counters and/or histograms" in error_of(
        tmp_path, {"name": "x", "metrics": {}}
    )
    labels = ("metrics", "counters", 0, "labels")
    two = [{"name": "a", "size": 4, "decoders": [{"name": "uint"}]}] * 2
    assert "label 'a' appears twice" in error_of(tmp_path, with_change(labels, two))


def test_not_yaml_and_not_a_mapping(tmp_path: Path) -> None:
    assert "is not valid YAML" in error_of(tmp_path, "metrics: [unclosed")
    assert "the top level must be a mapping" in error_of(tmp_path, "- a\n- b\n")
    assert "it is empty (no program, no metric)" in error_of(tmp_path, "# nothing\n")
    with pytest.raises(MetricSetError, match="cannot read metric set"):
        load_metric_set(tmp_path / "missing.yaml")


def test_hostile_metric_set_files_are_refused_in_one_line(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb("metrics:\n  counters: *a8\n"))
    with pytest.raises(MetricSetError) as info:
        load_metric_set(bomb)
    assert str(info.value) == (
        f"{bomb}: refused: line 5: more than 50,000 values once its aliases are expanded "
        "(an alias bomb?)"
    )
    binary = tmp_path / "exp_x.bpf.o"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" * 10)
    with pytest.raises(MetricSetError) as info:
        resolve_sets([str(binary)])
    assert str(info.value) == f"{binary} is not a text file (a NUL byte at offset 7): expected YAML"
    big = tmp_path / "big.yaml"
    big.write_text("#" * (2 << 20))
    with pytest.raises(MetricSetError, match=r"is 2 MiB: a metric set file may be at most 1 MiB"):
        load_metric_set(big)


def test_resolve_sets_names_files_and_mistakes(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    got = resolve_sets([str(path), "runqlat"])
    assert [ms.name for ms in got] == ["demo", "runqlat"]
    with pytest.raises(MetricSetError, match="did you mean 'runqlat'"):
        resolve_sets(["runqlta"])
    with pytest.raises(MetricSetError, match="metric set given twice: runqlat"):
        resolve_sets(["runqlat", "runqlat"])
    clash = with_change(("metrics", "counters", 0, "name"), "kernmlops_syscalls_total")
    other = write(tmp_path, clash, "clash.yaml")
    with pytest.raises(MetricSetError, match="kernmlops_syscalls_total is defined by both"):
        resolve_sets(["syscalls", str(other)])
