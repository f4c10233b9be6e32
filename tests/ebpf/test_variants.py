"""Program variants per hook: kinds from section names, and what would load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kernmlops.ebpf import variants
from kernmlops.ebpf.probe import Feature
from kernmlops.ebpf.variants import object_variants, section_kind

SOURCE = r"""
#include "common.h"
SEC("tp_btf/sched_switch") int a_btf(void *ctx) { return 0; }
SEC("raw_tp/sched_switch") int a_raw(void *ctx) { return 0; }
SEC("tracepoint/sched/sched_switch") int b(void *ctx) { return 0; }
SEC("kprobe/vfs_read") int c(void *ctx) { return 0; }
SEC("iter/task") int d(struct bpf_iter__task *ctx) { return 0; }
"""


def features(**ok: bool) -> dict[str, Feature]:
    names = ("tp_btf", "raw_tp", "tracepoint", "kprobe", "fentry", "perf_event", "iter/task")
    return {n: Feature(n, ok.get(n.replace("/", "_"), True), f"{n} probed") for n in names}


def test_section_kinds() -> None:
    cases = {
        "tp_btf/sched_switch": "tp_btf",
        "raw_tp/sys_enter": "raw_tp",
        "raw_tracepoint/sys_enter": "raw_tp",
        "tracepoint/sched/sched_switch": "tracepoint",
        "tp/kmem/rss_stat": "tracepoint",
        "kprobe/vfs_read": "kprobe",
        "kretprobe/vfs_read": "kprobe",
        "ksyscall/openat": "kprobe",
        "fentry/vfs_read": "fentry",
        "fexit/vfs_read": "fentry",
        "perf_event": "perf_event",
        "iter/task": "iter",
        "xdp": "other",
    }
    assert {s: section_kind(s) for s in cases} == cases


@pytest.fixture
def obj_dir(compile_bpf: Callable[[str, str], Path], tmp_path: Path, monkeypatch) -> Path:
    obj = compile_bpf("variant_kinds", SOURCE)
    # tracefs as this test wants it: sched_switch exists, nothing else does
    (tmp_path / "events" / "sched" / "sched_switch").mkdir(parents=True)
    monkeypatch.setattr(variants, "TRACEFS", tmp_path)
    return obj.parent


def rows(hv: variants.HookVariants) -> dict[tuple[str, str], tuple[bool, bool]]:
    return {(variants.GROUP_NAMES[k.group], k.kind): (k.loads, k.selected) for k in hv.kinds}


def test_btf_preferred_raw_fallback_kprobe_refused(obj_dir: Path) -> None:
    hv = object_variants("h", "variant_kinds", features(kprobe=False), obj_dir)
    assert hv.error is None and hv.selected == "btf"
    assert rows(hv) == {
        ("always", "tracepoint"): (True, True),
        ("always", "kprobe"): (False, False),
        ("always", "iter"): (True, True),
        ("btf", "tp_btf"): (True, True),
        ("raw", "raw_tp"): (True, False),
    }
    (kp,) = [k for k in hv.kinds if k.kind == "kprobe"]
    assert kp.sections == ("kprobe/vfs_read",) and kp.detail == "kprobe probed"
    # Without tp_btf the loader falls back to raw_tp; without both, neither.
    assert object_variants("h", "variant_kinds", features(tp_btf=False), obj_dir).selected == "raw"
    none = object_variants("h", "variant_kinds", features(tp_btf=False, raw_tp=False), obj_dir)
    assert none.selected is None
    assert rows(none)[("raw", "raw_tp")] == (False, False)
    assert rows(none)[("always", "iter")] == (True, True)
    no_iter = object_variants("h", "variant_kinds", features(iter_task=False), obj_dir)
    assert rows(no_iter)[("always", "iter")] == (False, False)


def test_missing_events_do_not_load(
    compile_bpf: Callable[[str, str], Path], tmp_path: Path, monkeypatch
) -> None:
    src = SOURCE.replace("sched/sched_switch", "sched/no_such_event").replace(
        "tp_btf/sched_switch", "tp_btf/no_such_event"
    )
    obj = compile_bpf("variants_missing", src)
    (tmp_path / "events" / "sched" / "sched_switch").mkdir(parents=True)
    monkeypatch.setattr(variants, "TRACEFS", tmp_path)
    hv = object_variants("h", "variants_missing", features(), obj.parent)
    details = {k.kind: (k.loads, k.detail) for k in hv.kinds}
    assert details["tracepoint"] == (False, "no tracepoint sched/no_such_event")
    assert details["tp_btf"] == (False, "no tracepoint no_such_event in kernel BTF")
    assert hv.selected == "raw"  # raw_tp/sched_switch is still there


def test_object_not_built(tmp_path: Path) -> None:
    hv = object_variants("h", "nothing", features(), tmp_path)
    assert hv.error is not None and "not built" in hv.error and not hv.kinds
