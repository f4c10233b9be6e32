"""The pre-commit hooks check what CONTRIBUTING.md says they check."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _hook(hook_id: str) -> dict[str, str]:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    return next(h for repo in config["repos"] for h in repo["hooks"] if h["id"] == hook_id)


def test_plugin_index_hook_rewrites_a_stale_index(tmp_path: Path) -> None:
    # The hook regenerates the indexes and fails on a diff: the module it runs
    # must write them, or a stale index passes unnoticed.
    words = shlex.split(shlex.split(_hook("plugin-index")["entry"])[-1])
    module = words[words.index("-m") + 1].rstrip(";&")
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "src" / "kernmlops", src / "kernmlops", ignore=shutil.ignore_patterns("__pycache__")
    )
    index = src / "kernmlops" / "hooks" / "_index.py"
    fresh = index.read_text()
    index.write_text(fresh.replace('    "block_io": ("block_io", "BlockIoHook"),\n', ""))
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-m", module], env=env, check=True, capture_output=True)
    assert index.read_text() == fresh
