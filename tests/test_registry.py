"""Plug-in discovery: a module in the package is all a new hook or benchmark needs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kernmlops.benchmarks import REGISTRY as BENCHMARKS
from kernmlops.benchmarks.base import Benchmark
from kernmlops.hooks import DEFAULT_HOOKS
from kernmlops.hooks import REGISTRY as HOOKS
from kernmlops.registry import discover

SRC = Path(__file__).resolve().parents[1] / "src" / "kernmlops"


def test_every_hook_module_registers_its_hook() -> None:
    modules = {p.stem for p in (SRC / "hooks").glob("*.py")} - {"__init__", "base", "bpf"}
    assert {cls.__module__.rsplit(".", 1)[1] for cls in HOOKS.values()} == modules
    assert set(DEFAULT_HOOKS) <= set(HOOKS)


def test_every_bpf_hook_has_its_object_source() -> None:
    from kernmlops.hooks.bpf import BpfHook

    for name, cls in HOOKS.items():
        if issubclass(cls, BpfHook):
            assert (SRC / "bpf" / f"{cls.object_name}.bpf.c").exists(), name


def test_benchmarks_are_discovered() -> None:
    assert {"faux", "command", "stress-ng"} <= set(BENCHMARKS)


def test_discover_finds_a_new_module_and_rejects_duplicate_names(tmp_path: Path) -> None:
    pkg = tmp_path / "kmo_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text(
        "from kernmlops.benchmarks.base import Benchmark\n"
        "class One(Benchmark):\n    name = 'one'\n    def launch(self):\n        return None\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        assert list(discover("kmo_plugins", Benchmark)) == ["one"]
        (pkg / "two.py").write_text(
            "from kmo_plugins.one import One\nclass Two(One):\n    name = 'one'\n"
        )
        with pytest.raises(TypeError, match="two classes named 'one'"):
            discover("kmo_plugins", Benchmark)
    finally:
        sys.path.remove(str(tmp_path))
        for mod in [m for m in sys.modules if m.startswith("kmo_plugins")]:
            del sys.modules[mod]
