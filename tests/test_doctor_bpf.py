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


@pytest.mark.bpf
def test_doctor_opens_each_object_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Root's doctor opens each BPF hook's object with libbpf once, to load it (the
    program kinds come from the object's spec): the opens counted at libbpf's
    opener, per object, against the objects it loaded; none opened twice."""
    import io
    from collections import Counter

    from rich.console import Console

    from kernmlops import doctor
    from kernmlops.ebpf import objects
    from kernmlops.ebpf.spec import VARIANTS
    from kernmlops.hooks import REGISTRY
    from kernmlops.hooks.bpf import BpfHook

    opened: Counter[str] = Counter()
    real_open = objects.lib.bpf_object__open_file

    def counting_open(path: bytes, opts: object) -> int:
        opened[Path(path.decode()).name] += 1
        return real_open(path, opts)

    monkeypatch.setattr(objects.lib, "bpf_object__open_file", counting_open)
    loaded: dict[str, tuple[str | None, str | None]] = {}
    real_loaded = doctor.objects_loaded

    def seen(features):  # what doctor loaded, to compare the opens with
        loaded.update(real_loaded(features))
        return loaded

    monkeypatch.setattr(doctor, "objects_loaded", seen)
    assert doctor.run_doctor(Console(file=io.StringIO(), width=400)) == 0
    objs = {
        name: f"{cls.object_name}.bpf.o"
        for name, cls in REGISTRY.items()
        if issubclass(cls, BpfHook)
    }
    not_tried = {objs[n] for n, (_, why) in loaded.items() if (why or "").startswith("not tried")}
    took = {objs[n]: v for n, (v, why) in loaded.items() if why is None}
    assert took  # some hook objects loaded here
    # an object the first variant did not load for is opened again for the next
    want = {obj: 1 + VARIANTS.index(v) if v else 1 for obj, v in took.items()}
    assert {obj: opened[obj] for obj in took} == want
    assert not {obj: opened[obj] for obj in not_tried if opened[obj]}
    refused = set(objs.values()) - set(took) - not_tried
    assert all(1 <= opened[obj] <= len(VARIANTS) for obj in refused)
