"""``SEC("perf_event/type=T,config=C,frequency=F")`` programs: one perf event
per online CPU, each running the program (ebpf_exporter's section form).

libbpf knows a section called ``perf_event`` but cannot attach it (it does not
know which event): the section names the event, and we open it with
perf_event_open(2) on every CPU and attach the program to each. ``type`` and
``config`` are perf_event_attr's (type 1 = software, e.g. config 0 cpu-clock;
type 0 = hardware, e.g. config 0 cycles); ``frequency`` samples per second, or
``period`` events per sample (ours, beside ebpf_exporter's keys).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from kernmlops.ebpf.libbpf import LibbpfError, register_prog_handler
from kernmlops.ebpf.objects import Link, Program
from kernmlops.ebpf.perf_counters import HARDWARE, SOFTWARE
from kernmlops.ebpf.perf_open import (
    PERF_TYPE_HARDWARE,
    PERF_TYPE_HW_CACHE,
    PERF_TYPE_SOFTWARE,
    perf_event_open,
)
from kernmlops.host.cpus import online_cpus

SECTION = "perf_event"
BPF_PROG_TYPE_PERF_EVENT = 7
BPF_PERF_EVENT = 41  # enum bpf_attach_type
_TYPES = {PERF_TYPE_HARDWARE: "hardware", PERF_TYPE_SOFTWARE: "software", 3: "hw-cache"}
_NAMES = {
    PERF_TYPE_HARDWARE: {config: name for name, (config, _) in HARDWARE.items()},
    PERF_TYPE_SOFTWARE: {config: name for name, (config, _) in SOFTWARE.items()},
}


def register_section_handler() -> None:
    """Teach libbpf (once per process) that ``perf_event/...`` sections are
    perf_event programs; without it, opening such an object fails."""
    register_prog_handler(f"{SECTION}/", BPF_PROG_TYPE_PERF_EVENT, BPF_PERF_EVENT)


def is_perf_event(section: str) -> bool:
    return section == SECTION or section.startswith(SECTION + "/")


@dataclass(frozen=True)
class PerfEventSpec:
    type: int
    config: int
    frequency: int | None = None
    period: int | None = None

    @property
    def description(self) -> str:
        kind = _TYPES.get(self.type, f"type {self.type}")
        name = _NAMES.get(self.type, {}).get(self.config)
        what = f"{kind} event {name}" if name else f"{kind} event config={self.config}"
        return f"{what} (type={self.type}, config={self.config})"


def parse_section(section: str) -> PerfEventSpec:
    """``perf_event/type=1,config=0,frequency=99`` -> its event."""
    if section == SECTION:
        raise LibbpfError(
            'SEC("perf_event") names no event: name it in the section, e.g. '
            'SEC("perf_event/type=1,config=0,frequency=99") (software cpu-clock at 99 Hz)'
        )
    fields: dict[str, int] = {}
    for item in section.removeprefix(SECTION + "/").split(","):
        key, sep, value = item.partition("=")
        if not sep or key not in ("type", "config", "frequency", "period"):
            raise LibbpfError(
                f"section {section!r}: bad item {item!r} (give type=, config=, frequency= or "
                "period=, comma-separated)"
            )
        try:
            fields[key] = int(value, 0)
        except ValueError:
            raise LibbpfError(f"section {section!r}: {key}={value!r} is not a number") from None
    if "type" not in fields or "config" not in fields:
        raise LibbpfError(f"section {section!r}: give type= and config=")
    if "frequency" in fields and "period" in fields:
        raise LibbpfError(f"section {section!r}: give frequency= or period=, not both")
    if not fields.get("frequency") and not fields.get("period"):
        raise LibbpfError(f"section {section!r}: give frequency= (Hz) or period= (events)")
    return PerfEventSpec(
        fields["type"], fields["config"], fields.get("frequency"), fields.get("period")
    )


def attach_perf_event(prog: Program, cpus: list[int] | None = None) -> list[Link]:
    """Open the section's event on every online CPU and attach ``prog`` to each.
    All or nothing: on a failure the links made so far are destroyed and the
    error says in one line which event and why."""
    spec = parse_section(prog.section)
    links: list[Link] = []
    try:
        for cpu in online_cpus() if cpus is None else cpus:
            try:
                fd = perf_event_open(
                    spec.type,
                    spec.config,
                    cpu=cpu,
                    sample_freq=spec.frequency,
                    sample_period=spec.period,
                )
            except LibbpfError as err:
                raise LibbpfError(_open_error(spec, cpu, err.errno)) from None
            try:
                links.append(prog.attach_perf_event(fd))  # the link owns fd from here
            except BaseException:
                os.close(fd)
                raise
    except BaseException:
        for link in links:
            link.destroy()
        raise
    return links


def _open_error(spec: PerfEventSpec, cpu: int, err: int) -> str:
    why = os.strerror(err) if err else "failed"
    line = f"perf {spec.description} cannot be opened on CPU {cpu}: {why}"
    if spec.type in (PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE) and err in (
        errno.ENOENT,
        errno.EOPNOTSUPP,
        errno.ENODEV,
        errno.EINVAL,
    ):
        line += " (this machine's PMU does not count it: no hardware counters, e.g. a VM)"
    elif err in (errno.EACCES, errno.EPERM):
        line += " (needs CAP_PERFMON or root)"
    return line
