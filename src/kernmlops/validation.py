"""The "did you mean" of every configuration file: an unknown key is named with its
path, the nearest valid key and every key valid there (kernmlops' config, duet
configs, exporter metric sets).

A key that does not look like one (``root:$y$...:19700::`` from /etc/shadow given
as a config) is not repeated: errors end up in logs, and the line may be a secret.
It is shown cut to the name-like characters it starts with, and a file whose top
level has no key-like key at all is said once not to be a config."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any, get_args

from pydantic import BaseModel

#: longest key shown as written; every key of our files is far shorter
MAX_KEY_CHARS = 40
_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_HEAD = re.compile(r"[A-Za-z0-9_-]{0,12}")


def looks_like_key(key: object) -> bool:
    """A short identifier-like name (``hooks``, ``cpu_swap_ms``, ``chi-square``):
    not a line of some other file (``:``, ``$``, ``/``, spaces) nor a long text."""
    text = str(key)
    return len(text) <= MAX_KEY_CHARS and _KEY.fullmatch(text) is not None


def shown_key(key: object) -> str:
    """``key`` as written if it looks like a key, else only its first name-like
    characters (``'root…' (not a key)``): enough to find the line, not its secret."""
    text = str(key)
    if looks_like_key(text):
        return text
    head = _HEAD.match(text)
    cut = head.group(0) if head else ""
    return f"{cut + '…'!r} (not a key)"


def key_path(parts: Iterable[object]) -> str:
    """A dotted key path, each part through :func:`shown_key`."""
    return ".".join(shown_key(p) for p in parts)


def not_a_config(data: object) -> bool:
    """True for a mapping none of whose keys looks like a key: some other file (a
    password or shadow file parses as a mapping of its lines), to be named as such
    once instead of listing its lines as unknown keys."""
    return isinstance(data, dict) and bool(data) and not any(looks_like_key(k) for k in data)


def keys_at(model: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """Valid keys of the model holding the key at ``loc`` (a pydantic error's ``loc``
    without its last part), walking nested models through optional and list fields;
    [] where ``loc`` leaves the models."""
    for part in loc:
        if isinstance(part, int):  # an item of a list
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        ann = field.annotation
        nested = [
            a for a in (ann, *get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if not nested:
            return []
        model = nested[0]
    return sorted(model.model_fields)


def unknown_key(key: str, valid: Sequence[str], *, prefix: Sequence[str] = ()) -> str:
    """``unknown key; did you mean 'a.b'? (valid here: ...)``: the suggestion is named
    after ``prefix`` (the path of its section), as the user would write it. A
    ``key`` that does not look like one gets no suggestion (nothing is near it)."""
    if not looks_like_key(key):
        return f"not a key of this file (valid here: {', '.join(valid) or 'none'})"
    if not valid:  # e.g. benchmark.faux, hooks.system_info: not "(valid here: )"
        return "unknown key (this section takes no keys)"
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {'.'.join([*prefix, near[0]])!r}?" if near else ""
    return f"unknown key{hint} (valid here: {', '.join(valid)})"


#: most problems of one file listed; the rest are counted (a file of thousands of bad
#: keys is not echoed back whole)
MAX_PROBLEMS_SHOWN = 20


def problems(head: str, found: Sequence[str], total: int | None = None) -> str:
    """The error of a file with ``found`` problems: ``head: problem`` for one, as every
    other error is one line; else ``head:`` and one ``  - problem`` line each, the first
    :data:`MAX_PROBLEMS_SHOWN`. ``total``: how many there are, where ``found`` holds only
    those to show."""
    total = len(found) if total is None else total
    if total == 1:
        return f"{head}: {found[0]}"
    lines = [f"{head}:", *(f"  - {p}" for p in found[:MAX_PROBLEMS_SHOWN])]
    if total > MAX_PROBLEMS_SHOWN:
        lines.append(f"  ... and {total - MAX_PROBLEMS_SHOWN:,} more")
    return "\n".join(lines)
