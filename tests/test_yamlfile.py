"""safe_yaml: hostile YAML files are refused quickly, with one line naming the file (the
tests that time the refusal are test_yamlfile_quiet.py's: the main lane's)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kernmlops.errors import ConfigError
from kernmlops.exporter.config import MetricSetError
from kernmlops.yamlfile import LOADER, MAX_NODES, LimitedLoader, safe_yaml


def bomb(levels: int, width: int = 9) -> str:
    """The "billion laughs": each level a list of ``width`` aliases of the one below."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def _write(tmp_path: Path, data: str | bytes, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


def _refused(path: Path, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        safe_yaml(path, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_plain_yaml_with_anchors_and_merge_keys_loads(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "base: &b {ring_kib: 64, batch_ms: 5}\nhooks:\n  a: *b\n  b: {<<: *b, x: 1}\n"
    )
    assert safe_yaml(path) == {
        "base": {"ring_kib": 64, "batch_ms": 5},
        "hooks": {
            "a": {"ring_kib": 64, "batch_ms": 5},
            "b": {"ring_kib": 64, "batch_ms": 5, "x": 1},
        },
    }
    assert safe_yaml(_write(tmp_path, "", "empty.yaml")) is None
    # a byte-order mark is fine
    assert safe_yaml(_write(tmp_path, b"\xef\xbb\xbfa: 1\n", "bom.yaml")) == {"a": 1}


def test_the_defaults_load_as_with_safe_load() -> None:
    path = Path(__file__).resolve().parent.parent / "defaults.yaml"
    assert safe_yaml(path) == yaml.safe_load(path.read_text())


def test_a_small_bomb_below_the_limit_is_still_data(tmp_path: Path) -> None:
    data = safe_yaml(_write(tmp_path, bomb(3)))  # 9 + 81 + 729 values
    assert len(data["l2"]) == 9 and data["l2"][8][8] == ["lol"] * 9


@pytest.mark.parametrize("loader", sorted({LOADER, LimitedLoader}, key=str))
def test_both_loaders_refuse_bombs_cycles_and_depth(loader: type) -> None:
    with pytest.raises(yaml.YAMLError, match="alias bomb"):
        yaml.load(bomb(9), Loader=loader)
    with pytest.raises(yaml.YAMLError, match=r"line 1: alias \*a is inside the node it names"):
        yaml.load("a: &a {b: [*a]}\n", Loader=loader)
    with pytest.raises(yaml.YAMLError, match="nested deeper than 100 levels"):
        yaml.load("x: " + "[" * 100_000, Loader=loader)
    with pytest.raises(yaml.YAMLError, match="nested deeper than 100 levels"):
        yaml.load("- " * 5000, Loader=loader)
    assert yaml.load("a: &a [1, 2]\nb: *a\n", Loader=loader) == {"a": [1, 2], "b": [1, 2]}


def test_too_many_values_without_aliases(tmp_path: Path) -> None:
    path = _write(tmp_path, "".join(f"- {i}\n" for i in range(MAX_NODES + 10)))
    assert "more than 50,000 values" in _refused(path)
    assert "alias" not in _refused(path)


def test_size_limit(tmp_path: Path) -> None:
    path = _write(tmp_path, "#" * ((2 << 20) - 1) + "\n")  # a comment, but 2 MiB of it
    assert path.stat().st_size == 2 << 20
    assert _refused(path) == f"{path} is 2 MiB: a config file may be at most 1 MiB"
    small = _write(tmp_path, "a: 1\n" * 300, "small.yaml")
    assert (
        _refused(small, what="metric set", max_bytes=1000)
        == f"{small} is 1,500 bytes: a metric set file may be at most 1,000 bytes"
    )
    # a device (no size) is read no further than the limit
    assert _refused(Path("/dev/zero")) == (
        "/dev/zero is more than 1 MiB: a config file may be at most 1 MiB"
    )
    # a plain file whose size says less than it holds (procfs says 0, as one that
    # grows while read): over the limit, its size unknown (it said "is 0 bytes")
    status = Path("/proc/self/status")
    assert status.stat().st_size == 0 and len(status.read_bytes()) > 100
    assert _refused(status, max_bytes=100, plain=True) == (
        "/proc/self/status is more than 100 bytes: a config file may be at most 100 bytes"
    )


def test_binary_and_not_utf8(tmp_path: Path) -> None:
    elf = _write(tmp_path, b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), "prog")
    assert _refused(elf) == (f"{elf} is not a text file (a NUL byte at offset 7): expected YAML")
    latin1 = _write(tmp_path, "name: caf\u00e9\n".encode("latin-1"), "latin1.yaml")
    assert _refused(latin1) == (
        f"{latin1} is not UTF-8 text (byte 0xe9 at offset 9): expected YAML"
    )
    bom = _write(tmp_path, b"\xef\xbb\xbfname: caf\xe9\n", "bom.yaml")
    assert "(byte 0xe9 at offset 12)" in _refused(bom)


def test_unreadable_and_invalid(tmp_path: Path) -> None:
    assert _refused(tmp_path / "nope.yaml") == (
        f"cannot read config {tmp_path / 'nope.yaml'}: No such file or directory"
    )
    assert _refused(tmp_path) == f"cannot read config {tmp_path}: Is a directory"
    bad = _write(tmp_path, "collector:\n\tpoll: 1\n")
    assert _refused(bad) == (
        f"{bad} is not valid YAML: line 2, column 1: found character that cannot start any token"
        " (a tab: YAML indents with spaces)"
    )
    huge_int = _write(tmp_path, "tgid: " + "1" * 5000 + "\n", "int.yaml")
    assert _refused(huge_int).startswith(
        f"{huge_int} is not valid YAML: line 1, column 7: bad value: Exceeds the limit"
    )
    date = _write(tmp_path, "when: 2024-13-01\n", "date.yaml")
    assert _refused(date) == (
        f"{date} is not valid YAML: line 1, column 7: bad value: month must be in 1..12"
    )


def test_the_callers_error_class_is_raised(tmp_path: Path) -> None:
    path = _write(tmp_path, bomb(9))
    with pytest.raises(MetricSetError, match="alias bomb"):
        safe_yaml(path, what="metric set", error=MetricSetError)


@pytest.mark.parametrize("loader", sorted({LOADER, LimitedLoader}, key=str))
def test_a_key_given_twice_is_refused_and_a_merged_key_may_be_overridden(loader: type) -> None:
    twice = "collector:\n  hooks: [process_trace]\ncollector:\n  hooks: [quanta_runtime]\n"
    with pytest.raises(yaml.constructor.ConstructorError, match="given twice") as info:
        yaml.load(twice, Loader=loader)
    assert info.value.problem_mark.line == 2 and "first on line 1" in str(info.value)
    nested = "a:\n  b: 1\n  c: 2\n  b: 3\n"
    with pytest.raises(yaml.constructor.ConstructorError, match="'b' is given twice"):
        yaml.load(nested, Loader=loader)
    merged = "base: &x {b: 1, c: 2}\nd:\n  <<: *x\n  b: 3\n"
    assert yaml.load(merged, Loader=loader)["d"] == {"b": 3, "c": 2}


def test_a_config_that_gives_a_section_twice_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "o.yaml"
    path.write_text("collector:\n  hooks: [process_trace]\ncollector:\n  hooks: [quanta_runtime]\n")
    with pytest.raises(ConfigError, match=r"line 3, column 1: the key 'collector' is given twice"):
        safe_yaml(path)
