"""A collection's manifest as the graphs read it: plain JSON values, the type of
every key they use checked. Apart from ``context`` so that ``base.GraphData`` can
check its manifest on first use without importing the module that builds it."""

from __future__ import annotations

import reprlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from kernmlops.collect.manifest import MANIFEST_NAME
from kernmlops.errors import CollectionError

if TYPE_CHECKING:
    from kernmlops.data import Collection

#: What the graphs and the report read from a manifest, and the JSON type each must
#: have. A missing key or null is fine (unknown); "*" is every key of an object.
#: Parents come before their children.
_OBJECT, _TEXT, _INT, _NUMBER, _LIST, _BOOL = (
    (dict, "an object"),
    (str, "a string"),
    (int, "an integer"),
    ((int, float), "a number"),
    (list, "a list"),
    (bool, "true or false"),
)
_SHAPE: tuple[tuple[str, tuple[Any, str]], ...] = (
    ("benchmark", _OBJECT),
    ("benchmark.name", _TEXT),
    ("benchmark.description", _TEXT),
    ("benchmark.pid", _INT),
    ("benchmark.started_uptime_us", _INT),
    ("benchmark.stopped_uptime_us", _INT),
    ("started_at", _TEXT),
    ("stopped_at", _TEXT),
    ("duration_s", _NUMBER),
    ("attach_s", _NUMBER),
    ("exit_code", _INT),
    ("filter", _OBJECT),
    ("filter.tgid", _INT),
    ("system", _OBJECT),
    ("system.boot_time_unix", _NUMBER),
    ("system.logical_cpus", _INT),
    ("system.memory_bytes", _NUMBER),
    ("system.swap_bytes", _NUMBER),
    ("system.l1d_cache_bytes", _NUMBER),
    ("system.l2_cache_bytes", _NUMBER),
    ("system.l3_cache_bytes", _NUMBER),
    ("versions", _OBJECT),
    ("hooks", _OBJECT),
    ("hooks.*", _OBJECT),
    ("hooks.*.attached", _BOOL),
    ("hooks.*.events", _INT),
    ("hooks.*.drops", _INT),
    ("hooks.*.missed", _INT),
    ("hooks.*.programs", _LIST),
    ("hooks.*.unsupported", _OBJECT),
    ("config", _OBJECT),
    ("config.hooks", _OBJECT),
    ("config.hooks.page_faults", _OBJECT),
    ("config.hooks.page_faults.sample_every", _INT),
)


def _values_at(
    data: Any, parts: list[str], trail: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(key path, value) of every value at ``parts`` below ``data``."""
    if not parts:
        yield trail, data
        return
    if not isinstance(data, dict):
        return  # the parent's own check reports it
    head, rest = parts[0], parts[1:]
    keys = list(data) if head == "*" else [head]
    for key in keys:
        if key in data:
            yield from _values_at(data[key], rest, (*trail, str(key)))


def checked_manifest(collection: Collection) -> dict[str, Any]:
    """The collection's manifest as plain JSON values, with the type of every key the
    graphs read checked, so a hand-edited or damaged manifest is one clear error
    instead of a traceback in the middle of drawing.

    Raises:
        CollectionError: a key has the wrong type; the message names the file and key.
    """
    raw: Any = collection.manifest
    if isinstance(raw, BaseModel):  # the typed manifest of kernmlops.collect.manifest
        raw = raw.model_dump(mode="json", exclude_unset=True)  # what the file holds
    where = collection.path / MANIFEST_NAME
    if not isinstance(raw, dict):
        raise CollectionError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    manifest = dict(raw)
    if isinstance(manifest.get("benchmark"), str):  # version 1 wrote the name alone
        manifest["benchmark"] = {"name": manifest["benchmark"]}
    for dotted, (types, what) in _SHAPE:
        for path, value in _values_at(manifest, dotted.split(".")):
            wrong_int = types is int and isinstance(value, bool)
            if value is not None and (wrong_int or not isinstance(value, types)):
                raise CollectionError(
                    f"{where}: {'.'.join(path)}: expected {what}, got {reprlib.repr(value)}"
                )
    return manifest
