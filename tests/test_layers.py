"""The import graph of src/kernmlops: no circle between files, no import that
points up a layer.

The graph is read from the source with ast. Every import counts, at module level
and inside a function alike: an import in a function is a dependency all the
same, it only runs later (and a circle through one is still a circle: the
modules cannot be understood, tested or moved apart). Imports under
``if TYPE_CHECKING:`` never run and only name types: they count for neither
check. ``from a import b`` depends on the module ``a.b`` where there is one,
else on ``a``; ``import a.b`` on ``a.b`` (not on the packages above it).

The layers, bottom first, are ``LAYERS``: a module may import its own layer
and those below, never one above. Every package's ``cli`` and ``__main__``
modules belong to the top layer, the command line.

Imports by name at run time (importlib: the plug-in registries, graphs'
lazy names) are not in the graph; the tests at the bottom import parts of the
package in a process that has loaded none of it and check what actually got loaded.

``python tests/test_layers.py [SRC]`` prints the figures: circles, upward
imports and the largest files.
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import kernmlops

#: Bottom first: (layer, the modules and packages in it). A new top-level module
#: or package must be placed here (test_every_module_has_a_layer).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("foundation", frozenset({
        "kernmlops", "kernmlops.errors", "kernmlops.lazy", "kernmlops.fileio",
        "kernmlops.validation", "kernmlops.yamlfile", "kernmlops.jsonfile",
        "kernmlops.syscall_names",
        "kernmlops.counters", "kernmlops.tables", "kernmlops.host", "kernmlops.registry",
        "kernmlops.workloads", "kernmlops.confined", "kernmlops.stats",
    })),
    ("libbpf", frozenset({"kernmlops.ebpf"})),
    # ring records on disk: the hooks' RingSpool sits on it, the collection reads it back
    ("spool", frozenset({"kernmlops.spool"})),
    ("plug-ins", frozenset({
        "kernmlops.hooks", "kernmlops.benchmarks", "kernmlops.exporter", "kernmlops.clitools",
    })),
    ("configuration", frozenset({
        "kernmlops.config", "kernmlops.config_kernmlops", "kernmlops.plugin_indexes",
    })),
    ("collection", frozenset({"kernmlops.collect"})),
    ("analysis", frozenset({
        "kernmlops.data", "kernmlops.data_import", "kernmlops.graphs", "kernmlops.duet",
    })),
    ("learning", frozenset({"kernmlops.lb"})),
    # a fleet's dataset: its Spark job builds the MLLB data set with lb's own code
    ("fleet", frozenset({"kernmlops.fleet"})),
    ("command line", frozenset({
        "kernmlops.cli", "kernmlops.__main__", "kernmlops.doctor", "kernmlops.perf_list",
        "kernmlops.vm",
    })),
)  # fmt: skip
COMMAND_LINE = len(LAYERS) - 1

#: Circles known and being removed, each as the set of its files: none. A circle is
#: excused only while it lies within an entry, and an entry no circle needs any more
#: fails (test_known_circles_still_exist).
KNOWN_CIRCLES: set[frozenset[str]] = set()

SRC = Path(kernmlops.__file__).resolve().parent.parent


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    in_function: bool

    def __str__(self) -> str:
        where = " (in a function)" if self.in_function else ""
        return f"{self.source}:{self.line} imports {self.target}{where}"


def module_files(src: Path) -> dict[str, Path]:
    """Every module of the kernmlops package under ``src``: dotted name -> file."""
    out = {}
    for path in sorted((src / "kernmlops").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports_of(
    name: str, path: Path, modules: dict[str, Path], type_checking: bool = False
) -> list[Import]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(dotted: str) -> str | None:
        # the deepest module of the package that the dotted name names
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
                for other in child.orelse:
                    visit_node(other, in_function)
                continue  # annotations only: never runs
            visit_node(child, in_function)

    def visit_node(node: ast.AST, in_function: bool) -> None:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        for target in targets:
            resolved = resolve(target) if target.split(".")[0] == "kernmlops" else None
            imported = Import(name, resolved or "", node.lineno, in_function)
            if resolved is not None and resolved != name and imported not in found:
                found.append(imported)
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        visit(node, inside)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


@cache
def import_graph(
    src: Path = SRC, type_checking: bool = False
) -> tuple[dict[str, Path], tuple[Import, ...]]:
    """The modules under ``src`` and every import between them (with those under
    ``if TYPE_CHECKING:`` only when asked: the figures show them apart)."""
    modules = module_files(src)
    imports = [
        i for name, path in modules.items() for i in _imports_of(name, path, modules, type_checking)
    ]
    return modules, tuple(imports)


def circles(modules: dict[str, Path], imports: tuple[Import, ...]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan), sorted."""
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for i in imports:
        edges[i.source].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(modules)))
    try:
        for v in sorted(edges):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(out)


def a_cycle(component: list[str], imports: tuple[Import, ...]) -> list[Import]:
    """One shortest way round ``component``, from its first file back to it: the
    imports to read to see the circle."""
    members = set(component)
    by_source: dict[str, list[Import]] = {}
    for i in imports:
        if i.source in members and i.target in members:
            by_source.setdefault(i.source, []).append(i)
    start = component[0]
    paths: dict[str, list[Import]] = {start: []}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for i in by_source.get(v, []):
                if i.target == start:
                    return [*paths[v], i]
                if i.target not in paths:
                    paths[i.target] = [*paths[v], i]
                    following.append(i.target)
        frontier = following
    return []


def layer_of(module: str) -> int | None:
    """The index in LAYERS of ``module`` (the longest placed prefix wins); None when
    it is not placed."""
    if module.rpartition(".")[2] in ("cli", "__main__"):
        return COMMAND_LINE
    placed = [
        (len(member), rank)
        for rank, (_, members) in enumerate(LAYERS)
        for member in members
        if module == member or module.startswith(member + ".")
    ]
    return max(placed)[1] if placed else None


def upward(imports: tuple[Import, ...]) -> list[Import]:
    """The imports whose target sits in a higher layer than their source."""
    out = []
    for i in imports:
        source, target = layer_of(i.source), layer_of(i.target)
        if source is not None and target is not None and target > source:
            out.append(i)
    return out


def _layer_name(module: str) -> str:
    rank = layer_of(module)
    return "?" if rank is None else LAYERS[rank][0]


def test_the_graph_is_read() -> None:
    modules, imports = import_graph()
    assert "kernmlops.cli" in modules and "kernmlops.hooks" in modules
    seen = {(i.source, i.target) for i in imports}
    assert ("kernmlops.cli", "kernmlops.clitools") in seen  # module level
    assert ("kernmlops.clitools", "kernmlops.ebpf.probe") in seen  # in a function


def test_the_checks_find_a_circle_and_an_upward_import(tmp_path: Path) -> None:
    # a package of four files: hooks.a <-> hooks.b (one side in a function), the
    # foundation importing a plug-in, and a TYPE_CHECKING import that is not counted
    files = {
        "__init__.py": "",
        "errors.py": "def f():\n    from kernmlops.hooks.a import A\n",
        "hooks/__init__.py": "",
        "hooks/a.py": "from kernmlops.hooks import b\nA = 1\n",
        "hooks/b.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import kernmlops.cli\n"
            "def g():\n    from . import a\n"
        ),
        "cli.py": "from kernmlops.hooks.a import A\n",
    }
    for name, text in files.items():
        (tmp_path / "kernmlops" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "kernmlops" / name).write_text(text)
    modules, imports = import_graph(tmp_path)
    assert circles(modules, imports) == [["kernmlops.hooks.a", "kernmlops.hooks.b"]]
    way = [str(i) for i in a_cycle(["kernmlops.hooks.a", "kernmlops.hooks.b"], imports)]
    assert way == [
        "kernmlops.hooks.a:1 imports kernmlops.hooks.b",
        "kernmlops.hooks.b:5 imports kernmlops.hooks.a (in a function)",
    ]
    assert [str(i) for i in upward(imports)] == [
        "kernmlops.errors:2 imports kernmlops.hooks.a (in a function)"
    ]


def test_every_module_has_a_layer() -> None:
    modules, _ = import_graph()
    unplaced = sorted(m for m in modules if layer_of(m) is None)
    assert not unplaced, f"place these in LAYERS (tests/test_layers.py): {unplaced}"


def test_no_import_circle_between_files() -> None:
    modules, imports = import_graph()
    new = []
    for component in circles(modules, imports):
        if any(set(component) <= known for known in KNOWN_CIRCLES):
            continue
        way = "\n      ".join(str(i) for i in a_cycle(component, imports))
        new.append(f"{' <-> '.join(component)}\n   for one:\n      {way}")
    assert not new, "import circles between files:\n" + "\n".join(new)


def test_known_circles_still_exist() -> None:
    # an excused circle that is gone must leave KNOWN_CIRCLES, so none comes back
    modules, imports = import_graph()
    found = circles(modules, imports)
    stale = [k for k in KNOWN_CIRCLES if not any(set(c) <= k for c in found)]
    assert not stale, f"no longer circles: remove from KNOWN_CIRCLES: {stale}"


def test_no_import_points_up_a_layer() -> None:
    _, imports = import_graph()
    up = [f"{i} ({_layer_name(i.source)} -> {_layer_name(i.target)})" for i in upward(imports)]
    assert not up, "imports that point up a layer (LAYERS):\n" + "\n".join(up)


def figures(src: Path) -> str:
    """Circles, upward imports and the largest files of the package under ``src``."""
    modules, imports = import_graph(src)
    found = circles(modules, imports)
    up = upward(imports)
    annotations = [i for i in upward(import_graph(src, True)[1]) if i not in up]
    lines = {m: len(p.read_text().splitlines()) for m, p in modules.items()}
    largest = sorted(lines.items(), key=lambda kv: -kv[1])
    text = [
        f"{len(modules)} files, {sum(lines.values())} lines, {len(imports)} imports "
        f"({sum(i.in_function for i in imports)} in functions)",
        f"circles: {len(found)}",
        *(f"  {' <-> '.join(c)}" for c in found),
        f"upward imports: {len(up)}",
        *(f"  {i} ({_layer_name(i.source)} -> {_layer_name(i.target)})" for i in up),
        f"upward in annotations only (TYPE_CHECKING, not counted): {len(annotations)}",
        *(f"  {i}" for i in annotations),
        f"files over 400 lines: {sum(n > 400 for n in lines.values())}; largest:",
        *(f"  {n:5d} {m}" for m, n in largest[:10]),
    ]
    return "\n".join(text)


# -- what a fresh interpreter loads ---------------------------------------------------
#
# Each check imports its modules in a process that has loaded no kernmlops module.
# Starting an interpreter per check paid, every time, for the third-party
# libraries the modules import (numpy, scipy, pydantic: most of its time). One
# server process imports those once and forks a child per check instead; the
# child imports the modules and reports the kernmlops ones in sys.modules.
#
# What the server may load first, and why that changes no answer:
#  - no kernmlops module: those are what the check counts;
#  - third-party libraries whose presence no kernmlops import depends on:
#    kernmlops asks sys.modules whether a library is loaded (lazy.imported,
#    collect.tuning) only inside functions that run later, never while a module
#    is imported (test_the_fork_server_loads_what_a_fresh_interpreter_loads
#    compares the two ways on the module that uses most of PRELOAD);
#  - only libraries that leave the server single-threaded: a child forked from a
#    process with other threads can hang on a lock one of them held. polars and
#    pyarrow start threads at import (jemalloc's, polars' spill cleaner) and
#    stay out; OpenBLAS (under numpy and scipy) starts its pool unless told to
#    use one thread, and the server is. The server counts its threads before
#    every fork and refuses to fork with more than one.

#: imported once by the fork server; see above before adding one
PRELOAD = ("numpy", "scipy.stats", "pydantic", "yaml", "click", "rich")

_SERVER = """
import importlib, json, os, sys, traceback
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
early = sorted(m for m in sys.modules if m.split(".")[0] == "kernmlops")
while line := sys.stdin.readline():
    threads = len(os.listdir("/proc/self/task"))
    if early or threads != 1:
        why = f"kernmlops loaded before the fork: {early}" if early else (
            f"{threads} threads at fork: a PRELOAD library started threads")
        print(json.dumps({"error": why}), flush=True)
        continue
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # an import's print stays off the replies
        try:
            for m in json.loads(line):
                importlib.import_module(m)
            out = {"loaded": sorted(m for m in sys.modules if m.split(".")[0] == "kernmlops")}
        except BaseException:
            out = {"error": traceback.format_exc()}
        with os.fdopen(write, "w") as f:
            f.write(json.dumps(out))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    if not text:
        text = json.dumps({"error": f"the child ended with wait status {status} and no answer"})
    print(text, flush=True)
os._exit(0)  # no teardown of what it loaded: nothing of it is kept
"""


class ForkServer:
    """A process that has imported PRELOAD and nothing of kernmlops; each
    ``loaded_after`` forks it once."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD, path: Path | None = None) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # no BLAS pool: one thread to fork
        if path is not None:  # where more of ``preload`` is found
            env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVER, json.dumps(preload)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=env, start_new_session=True,
        )  # fmt: skip

    def loaded_after(self, modules: list[str], timeout: float = 120) -> set[str]:
        """kernmlops modules loaded by importing ``modules`` in a child that had
        none loaded."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(modules) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"no answer in {timeout} s importing {modules}"
        line = self.process.stdout.readline()
        assert line, f"the fork server ended (status {self.process.poll()})"
        answer = json.loads(line)
        assert "error" not in answer, answer["error"]
        return set(answer["loaded"])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # with a child stuck in an import
            self.process.wait()


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    forks = ForkServer()
    yield forks
    forks.close()


def _fresh_interpreter(modules: list[str]) -> set[str]:
    """kernmlops modules loaded by importing ``modules`` in a new interpreter."""
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


#: the session and the modules of its run (collect/): what only a collection loads
SESSION = tuple(
    f"kernmlops.collect.{m}"
    for m in ("session", "loop", "attach", "benchmark", "running", "space", "tuning")
)


def test_the_fork_server_loads_what_a_fresh_interpreter_loads(server: ForkServer) -> None:
    # the module importing most of PRELOAD (numpy, scipy.stats): loaded first or
    # not, the same kernmlops modules come in
    modules = ["kernmlops.duet.report"]
    loaded = server.loaded_after(modules)
    assert loaded == _fresh_interpreter(modules)
    assert {"kernmlops.duet.report", "kernmlops.duet.analysis"} <= loaded


def test_the_fork_server_will_not_fork_beside_other_threads(tmp_path: Path) -> None:
    # a library that starts a thread at import, as polars and pyarrow do
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()\n"
    )
    forks = ForkServer(("starts_a_thread",), tmp_path)
    try:
        with pytest.raises(AssertionError, match="threads at fork"):
            forks.loaded_after(["kernmlops.errors"])
    finally:
        forks.close()


def test_the_fork_server_will_not_fork_with_kernmlops_loaded() -> None:
    forks = ForkServer(("kernmlops.errors",))  # the check would count what it loaded
    try:
        with pytest.raises(AssertionError, match=r"kernmlops loaded before the fork: \['kernm"):
            forks.loaded_after(["kernmlops.counters"])
    finally:
        forks.close()


@pytest.mark.parametrize("module", ANALYSIS)
def test_the_analysis_side_never_loads_the_kernel_side(server: ForkServer, module: str) -> None:
    loaded = server.loaded_after([module])
    assert not _under(loaded, "kernmlops.ebpf", "kernmlops.hooks", *SESSION)


def test_the_kernel_side_knows_no_hooks_collections_or_benchmarks(server: ForkServer) -> None:
    loaded = server.loaded_after(_package("ebpf"))
    assert not _under(loaded, "kernmlops.hooks", "kernmlops.collect", "kernmlops.benchmarks")


def test_host_readers_are_the_bottom_layer(server: ForkServer) -> None:
    loaded = server.loaded_after(_package("host"))
    assert loaded <= {"kernmlops", "kernmlops.errors", "kernmlops.lazy", *_package("host"),
                      "kernmlops.host"}  # fmt: skip


def test_hooks_and_benchmarks_do_not_load_the_session(server: ForkServer) -> None:
    loaded = server.loaded_after(["kernmlops.hooks", "kernmlops.benchmarks"])
    assert not _under(loaded, "kernmlops.collect", "kernmlops.graphs", "kernmlops.data")


def test_the_registry_and_the_shared_scenarios_load_no_plug_in(server: ForkServer) -> None:
    loaded = server.loaded_after(["kernmlops.registry", "kernmlops.workloads.mllb"])
    assert not _under(loaded, "kernmlops.hooks", "kernmlops.benchmarks", "kernmlops.lb")


if __name__ == "__main__":
    print(figures(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC))
