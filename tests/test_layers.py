"""Layers that never point up: each group of modules, imported alone in a fresh
interpreter, loads nothing from the layers above it.

    host, errors, lazy           /proc and /sys readers; the base of everything
    ebpf                          libbpf, BTF, rings, perf_event_open
    hooks, benchmarks, collect    the collector
    data, graphs, duet, lb        the analysis: never the kernel side
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import kernmlops


def _loaded_after(modules: list[str]) -> set[str]:
    """kernmlops modules loaded by importing ``modules`` in a fresh interpreter."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kernmlops'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout))


def _package(name: str) -> list[str]:
    pkg = __import__(f"kernmlops.{name}", fromlist=["_"])
    return [f"kernmlops.{name}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]


def _under(loaded: set[str], *packages: str) -> set[str]:
    return {m for m in loaded if any(m == p or m.startswith(p + ".") for p in packages)}


ANALYSIS = [
    "kernmlops.data",
    "kernmlops.data_import",
    "kernmlops.counters",
    *_package("graphs"),
    "kernmlops.duet.analysis",
    "kernmlops.duet.report",
    "kernmlops.duet.process",
    "kernmlops.lb.model",
    "kernmlops.lb.fixed",
    "kernmlops.lb.features",
    "kernmlops.lb.dataset",
    *_package("fleet"),
]


@pytest.mark.parametrize("module", ANALYSIS)
def test_the_analysis_side_never_loads_the_kernel_side(module: str) -> None:
    loaded = _loaded_after([module])
    assert not _under(loaded, "kernmlops.ebpf", "kernmlops.hooks", "kernmlops.collect.session")


def test_the_kernel_side_knows_no_hooks_collections_or_benchmarks() -> None:
    loaded = _loaded_after(_package("ebpf"))
    assert not _under(loaded, "kernmlops.hooks", "kernmlops.collect", "kernmlops.benchmarks")


def test_host_readers_are_the_bottom_layer() -> None:
    loaded = _loaded_after(_package("host"))
    assert loaded <= {"kernmlops", "kernmlops.errors", "kernmlops.lazy", *_package("host"),
                      "kernmlops.host"}  # fmt: skip


def test_hooks_and_benchmarks_do_not_load_the_session() -> None:
    loaded = _loaded_after(["kernmlops.hooks", "kernmlops.benchmarks"])
    assert not _under(loaded, "kernmlops.collect", "kernmlops.graphs", "kernmlops.data")


def test_every_package_is_placed_in_a_layer() -> None:
    # a new top-level package must be given its place above
    packages = {m.name for m in pkgutil.iter_modules(kernmlops.__path__) if m.ispkg}
    placed = {"host", "ebpf", "hooks", "benchmarks", "collect", "graphs", "duet", "lb",
              "exporter", "vm", "workloads", "fleet"}  # fmt: skip
    assert packages <= placed, packages - placed
