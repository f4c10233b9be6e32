"""The import graph of kernmlops, layer to layer, and what a collection's start-up loads.

    .venv/bin/python scripts/import_graph.py            # layer -> layer edges
    .venv/bin/python scripts/import_graph.py --modules  # module -> module edges

A layer is a package under kernmlops (``hooks``, ``ebpf``, ...) or a top-level module
(``config``, ``cli``). Edges come from the source (ast): ``top`` counts imports run
when the module is imported, ``deferred`` those inside functions (run when called);
imports under ``if TYPE_CHECKING:`` are not counted. The last lines say how many
kernmlops modules (and modules in all) a fresh interpreter loads for
``kernmlops collect``'s configuration (the CLI, the session, the default config).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "kernmlops"

STARTUP = (
    "import sys, json\n"
    "import kernmlops.cli, kernmlops.collect.session\n"
    "from kernmlops.config import load_config\n"
    "load_config(None)\n"
    "mods = [m for m in sys.modules if m.startswith('kernmlops')]\n"
    "print(json.dumps({'kernmlops': sorted(mods), 'all': len(sys.modules)}))\n"
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "kernmlops"


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported kernmlops module, deferred) for each import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for stmt in child.orelse:
                    visit(stmt, deferred)
                continue
            inner = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((a.name, deferred) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                found.append((base, deferred))
            visit(child, inner)

    visit(tree, False)
    return [(m, d) for m, d in found if m == "kernmlops" or m.startswith("kernmlops.")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", action="store_true", help="module edges, not layers")
    args = parser.parse_args()
    edges: Counter[tuple[str, str, bool]] = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        src = module_name(path)
        for target, deferred in imports(path):
            a, b = (src, target) if args.modules else (layer(src), layer(target))
            if a != b:
                edges[(a, b, deferred)] += 1
    pairs = sorted({(a, b) for a, b, _ in edges})
    print(f"{'from':>14} -> {'to':<14} top deferred")
    for a, b in pairs:
        print(f"{a:>14} -> {b:<14} {edges[(a, b, False)]:>3} {edges[(a, b, True)]:>8}")
    top = sum(1 for a, b in pairs if edges[(a, b, False)])
    print(f"edges: {len(pairs)} ({top} with imports at module level)")
    out = subprocess.run(
        [sys.executable, "-c", STARTUP], capture_output=True, text=True, check=True
    )
    loaded = json.loads(out.stdout)
    by_layer = Counter(layer(m) for m in loaded["kernmlops"])
    print(
        f"start-up (cli + session + default config): {len(loaded['kernmlops'])} kernmlops "
        f"modules, {loaded['all']} modules in all"
    )
    print("  " + ", ".join(f"{k} {n}" for k, n in sorted(by_layer.items())))


if __name__ == "__main__":
    main()
