"""Writing bench/results/*.json without this machine's absolute paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def portable(text: str) -> str:
    """Paths under the checkout become relative to it, so results read the same anywhere."""
    return text.replace(str(ROOT) + "/", "")


def save(path: Path, result: Any, *, indent: int = 2) -> None:
    """Write one result file (JSON, trailing newline) with checkout-relative paths."""
    path.write_text(portable(json.dumps(result, indent=indent, default=str)) + "\n")
