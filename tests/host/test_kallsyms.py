"""One kallsyms reader for stacks and labels: text symbols only, the first name at an
address, hidden (zero) addresses skipped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernmlops.host.kallsyms import KALLSYMS, KernelSymbols

TEXT = (
    "ffffffff81000000 T _stext\n"
    "ffffffff81000000 T _text\n"
    "ffffffff81000100 t helper\n"
    "ffffffff81000200 D some_data\n"
    "ffffffff81000280 W weak_fn\n"
    "ffffffffc0000000 t mod_fn\t[kvm]\n"
    "0000000000000000 A fixed_percpu_data\n"
    "0000000000000000 T hidden\n"
)


def test_text_symbols_first_name_modules_apart() -> None:
    ks = KernelSymbols(TEXT)
    assert ks.names == ["_stext", "helper", "weak_fn", "mod_fn"]
    assert ks.modules == [None, None, None, "kvm"]
    assert ks.name(0xFFFFFFFF81000000) == "_stext"  # the first of two at one address
    # a data symbol is not a function: past it is still helper
    assert ks.name(0xFFFFFFFF81000250) == "helper"
    assert ks.name(0xFFFFFFFF81000290) == "weak_fn"
    assert ks.name(0xFFFFFFFFC0000010) == "mod_fn"
    assert ks.name(0x1000) is None and ks.name(0) is None


def test_hidden_addresses_give_no_symbols() -> None:
    assert len(KernelSymbols("0000000000000000 T _stext\n0000000000000000 t f\n")) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="kallsyms shows addresses to root only")
def test_this_kernels_functions_resolve_to_themselves() -> None:
    ks = KernelSymbols.load()
    # independent parse: every text symbol alone at its address, by plain splitting.
    # BPF programs' symbols ([bpf]) come and go as any process loads or unloads one
    # between the two reads: they are left out of the comparison.
    seen: dict[int, list[str]] = {}
    for line in Path(KALLSYMS).read_text().splitlines():
        addr, kind, name, *module = line.split()
        if kind in "tTwW" and int(addr, 16) and module != ["[bpf]"]:
            seen.setdefault(int(addr, 16), []).append(name)
    alone = [(a, n[0]) for a, n in seen.items() if len(n) == 1]
    assert sum(m != "bpf" for m in ks.modules) == len(seen) and len(alone) > 1000
    for addr, name in alone[:: max(1, len(alone) // 2000)]:
        assert ks.name(addr) == name
        assert ks.name(addr + 1) == name or ks.index(addr + 1) != ks.index(addr)
