"""The plug-in indexes: which registries have one, and writing them.

``python -m kernmlops.plugin_indexes`` (``make defaults``) rewrites each
``_index.py`` that no longer matches its package. This lives above the hook and
benchmark packages, not in :mod:`kernmlops.registry`, because it must import
them: the registry they import stays below them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kernmlops.benchmarks import REGISTRY as BENCHMARKS
from kernmlops.fileio import write_atomic
from kernmlops.hooks import REGISTRY as HOOKS
from kernmlops.registry import Plugins, index_path, index_source


def registries() -> list[Plugins[Any]]:
    """The registries that have an index: hooks and benchmarks."""
    return [HOOKS, BENCHMARKS]


def write_indexes() -> list[Path]:
    """Write the index of every registry that changed; the paths written."""
    written = []
    for plugins in registries():
        path, text = index_path(plugins), index_source(plugins)
        if not path.exists() or path.read_text() != text:
            written.append(write_atomic(path, text))
    return written


if __name__ == "__main__":
    for written in write_indexes():
        print(f"wrote {written}", file=sys.stderr)
