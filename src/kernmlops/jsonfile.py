"""Parse JSON a user or another tool gave us (manifests, result files, index
records) so that every malformed file fails the same way: a ValueError.

``json.loads`` recurses once per level of nesting: a file of ``[[[[...`` a few
hundred kilobytes long raises RecursionError, which no reader expects, and the
command would end in a traceback instead of naming the file."""

from __future__ import annotations

import json
from typing import Any


def loads(data: str | bytes) -> Any:
    """``json.loads``; nesting too deep to parse is a ValueError, as any malformed JSON."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None
