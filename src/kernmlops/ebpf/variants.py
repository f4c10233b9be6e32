"""Which program variants each BPF hook's object carries, and which would load here.

A program's kind comes from its section name (``tp_btf/…``, ``raw_tp/…``,
``tracepoint/…``, ``kprobe/…``, ``fentry/…``, ``perf_event``, ``iter/…``).
Programs named ``*_btf`` / ``*_raw`` form the object's alternative variants
(the loader takes the first the kernel accepts, see objects.open_and_load);
the others always load. A kind loads here when its probe (ebpf/probe.py)
loaded and attached; a tracepoint program also needs its event in tracefs,
a tp_btf / raw_tp program its ``btf_trace_<event>`` type in the kernel's BTF.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kernmlops.ebpf.btf import Kind, kernel_type
from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.probe import TRACEFS, Feature

#: Section-name prefix -> program kind, longest prefixes first.
SECTION_KINDS: tuple[tuple[str, str], ...] = (
    ("tp_btf/", "tp_btf"),
    ("raw_tracepoint.w/", "raw_tp"),
    ("raw_tracepoint/", "raw_tp"),
    ("raw_tp.w/", "raw_tp"),
    ("raw_tp/", "raw_tp"),
    ("tracepoint/", "tracepoint"),
    ("tp/", "tracepoint"),
    ("kretprobe.multi/", "kprobe"),
    ("kprobe.multi/", "kprobe"),
    ("kretprobe/", "kprobe"),
    ("kprobe/", "kprobe"),
    ("kretsyscall/", "kprobe"),
    ("ksyscall/", "kprobe"),
    ("fentry.s/", "fentry"),
    ("fexit.s/", "fentry"),
    ("fmod_ret/", "fentry"),
    ("fentry/", "fentry"),
    ("fexit/", "fentry"),
    ("perf_event", "perf_event"),
    ("iter.s/", "iter"),
    ("iter/", "iter"),
)
#: Program kind -> the probe.py feature that says whether it loads.
KIND_FEATURES = {
    "tp_btf": "tp_btf",
    "raw_tp": "raw_tp",
    "tracepoint": "tracepoint",
    "kprobe": "kprobe",
    "fentry": "fentry",
    "perf_event": "perf_event",
}
#: Object variant (program-name suffix) -> how doctor names it.
GROUP_NAMES = {None: "always", "btf": "btf", "raw": "raw"}


def section_kind(section: str) -> str:
    """The program kind of a section name; ``other`` when not one of ours."""
    for prefix, kind in SECTION_KINDS:
        if section.startswith(prefix):
            return kind
    return "other"


@dataclass(frozen=True)
class ProgramKind:
    """The programs of one kind in one variant group of an object."""

    kind: str
    #: object variant: None (always loaded), "btf", "raw"
    group: str | None
    sections: tuple[str, ...]
    loads: bool
    detail: str
    #: whether the loader would pick these programs on this machine
    selected: bool = False


@dataclass(frozen=True)
class HookVariants:
    hook: str
    object_name: str
    kinds: tuple[ProgramKind, ...] = ()
    #: the variant the loader would take here ("btf", "raw"), None for an
    #: object without variants or one where none loads
    selected: str | None = None
    #: why the object could not be read (not built, unreadable)
    error: str | None = None


def _event_missing(kind: str, section: str) -> str | None:
    """Why the event a program attaches to is not on this kernel, or None."""
    target = section.split("/", 1)[1] if "/" in section else ""
    if kind == "tracepoint" and target:
        try:
            if not (TRACEFS / "events").is_dir():
                return None  # tracefs not mounted: the tracepoint feature says so
            if not (TRACEFS / "events" / target).is_dir():
                return f"no tracepoint {target}"
        except PermissionError:
            return None  # not readable by this user: the tracefs feature says so
    btf_event = kind in ("tp_btf", "raw_tp") and target and "/" not in target
    if btf_event and kernel_type(Kind.TYPEDEF, f"btf_trace_{target}") is None:
        return f"no tracepoint {target} in kernel BTF"
    return None


def _kind_loads(
    kind: str, sections: list[str], features: Mapping[str, Feature]
) -> tuple[bool, str]:
    if kind == "iter":
        targets = sorted({s.split("/", 1)[1] for s in sections if "/" in s})
        missing = [t for t in targets if not features.get(f"iter/{t}", Feature(t, False)).ok]
        if missing:
            probed = [t for t in missing if f"iter/{t}" in features]
            why = features[f"iter/{probed[0]}"].detail if probed else "not probed"
            return False, f"iter/{missing[0]}: {why}"
        return True, "loads and attaches"
    feature = KIND_FEATURES.get(kind)
    if feature is None:
        return False, "kind not probed"
    f = features.get(feature)
    if f is None or not f.ok:
        return False, f.detail if f else "not probed"
    for section in sections:
        why = _event_missing(kind, section)
        if why:
            return False, why
    return True, f.detail


def object_variants(
    hook: str,
    object_name: str,
    features: Mapping[str, Feature],
    bpf_dir: Path | None = None,
) -> HookVariants:
    """The program kinds of one object, grouped by variant, and what loads here.

    The programs come from the object's spec (its ELF, parsed once per process and
    cached), not from libbpf: doctor opens each object once, to load it
    (:func:`object_loads`)."""
    from kernmlops.ebpf.btf import BtfError
    from kernmlops.ebpf.objects import VARIANTS
    from kernmlops.ebpf.spec import object_spec, program_variant

    path = object_path(object_name, bpf_dir)
    try:
        # exists() raises too: a BPF folder this user may not search
        if not path.exists():
            return HookVariants(hook, object_name, error=f"{path} not built")
        spec = object_spec(path)
    except (BtfError, OSError) as err:
        return HookVariants(hook, object_name, error=str(err).split("\n", 1)[0])
    progs = [(program_variant(name), section) for name, section in spec.programs.items()]
    groups: dict[tuple[str | None, str], list[str]] = {}
    for variant, section in progs:
        groups.setdefault((variant, section_kind(section)), []).append(section)
    kinds = {
        key: (*_kind_loads(key[1], sections, features), tuple(sections))
        for key, sections in groups.items()
    }
    # The loader's choice: the first variant whose programs all load.
    variants = [v for v in VARIANTS if any(g == v for g, _ in groups)]
    selected = next(
        (v for v in variants if all(ok for (g, _), (ok, _, _) in kinds.items() if g == v)), None
    )
    order = {None: 0, **{v: i + 1 for i, v in enumerate(VARIANTS)}}
    rows = tuple(
        ProgramKind(
            kind=kind,
            group=group,
            sections=sections,
            loads=ok,
            detail=detail,
            selected=ok and (group is None or group == selected),
        )
        for (group, kind), (ok, detail, sections) in sorted(
            kinds.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1])
        )
    )
    return HookVariants(hook, object_name, rows, selected)


def object_loads(object_name: str, bpf_dir: Path | None = None) -> tuple[str | None, str | None]:
    """An object loaded into this kernel and closed again, nothing attached (root, or
    CAP_BPF + CAP_PERFMON): (the variant the loader took, None for an object without
    variants; None) or (None, why it does not load: the first line of the error).
    Where the prediction above goes by program types and events, this runs the
    verifier on the object's own programs and creates its maps, so a map type or an
    instruction the kernel lacks (task storage before 5.11, atomics before 5.12) shows."""
    from kernmlops.ebpf.libbpf import LibbpfError
    from kernmlops.ebpf.objects import open_and_load

    path = object_path(object_name, bpf_dir)
    try:
        obj = open_and_load(path)
    except LibbpfError as err:
        return None, err.reason()
    except OSError as err:
        return None, str(err)
    try:
        return obj.variant, None
    finally:
        obj.close()
