"""Event names to specs, once each (kernmlops.ebpf.perf_counters.resolve_all)."""

from __future__ import annotations

import pytest

from kernmlops.ebpf import perf_counters
from kernmlops.ebpf.perf_counters import EventSpec, resolve_all


def test_each_event_is_taken_once_and_unknown_names_are_said() -> None:
    # "cs" is perf's alias of context-switches: the second spelling adds nothing
    specs, left_out = resolve_all(["cs", "context-switches", "task-clock", "bogus-event"])
    assert [s.name for s in specs] == ["context-switches", "task-clock"]
    assert list(left_out) == ["bogus-event"]
    assert "unknown perf event 'bogus-event'" in left_out["bogus-event"]


def test_a_column_clash_is_left_out_only_when_columns_must_differ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two distinct events whose column names collide (e.g. a PMU's cycles beside
    # the generic one would, where both exist).
    a = EventSpec("x-y", "software", 1, 100, encoding="config=0x64")
    b = EventSpec("x_y", "software", 1, 101, encoding="config=0x65")
    monkeypatch.setattr(perf_counters, "resolve", {"x-y": a, "x_y": b}.__getitem__)
    assert perf_counters.event_column("x-y") == perf_counters.event_column("x_y")
    specs, left_out = resolve_all(["x-y", "x_y"], distinct_columns=True)
    assert specs == [a] and left_out == {"x_y": "its column name clashes with x-y's"}
    specs, left_out = resolve_all(["x-y", "x_y"])
    assert specs == [a, b] and left_out == {}
