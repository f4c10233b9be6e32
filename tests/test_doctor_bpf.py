"""The tests of test_doctor.py that need root and BPF (the main lane), apart from the
others so that those run beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernmlops.ebpf.probe import Feature


@pytest.mark.bpf
def test_doctor_as_root_loads_each_hooks_object_and_says_which_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Root's doctor loads every runnable BPF hook's object (nothing attached): the
    variant the kernel took is the one marked used, and an object the kernel refuses
    (here one stood in for: quanta_runtime's, as 5.10 refused it) makes its hook
    "runs: no" with the reason, whatever its program types predict. A hook whose
    needs are not met (task storage, as on 5.10) is not tried."""
    import io

    from rich.console import Console

    from kernmlops import doctor
    from kernmlops.ebpf import variants

    real = variants.object_loads
    tried: list[str] = []

    def loads(name: str, bpf_dir: Path | None = None) -> tuple[str | None, str | None]:
        tried.append(name)
        if name == "quanta_runtime":
            return None, "load quanta_runtime.bpf.o: Invalid argument (map 'x': failed to create)"
        return real(name, bpf_dir)

    monkeypatch.setattr(doctor, "object_loads", loads)
    probed = doctor.probe_all
    no_storage = Feature("task_storage", False, "none (before Linux 5.11)")
    monkeypatch.setattr(doctor, "probe_all", lambda: {**probed(), "task_storage": no_storage})
    out = io.StringIO()
    assert doctor.run_doctor(Console(file=out, width=400)) == 0
    lines = out.getvalue().splitlines()

    def row(hook: str, *cells: str) -> list[str]:
        return [ln for ln in lines if ln.startswith(f"│ {hook} ") and all(c in ln for c in cells)]

    assert "quanta_runtime" in tried and "block_io" in tried
    assert "disk_usage" not in tried  # not a BPF hook: nothing to load
    assert "syscalls" not in tried  # its needs are not met: not tried, and nothing used
    assert row("syscalls", "whole object", " no ", "not tried: needs task_storage")
    assert not row("syscalls", "(used)")
    assert row("quanta_runtime", " no ", "its object does not load: load quanta_runtime.bpf.o")
    assert row("quanta_runtime", "whole object", " no ", "failed to create")
    assert not row("quanta_runtime", "(used)")
    assert row("block_io", " yes ", "tp_btf|raw_tp")
    assert row("block_io", "tp_btf (used)") and row("block_io", "whole object", "(btf)")
