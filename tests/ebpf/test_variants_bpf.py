"""The tests of test_variants.py that need root and BPF (the main lane): the variant the
kernel loads, and an object its verifier refuses; apart from the others so that those
run beside it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kernmlops.ebpf import variants
from kernmlops.ebpf.variants import object_variants
from tests.ebpf.test_variants import features


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
