"""What this machine allows: capabilities, BTF, tracefs, program and map types,
perf events. Each program type is probed by loading and attaching a trivial
program, not by asking a feature listing."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kernmlops.ebpf import libbpf
from kernmlops.ebpf.build import (
    PACKAGED_DIR,
    VMLINUX_BTF,
    default_build_dir,
    object_path,
    shipped,
)
from kernmlops.ebpf.libbpf import LibbpfError
from kernmlops.ebpf.objects import BpfObject
from kernmlops.ebpf.perf_open import (
    HW_CPU_CYCLES,
    HW_INSTRUCTIONS,
    PERF_TYPE_HARDWARE,
    PERF_TYPE_SOFTWARE,
    SW_CPU_CLOCK,
    perf_event_open,
    supported,
)
from kernmlops.host.zswap import zswap_state

CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39
TRACEFS = Path("/sys/kernel/tracing")

#: feature -> program in probe.bpf.c
PROGRAM_FEATURES = {
    "tracepoint": "probe_tracepoint",
    "raw_tp": "probe_raw_tracepoint",
    "tp_btf": "probe_tp_btf_prog",
    "iter/task": "probe_iter_task",
    "perf_event": "probe_perf_event",
    "kprobe": "probe_kprobe",
    "fentry": "probe_fentry",
}


@dataclass(frozen=True)
class Feature:
    name: str
    ok: bool
    detail: str = ""


def effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def has_bpf_capabilities() -> bool:
    caps = effective_caps()
    return bool(caps >> CAP_SYS_ADMIN & 1) or bool(caps >> CAP_BPF & 1 and caps >> CAP_PERFMON & 1)


def probe_program(feature: str, bpf_dir: Path | None = None) -> Feature:
    prog_name = PROGRAM_FEATURES[feature]
    perf_fd = -1
    try:
        with BpfObject(object_path("probe", bpf_dir)) as obj:
            for p in obj.programs.values():
                p.autoload = p.name == prog_name
            obj.load()
            prog = obj.programs[prog_name]
            if feature == "perf_event":
                perf_fd = perf_event_open(PERF_TYPE_SOFTWARE, SW_CPU_CLOCK, cpu=0, sample_freq=1)
                prog.attach_perf_event(perf_fd)
                perf_fd = -1  # the link owns it now and closes it on detach
            elif feature == "iter/task":
                prog.attach_iter()
            else:
                prog.attach()
    except LibbpfError as err:
        if feature == "kprobe" and not kprobes_in_kernel():
            # libbpf's "failed to create kprobe ... No such file or directory" hides it
            return Feature(feature, False, NO_KPROBES)
        if err.errno == errno.EPERM and has_bpf_capabilities():
            # with the capabilities EPERM is the kernel's no to the program type, not
            # a privilege the user lacks (libbpf's own hint, ulimit -l, is for old kernels)
            why = f"the kernel refuses {feature} programs even with the BPF capabilities"
            return Feature(feature, False, f"{why}: {err.reason()}")
        return Feature(feature, False, err.reason())
    finally:
        if perf_fd >= 0:
            os.close(perf_fd)
    return Feature(feature, True, "loads and attaches")


KPROBE_PMU = Path("/sys/bus/event_source/devices/kprobe")
NO_KPROBES = (
    f"this kernel has no kprobe events (built without CONFIG_KPROBE_EVENTS: no "
    f"{KPROBE_PMU}, no {TRACEFS}/kprobe_events)"
)


def kprobes_in_kernel() -> bool:
    """Whether the kernel can make kprobes at all: the two ways libbpf attaches
    one, the kprobe PMU (4.17+) and tracefs' kprobe_events."""
    try:
        return KPROBE_PMU.exists() or (TRACEFS / "kprobe_events").exists()
    except PermissionError:  # tracefs is root's: then the PMU alone answers
        return KPROBE_PMU.exists()


def _tool_version(cmd: list[str]) -> str | None:
    if not shutil.which(cmd[0]) and not shutil.which(cmd[0], path="/usr/sbin:/sbin"):
        return None
    exe = shutil.which(cmd[0]) or shutil.which(cmd[0], path="/usr/sbin:/sbin")
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = (out.stdout or out.stderr).strip().splitlines()
    return line[0] if line else None


def tracefs_feature() -> Feature:
    """Whether tracefs is mounted and readable; it is mode 0700 (root only) by default."""
    try:
        ok = (TRACEFS / "events").is_dir()
    except PermissionError:
        return Feature("tracefs", False, f"{TRACEFS} not readable (root only)")
    return Feature(
        "tracefs", ok, str(TRACEFS) if ok else "mount -t tracefs nodev /sys/kernel/tracing"
    )


@cache
def probe_all(bpf_dir: Path | None = None) -> dict[str, Feature]:
    """Every feature, probed once per process."""
    out: dict[str, Feature] = {}
    root = os.geteuid() == 0
    caps = has_bpf_capabilities()
    out["root"] = Feature("root", root, "uid 0" if root else f"uid {os.geteuid()}")
    out["bpf_capabilities"] = Feature(
        "bpf_capabilities", caps, "CAP_SYS_ADMIN or CAP_BPF+CAP_PERFMON" if caps else "missing"
    )
    out["btf"] = Feature(
        "btf", VMLINUX_BTF.exists(), str(VMLINUX_BTF) if VMLINUX_BTF.exists() else "no kernel BTF"
    )
    out["tracefs"] = tracefs_feature()
    # libbpf's map probe answers 0 for a refused map as for an unknown type: without
    # the capabilities a "no" says nothing of the kernel (unprivileged_bpf_disabled)
    ring = libbpf.has_map_type(libbpf.MAP_TYPE_RINGBUF)
    out["ringbuf"] = Feature(
        "ringbuf", ring, "BPF_MAP_TYPE_RINGBUF" if ring or caps else "needs root to probe"
    )
    storage = libbpf.has_map_type(libbpf.MAP_TYPE_TASK_STORAGE)
    out["task_storage"] = Feature(
        "task_storage",
        storage,
        "BPF_MAP_TYPE_TASK_STORAGE"
        if storage
        else "none (before Linux 5.11): quanta_runtime and the exporter's oncpu do "
        "without it; syscalls and collapse_huge_pages cannot"
        if caps
        else "needs root to probe",
    )
    if caps:
        for feature in PROGRAM_FEATURES:
            out[feature] = probe_program(feature, bpf_dir)
    else:
        for feature in PROGRAM_FEATURES:
            out[feature] = Feature(feature, False, "needs root to probe")
    for name, (t, c) in {
        "hw_cycles": (PERF_TYPE_HARDWARE, HW_CPU_CYCLES),
        "hw_instructions": (PERF_TYPE_HARDWARE, HW_INSTRUCTIONS),
        "sw_cpu_clock": (PERF_TYPE_SOFTWARE, SW_CPU_CLOCK),
    }.items():
        ok, why = supported(t, c)
        out[name] = Feature(name, ok, why or "opens")
    present, detail = zswap_state()
    out["zswap"] = Feature("zswap", present, detail)
    return out


def tool_versions() -> dict[str, str | None]:
    """Versions of the tools kernmlops uses (None: not found). Where the objects
    were shipped prebuilt (a wheel), clang and bpftool are not needed and not run."""
    if default_build_dir() == PACKAGED_DIR:
        prebuilt: str | None = f"not needed: prebuilt objects in {PACKAGED_DIR}"
        compilers = {"clang": prebuilt, "bpftool": prebuilt}
    else:
        compilers = {
            "clang": _tool_version(["clang", "--version"]),
            "bpftool": _tool_version(["bpftool", "version"]),
        }
        if shipped():  # KERNMLOPS_BPF_DIR: filled with copies of the prebuilt objects
            copied = (
                f"not found; not needed for the built-in sets (copied from {PACKAGED_DIR}), "
                "only for .bpf.c metric sets"
            )
            compilers = {tool: version or copied for tool, version in compilers.items()}
    return {"libbpf": libbpf.version(), **compilers, "kernel": os.uname().release}


def needs_met(needs: tuple[str, ...], features: dict[str, Feature]) -> tuple[bool, str]:
    """A need is a feature name, or alternatives joined by '|'."""
    missing = []
    for need in needs:
        options = need.split("|")
        if not any(features.get(o, Feature(o, False)).ok for o in options):
            missing.append(" or ".join(options))
    return (not missing, "needs " + ", ".join(missing) if missing else "")
