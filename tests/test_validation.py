"""Unknown keys in every configuration file: a key that is not a name (a line of
some other file, e.g. /etc/shadow given as a config) is never echoed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kernmlops.config import load_config
from kernmlops.duet.config import load_duet_config
from kernmlops.errors import ConfigError
from kernmlops.exporter.config import load_metric_set
from kernmlops.exporter.webconfig import load_web_config
from kernmlops.validation import key_path, looks_like_key, not_a_config, shown_key, unknown_key

SECRET = "Xq7secretHASHpart"
#: a shadow-like file: user:hash:fields; each line parses as a key (its last ':')
SHADOW = (
    f"root:$y$j9T$saltsaltsalt${SECRET}:19700:0:99999:7:::\n"
    "daemon:*:19700:0:99999:7:::\n"
    f"alice:$6$rounds=5000${SECRET}2:19700:0:99999:7:::\n"
)


def test_keys_and_lines_are_told_apart():
    for key in ("hooks", "cpu_swap_ms", "chi-square", "A", "0", "renaissance.jar", "x" * 40):
        assert looks_like_key(key) and shown_key(key) == key
    for key in ("root:$y$j9T$abc:1::", "a b", "a/b", "$HOME", "x" * 41, "", "-x"):
        assert not looks_like_key(key)
    assert shown_key(f"root:$y$j9T${SECRET}:19700::") == "'root…' (not a key)"
    assert shown_key(f"${SECRET}") == "'…' (not a key)"  # nothing name-like first
    assert shown_key("averyveryverylongusername:x") == "'averyveryver…' (not a key)"
    assert key_path(["collector", "a b c", 0]) == "collector.'a…' (not a key).0"
    assert unknown_key("hoks", ["hooks", "collector"]) == (
        "unknown key; did you mean 'hooks'? (valid here: hooks, collector)"
    )
    assert unknown_key(f"root:{SECRET}", ["hooks"]) == "not a key of this file (valid here: hooks)"


def test_a_file_of_lines_is_not_a_config():
    data = yaml.safe_load(SHADOW)
    assert isinstance(data, dict) and len(data) == 3  # what the loaders used to list
    assert not_a_config(data)
    assert not not_a_config({"hooks": {}, "root:x:1::": None})  # a config with a bad line
    assert not not_a_config({}) and not not_a_config(["a"])


@pytest.fixture
def shadow(tmp_path: Path) -> Path:
    path = tmp_path / "shadow"
    path.write_text(SHADOW)
    return path


@pytest.mark.parametrize(
    ("load", "said"),
    [
        (load_config, "is not a kernmlops configuration: no key of its top level"),
        (load_metric_set, ": not a metric set (no key of its top level looks like one"),
        (load_duet_config, ": not a duet configuration (no key of its top level"),
        (load_web_config, ": not a web configuration (no key of its top level"),
    ],
)
def test_a_shadow_file_is_named_once_never_echoed(load, said: str, shadow: Path):
    with pytest.raises(ConfigError) as info:
        load(shadow)
    message = str(info.value)
    assert "\n" not in message and said in message and str(shadow) in message
    rest = message.replace(str(shadow), "")
    assert SECRET not in rest and "root" not in rest and "19700" not in rest


def test_lines_among_real_keys_are_cut(tmp_path: Path):
    path = tmp_path / "mixed.yaml"
    path.write_text("hooks: {}\n" + SHADOW + f"collector:\n  my {SECRET}: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert SECRET not in message and "19700" not in message
    lines = message.splitlines()[1:]
    assert len(lines) == 4
    assert "  - collector.'my…' (not a key): not a key of this file (valid here: " in lines[0]
    shown = sorted(line.split(":")[0] for line in lines[1:])
    assert shown == ["  - 'alice…' (not a key)", "  - 'daemon…' (not a key)",
                     "  - 'root…' (not a key)"]  # fmt: skip

    metric_set = tmp_path / "m.yaml"
    metric_set.write_text("metrics: {counters: [{name: x, map: y}]}\n" + SHADOW)
    with pytest.raises(ConfigError) as info:
        load_metric_set(metric_set)
    message = str(info.value)
    assert SECRET not in message and "  - 'root…' (not a key): not a key of this file" in message


def test_kernmlops_form_and_duet_sections_cut_their_keys(tmp_path: Path):
    theirs = tmp_path / "theirs.yaml"
    theirs.write_text(f"benchmark_config:\n  generic: {{}}\n  ab:$x${SECRET}: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(theirs)
    message = str(info.value)
    assert SECRET not in message and "benchmark_config.'ab…' (not a key)" in message

    duet = tmp_path / "duet.yml"
    duet.write_text(
        "duetbench: {suite: s, duets: [d], results: [r]}\n"
        f"d: {{A: {{run: x, 'pw:{SECRET}': 1}}}}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_duet_config(duet)
    message = str(info.value)
    assert SECRET not in message and "d.A.'pw…' (not a key): not a key of this file" in message
