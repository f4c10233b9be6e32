"""`kernmlops doctor`: the capability matrix and which hooks can run."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernmlops.ebpf.build import BuildError, UnsafeBuildFolder, build
from kernmlops.ebpf.probe import PROGRAM_FEATURES, Feature, needs_met, probe_all, tool_versions
from kernmlops.ebpf.variants import GROUP_NAMES, HookVariants, object_loads, object_variants
from kernmlops.hooks import REGISTRY

PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")


def privilege_notes(features: dict[str, Feature]) -> list[str]:
    """What this user lacks, in words (empty for root): why doctor's matrix is
    mostly "no" for a user who is not root."""
    notes: list[str] = []
    if not features["root"].ok:
        if features["bpf_capabilities"].ok:
            notes.append(f"not root ({features['root'].detail}), but has the BPF capabilities")
        else:
            notes.append(
                f"not root ({features['root'].detail}): BPF needs root or CAP_BPF+CAP_PERFMON, "
                "so no program type was probed"
            )
    tracefs = features["tracefs"]
    if not tracefs.ok and "not readable" in tracefs.detail:
        notes.append(f"tracefs {tracefs.detail}")
    if not features["sw_cpu_clock"].ok and "denied" in features["sw_cpu_clock"].detail:
        try:
            level = f" (kernel.perf_event_paranoid={PARANOID.read_text().strip()})"
        except OSError:
            level = ""
        notes.append(f"perf events refused{level}")
    return notes


def _unreadable(folder: Path) -> bool:
    """A folder this user may not search (another user's BPF folder)."""
    try:
        return folder.is_dir() and not os.access(folder, os.R_OK | os.X_OK)
    except PermissionError:  # nor the folder above it
        return True


def _copier_row(mask: int | None = None) -> tuple[bool, str]:
    """Whether rings reach the spool through the native copier, and at what priority
    (``mask``: the effective capabilities, default this process's)."""
    from kernmlops.config import CollectorConfig
    from kernmlops.ebpf import copier

    if not copier.available():
        folder = copier.library_path().parent
        if os.environ.get("KERNMLOPS_NATIVE_COPY") == "0":
            why = "turned off"
        elif _unreadable(folder):
            why = f"not readable by this user (in {folder})"
        else:
            why = "not built"
        return False, f"{copier.LIBRARY} {why}: rings are copied in Python (storms may overflow)"
    zstd = "zstd on disk" if copier.zstd() is not None else "no libzstd: raw on disk"
    # the default configuration's priority: as the kernel answers a thread that asks
    # (a cgroup's real-time budget included), or for a given effective set, predicted
    priority = CollectorConfig().copier_priority
    if mask is None:
        prio = copier.probed_priority(priority)
    else:
        prio = copier.expected_priority(priority, mask)
    return True, f"{copier.library_path()} ({zstd}; {prio})"


def _memory_row() -> str:
    """Where a default collection's spool goes first: the tmpfs, and how much of it."""
    from kernmlops.collect.disk import human_bytes
    from kernmlops.config import default_spool_memory_mib
    from kernmlops.spool.memory import MIN_ROOM, SHM, memory_room

    try:
        found = memory_room(default_spool_memory_mib())
    except OSError as err:
        return f"unknown ({err.strerror}): the spool goes to the output disk"
    if found is None:
        return f"none: {SHM} is no tmpfs, the spool goes to the output disk"
    room, free = found
    if room < MIN_ROOM:  # as spool_memory decides
        return f"none: {SHM} is full, the spool goes to the output disk"
    return (f"{human_bytes(room)} in {SHM} ({human_bytes(free)} free there; the spool uses at "
            "most half), the rest on the output disk, zstd-compressed")  # fmt: skip


def collection_sizing(output_dir: Path = Path("data")) -> list[tuple[str, str]]:
    """What a collection with the default configuration takes on this machine: the
    sizes that follow the CPU count (README, "On many cores") and the room there is
    for them. (name, value) rows."""
    from kernmlops.collect.disk import human_bytes
    from kernmlops.collect.rowmaking import (
        MIN_PARALLEL_RAW,
        MIN_WORKER_CPUS,
        WORKER_RAM,
        workers_for,
    )
    from kernmlops.ebpf.copier import default_workers
    from kernmlops.hooks.bpf import (
        BpfHookOptions,
        cpu_span,
        ring_group_plan,
        zstd_workers_per_copier,
    )
    from kernmlops.host.cpus import online_cpu_count

    online, usable = online_cpu_count(), len(os.sched_getaffinity(0))
    opts = BpfHookOptions()
    rings, per = ring_group_plan(opts.groups, cpu_span())
    memory = _memory_row()
    zstd = zstd_workers_per_copier(default_workers(), rings, opts.ring_bytes)
    workers = workers_for(1 << 62)
    if workers > 1:
        rows = f"{workers} processes, from {human_bytes(MIN_PARALLEL_RAW)} of spooled records"
    elif usable < MIN_WORKER_CPUS:
        rows = f"none: rows made in the collector (fewer than {MIN_WORKER_CPUS} CPUs)"
    else:
        rows = f"none: rows made in the collector (under {human_bytes(2 * WORKER_RAM)} of memory)"
    disk = output_dir.resolve()
    while not disk.exists() and disk != disk.parent:
        disk = disk.parent
    try:
        st = os.statvfs(disk)
        disk_free = human_bytes(st.f_bavail * st.f_frsize)
    except OSError as err:
        disk_free = f"unknown ({err.strerror})"
    return [
        ("CPUs", f"{online} online; {usable} this process may use"),
        ("rings per table", f"{rings}, each written by {per} CPUs, {human_bytes(opts.ring_bytes)}"),
        ("memory spool", memory),
        (
            "zstd threads per copier",
            f"{zstd} ({zstd * rings} in all, beside {rings} copiers)"
            if zstd
            else "none (4 CPUs or fewer)",
        ),
        ("row workers at stop", rows),
        (
            "output disk",
            f"{disk_free} free at {disk} (collector.output_dir: {output_dir})",
        ),
    ]


def run_doctor(console: Console) -> int:
    """Print what this machine allows; exit status 1 if no BPF hook can run.

    A user who is not root gets what can be seen without privileges and, last,
    one line that says what they lack."""
    try:
        build()
        build_error = None
    except UnsafeBuildFolder:
        raise  # nothing is probed with objects another user could have put there
    except BuildError as err:  # objects already built elsewhere may still be probed
        build_error = str(err).split("\n", 1)[0]
    features = probe_all()
    table = Table(title="this machine", title_justify="left")
    table.add_column("feature")
    table.add_column("ok")
    table.add_column("detail")
    for f in features.values():
        table.add_row(f.name, "[green]yes[/]" if f.ok else "[red]no[/]", f.detail)
    for tool, ver in tool_versions().items():
        table.add_row(tool, "[green]yes[/]" if ver else "[red]no[/]", ver or "not found")
    ok, detail = _copier_row()
    table.add_row("native ring copier", "[green]yes[/]" if ok else "[red]no[/]", detail)
    console.print(table)

    hooks = Table(title="hooks", title_justify="left")
    hooks.add_column("hook")
    hooks.add_column("runs")
    hooks.add_column("needs / reason")
    runnable = 0
    loaded = objects_loaded(features)
    for name, cls in REGISTRY.items():
        ok, why = needs_met(cls.needs, features)
        if ok and name in loaded and loaded[name][1]:
            ok, why = False, f"its object does not load: {loaded[name][1]}"
        # a BPF hook: one that needs a program type or ring buffers (not zswap, perf)
        bpf = any(o in PROGRAM_FEATURES or o == "ringbuf" for n in cls.needs for o in n.split("|"))
        runnable += ok and bpf
        hooks.add_row(name, "[green]yes[/]" if ok else "[red]no[/]", why or ", ".join(cls.needs))
    console.print(hooks)

    variants = Table(title="program variants (the first that loads is used)", title_justify="left")
    variants.add_column("hook")
    variants.add_column("variant")
    variants.add_column("loads here")
    variants.add_column("detail")
    for hv in hook_variants(features):
        if hv.error:
            variants.add_row(hv.hook, "-", "[red]no[/]", hv.error)
            continue
        # where the object was loaded, what the kernel took; else the prediction
        variant, error = loaded.get(hv.hook, (hv.selected, None))
        for kind in hv.kinds:
            used = kind.selected
            if hv.hook in loaded:
                used = error is None and kind.group in (None, variant)
            ok = "[green]yes[/]" if kind.loads else "[red]no[/]"
            variants.add_row(hv.hook, kind.kind + (" (used)" if used else ""), ok, kind.detail)
        if hv.hook in loaded:
            ok = "[red]no[/]" if error else "[green]yes[/]"
            said = f" ({GROUP_NAMES[variant]})" if variant else ""
            variants.add_row(hv.hook, "whole object", ok, error or f"the kernel loaded it{said}")
    console.print(variants)

    sizing = Table(title="a collection here (default configuration)", title_justify="left")
    sizing.add_column("what")
    sizing.add_column("here")
    for name, value in collection_sizing():
        sizing.add_row(name, value)
    console.print(sizing)
    notes = privilege_notes(features)
    if build_error:
        notes.append(f"BPF objects not built: {build_error}")
    if notes:
        if not features["root"].ok:
            notes.append("run `sudo kernmlops doctor` for the full matrix")
        console.print("; ".join(notes), markup=False, highlight=False, soft_wrap=True)
    return 0 if runnable else 1


def objects_loaded(features: Mapping[str, Feature]) -> dict[str, tuple[str | None, str | None]]:
    """Hook -> (variant, why not) of its object loaded into this kernel
    (variants.object_loads), for every BPF hook; one whose needs are not met is not
    tried (why: what it lacks). None where this process may not load BPF programs
    (the table then stays a prediction)."""
    from kernmlops.ebpf.probe import has_bpf_capabilities
    from kernmlops.hooks.bpf import BpfHook

    if not has_bpf_capabilities():
        return {}
    loaded: dict[str, tuple[str | None, str | None]] = {}
    for name, cls in REGISTRY.items():
        if not issubclass(cls, BpfHook):
            continue
        ok, why = needs_met(cls.needs, features)
        loaded[name] = object_loads(cls.object_name) if ok else (None, f"not tried: {why}")
    return loaded


def hook_variants(
    features: Mapping[str, Feature] | None = None, bpf_dir: Path | None = None
) -> list[HookVariants]:
    """For every registered BPF hook, its object's program kinds and which would
    load on this machine (features: probe_all()'s, probed if not given). It lives
    here, not in ebpf/: the kernel side of the package knows no hooks."""
    from kernmlops.hooks.bpf import BpfHook

    if features is None:
        features = probe_all(bpf_dir)
    return [
        object_variants(name, cls.object_name, features, bpf_dir)
        for name, cls in REGISTRY.items()
        if issubclass(cls, BpfHook)
    ]
