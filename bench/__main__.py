"""`python -m bench list` | `python -m bench <name> [options]`: the one entry point."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import harness

#: modules of the package that are not benchmarks
NOT_BENCHMARKS = frozenset({"harness"})


@dataclass(frozen=True)
class Entry:
    name: str
    module: str
    purpose: str
    target: str


def _entry(module: str, path: Path) -> Entry:
    """A benchmark's purpose (its docstring's first paragraph) and target, read from the
    source without importing it: listing costs no numpy, no polars, no libbpf."""
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree) or ""
    target = ""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign | ast.AnnAssign)
            and any(isinstance(t, ast.Name) and t.id == "TARGET" for t in _targets(node))
            and node.value is not None
        ):
            target = ast.literal_eval(node.value)
    purpose = " ".join(doc.split("\n\n", 1)[0].split())
    return Entry(harness.name_of(module), module, purpose, target)


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return list(node.targets) if isinstance(node, ast.Assign) else [node.target]


def benchmarks() -> dict[str, Entry]:
    """Every benchmark module of the package, by its command-line name."""
    found = {}
    for info in pkgutil.iter_modules([str(harness.BENCH)]):
        if info.ispkg or info.name.startswith("_") or info.name in NOT_BENCHMARKS:
            continue
        entry = _entry(info.name, harness.BENCH / f"{info.name}.py")
        found[entry.name] = entry
    return dict(sorted(found.items()))


def _list() -> int:
    entries = benchmarks().values()
    width = max(len(e.name) for e in entries)
    for e in entries:
        print(f"{e.name:{width}s}  {e.purpose}")
        if e.target:
            print(f"{'':{width}s}  target: {e.target}")
    print("\npython -m bench <name> --help for a benchmark's options; results go to bench/results/")
    return 0


USAGE = "usage: python -m bench list | python -m bench <name> [options] (see bench/README.md)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "list":
        return _list()
    known = benchmarks()
    name = argv[0].replace("_", "-")
    if name not in known:
        print(f"no benchmark {argv[0]!r}; python -m bench list shows them", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{known[name].module}")
    harness.begin(name, argv[1:])
    rc = module.main(argv[1:])
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
