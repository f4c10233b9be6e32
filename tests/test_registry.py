"""Plug-in discovery: a module in the package is all a new hook or benchmark needs;
the generated index lets a run import only the plug-ins it names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernmlops.benchmarks import REGISTRY as BENCHMARKS
from kernmlops.benchmarks.base import Benchmark
from kernmlops.hooks import DEFAULT_HOOKS
from kernmlops.hooks import REGISTRY as HOOKS
from kernmlops.plugin_indexes import registries
from kernmlops.registry import Plugins, _modules_on_disk, discover, index_path, index_source

SRC = Path(__file__).resolve().parents[1] / "src" / "kernmlops"


def test_every_hook_module_registers_its_hook() -> None:
    modules = {p.stem for p in (SRC / "hooks").glob("*.py")} - {"__init__", "_index", "base", "bpf"}
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


# --- the index -------------------------------------------------------------------
@pytest.mark.parametrize("plugins", registries(), ids=lambda p: p.package)
def test_committed_index_is_current(plugins: Plugins) -> None:
    """The index says what importing every module finds (names, modules, classes, order)."""
    path = index_path(plugins)
    assert path.exists(), f"{path.name} of {plugins.package} is missing: run `make defaults`"
    stale = f"{plugins.package}._index is stale: run `make defaults`"
    assert path.read_text() == index_source(plugins), stale
    assert dict(plugins.items()) == plugins.discover()
    # a module without a plug-in would make every run discover the package (slowly)
    indexed = {module for module, _ in plugins.index().values()}
    assert indexed == _modules_on_disk(plugins.package, plugins.skip), (
        f"every module of {plugins.package} must define a plug-in (name helpers _<name>)"
    )


def _loaded_after(code: str) -> tuple[set[str], str]:
    """kernmlops.hooks.* and kernmlops.benchmarks.* modules loaded by ``code`` (run in a
    fresh interpreter), and what it printed."""
    script = (
        "import json, sys\n"
        f"{code}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('kernmlops.hooks.', "
        "'kernmlops.benchmarks.')))))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    *printed, loaded = out.stdout.splitlines()
    return set(json.loads(loaded)), "\n".join(printed)


INFRASTRUCTURE = {
    "kernmlops.hooks._index",
    "kernmlops.hooks.base",
    "kernmlops.benchmarks._index",
    "kernmlops.benchmarks.base",
}


def test_names_import_no_plugin_and_a_lookup_imports_one() -> None:
    loaded, printed = _loaded_after(
        "from kernmlops.hooks import REGISTRY as H\n"
        "from kernmlops.benchmarks import REGISTRY as B\n"
        "print(len(H), len(B), 'perf' in H, 'stress-ng' in B, 'nope' in H)"
    )
    assert printed == f"{len(HOOKS.discover())} {len(BENCHMARKS.discover())} True True False"
    assert loaded <= INFRASTRUCTURE
    loaded, printed = _loaded_after(
        "from kernmlops.hooks import REGISTRY\nprint(REGISTRY['perf'].__name__)"
    )
    assert printed == "PerfHook"
    # perf_counters is the module of the hook named perf; task_perf imports it, not the reverse
    assert loaded - INFRASTRUCTURE == {"kernmlops.hooks.perf_counters"}


def _package(tmp_path: Path, index: str | None) -> str:
    """A plug-in package kmo_plugins with modules one (class One, name 'one') and two."""
    pkg = tmp_path / "kmo_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for mod, cls in (("one", "One"), ("two", "Two")):
        (pkg / f"{mod}.py").write_text(
            "from kernmlops.benchmarks.base import Benchmark\n"
            f"class {cls}(Benchmark):\n    name = {mod!r}\n"
            "    def launch(self):\n        return None\n"
        )
    if index is not None:
        (pkg / "_index.py").write_text(index)
    sys.path.insert(0, str(tmp_path))
    return "kmo_plugins"


@pytest.fixture
def plugins_path(tmp_path: Path):
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for mod in [m for m in sys.modules if m.startswith("kmo_plugins")]:
        del sys.modules[mod]


def test_an_index_is_read_not_the_modules(plugins_path: Path) -> None:
    package = _package(plugins_path, 'INDEX = {"one": ("one", "One"), "two": ("two", "Two")}\n')
    plugins = Plugins(package, Benchmark)
    assert list(plugins) == ["one", "two"]
    assert "kmo_plugins.one" not in sys.modules
    assert plugins["two"].__name__ == "Two"
    assert "kmo_plugins.one" not in sys.modules
    with pytest.raises(KeyError):
        plugins["three"]
    assert index_source(plugins) == (
        '"""The plug-ins of kmo_plugins, by name: generated from the modules by\n'
        "`python -m kernmlops.plugin_indexes` (make defaults); do not edit. A lookup imports\n"
        'only the module its name points to (kernmlops.registry.Plugins)."""\n\n'
        "INDEX: dict[str, tuple[str, str]] = {\n"
        '    "one": ("one", "One"),\n'
        '    "two": ("two", "Two"),\n'
        "}\n"
    )


@pytest.mark.parametrize(
    "index",
    [
        None,  # no index yet
        'INDEX = {"one": ("one", "One")}\n',  # a module added since
        'INDEX = {"one": ("one", "One"), "two": ("two", "Two"), "x": ("gone", "X")}\n',
    ],
)
def test_a_stale_index_falls_back_to_discovery(plugins_path: Path, index: str | None) -> None:
    plugins = Plugins(_package(plugins_path, index), Benchmark)
    assert list(plugins) == ["one", "two"]
    assert plugins["two"].__name__ == "Two"


def test_a_module_changed_since_the_index_is_believed(plugins_path: Path) -> None:
    """The same modules, but a class renamed and a plug-in renamed since the index."""
    package = _package(plugins_path, 'INDEX = {"one": ("one", "Old"), "two": ("two", "Two")}\n')
    (plugins_path / package / "two.py").write_text(
        "from kernmlops.benchmarks.base import Benchmark\n"
        "class Two(Benchmark):\n    name = 'three'\n"
        "    def launch(self):\n        return None\n"
    )
    plugins = Plugins(package, Benchmark)
    assert plugins["one"].__name__ == "One"
    with pytest.raises(KeyError):
        plugins["two"]
    assert list(plugins) == ["one", "three"]
