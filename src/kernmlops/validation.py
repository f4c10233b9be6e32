"""The "did you mean" of every configuration file: an unknown key is named with its
path, the nearest valid key and every key valid there (kernmlops' config, duet
configs, exporter metric sets)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel


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
    after ``prefix`` (the path of its section), as the user would write it."""
    if not valid:  # e.g. benchmark.faux, hooks.system_info: not "(valid here: )"
        return "unknown key (this section takes no keys)"
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {'.'.join([*prefix, near[0]])!r}?" if near else ""
    return f"unknown key{hint} (valid here: {', '.join(valid)})"
