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


@pytest.mark.bpf
def test_selection_matches_what_the_kernel_loads() -> None:
    """For every BPF hook, the variant hook_variants() predicts is the one
    open_and_load gets from the kernel."""
    from kernmlops.ebpf.build import build, object_path
    from kernmlops.ebpf.objects import open_and_load
    from kernmlops.hooks import REGISTRY
    from kernmlops.hooks.bpf import BpfHook

    build()
    from kernmlops.doctor import hook_variants

    found = hook_variants()
    assert {h.hook for h in found} == {n for n, c in REGISTRY.items() if issubclass(c, BpfHook)}
    for hv in found:
        assert hv.error is None, hv
        assert variants.object_loads(hv.object_name) == (hv.selected, None), hv.hook
        obj = open_and_load(object_path(hv.object_name))
        try:
            assert obj.variant == hv.selected, hv.hook
            loaded = {p.section for p in obj.programs.values() if p.autoload}
        finally:
            obj.close()
        predicted = {s for k in hv.kinds if k.selected for s in k.sections}
        assert predicted == loaded, hv.hook


@pytest.mark.bpf
def test_an_object_the_verifier_refuses_is_said_to_not_load_though_its_kinds_would(
    compile_bpf: Callable[[str, str], Path],
) -> None:
    """The prediction goes by program kinds and events; the real load runs the verifier:
    a tp_btf program reading past its tracepoint's arguments is refused."""
    bad = compile_bpf(
        "past_args",
        '#include "common.h"\n'
        'SEC("tp_btf/sched_switch") int a(unsigned long long *ctx) { return ctx[64]; }\n',
    )
    hv = object_variants("h", "past_args", features(), bad.parent)
    assert [(k.kind, k.loads) for k in hv.kinds] == [("tp_btf", True)]
    variant, why = variants.object_loads("past_args", bad.parent)
    assert variant is None and "\n" not in why  # type: ignore[operator]
    assert why.endswith("(the verifier: invalid bpf_context access off=512 size=8)")  # type: ignore[union-attr]
