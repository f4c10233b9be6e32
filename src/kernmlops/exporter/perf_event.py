"""``SEC("perf_event/type=T,config=C,frequency=F")`` programs: one perf event
per online CPU, each running the program (ebpf_exporter's section form).

libbpf knows a section called ``perf_event`` but cannot attach it (it does not
know which event): the section names the event, and we open it with
perf_event_open(2) on every CPU and attach the program to each. ``type`` and
``config`` are perf_event_attr's (type 1 = software, e.g. config 0 cpu-clock;
type 0 = hardware, e.g. config 0 cycles); ``frequency`` samples per second, or
``period`` events per sample (ours, beside ebpf_exporter's keys).

A CPU's perf event dies with the CPU going offline, and one brought online after
the start has none (ebpf_exporter attaches once): :class:`PerfEventLinks` keeps
the program on every online CPU as CPUs come and go, told by the kernel's
uevents (host.cpus.CpuHotplugWatch), or by a look at the online list every
second where there are none.
"""

from __future__ import annotations

import errno
import os
import select
import sys
import threading
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
from kernmlops.host.cpus import CpuHotplugWatch, online_cpus

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


def _attach_on(prog: Program, spec: PerfEventSpec, cpu: int) -> Link:
    """``prog`` attached to the section's event on ``cpu``; LibbpfError in one line."""
    try:
        fd = perf_event_open(
            spec.type, spec.config, cpu=cpu, sample_freq=spec.frequency, sample_period=spec.period
        )
    except LibbpfError as err:
        raise LibbpfError(_open_error(spec, cpu, err.errno)) from None
    try:
        return prog.attach_perf_event(fd)  # the link owns fd from here
    except BaseException:
        os.close(fd)
        raise


class PerfEventLinks:
    """A ``perf_event/...`` program on every online CPU, kept so while CPUs come
    and go (a service of its set: :meth:`start` once capabilities are dropped,
    :meth:`close` before the object closes). Attaching at the start is all or
    nothing (the links made are destroyed, the error says in one line which
    event on which CPU and why); a CPU brought online later (or back)
    that cannot have the event (no privilege left after a capability drop) is
    said once on stderr and kept in :attr:`unattached` with the reason."""

    #: how often the online list is looked at where no uevent says it changed
    LOOK_S = 1.0

    def __init__(self, prog: Program, *, where: str = "") -> None:
        self.spec = parse_section(prog.section)
        self.section = prog.section
        self.program = prog.name
        self.where = where or prog.section
        self._prog = prog
        # listening before the online list is read: a CPU that goes after is queued
        self._watch = CpuHotplugWatch()
        self.links: dict[int, Link] = {}
        #: online CPUs without the program, and why
        self.unattached: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            for cpu in online_cpus():
                self.links[cpu] = _attach_on(prog, self.spec, cpu)
        except BaseException:
            self._destroy()
            raise

    def refresh(self, online: list[int] | None = None) -> list[int]:
        """Attach on each CPU online now (``online``: sysfs's list when None)
        without a live event: come online since the last look, or gone (the
        uevents say) and back. The CPUs attached on."""
        went, _came, overflowed = self._watch.take()
        now = set(online_cpus() if online is None else online)
        # gone, or gone and back (its event died with it); a lost uevent: any may have
        gone = (set(self.links) - now) | (set(self.links) if overflowed else went)
        for cpu in gone & set(self.links):
            self.links.pop(cpu).destroy()
        for cpu in (set(self.unattached) - now) | went:
            self.unattached.pop(cpu, None)  # tried again if it comes online anew
        attached = []
        for cpu in sorted(now - set(self.links) - set(self.unattached)):
            try:
                self.links[cpu] = _attach_on(self._prog, self.spec, cpu)
                attached.append(cpu)
            except LibbpfError as err:
                self.unattached[cpu] = str(err)
                print(
                    f"kernmlops export: {self.where}: CPU {cpu} came online after the start "
                    f"and the program cannot run there ({err}): its events are not seen",
                    file=sys.stderr,
                )
        return attached

    def start(self) -> None:
        """Follow the CPUs from a thread of its own until :meth:`close`."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"perf-cpus-{self._prog.name}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            fileno = self._watch.fileno()
            if fileno is None:
                self._stop.wait(self.LOOK_S)
            else:  # woken by a uevent (any device's), else a look each LOOK_S
                select.select([fileno], [], [], self.LOOK_S)
            if not self._stop.is_set():
                self.refresh()

    def _destroy(self) -> None:
        while self.links:
            self.links.popitem()[1].destroy()
        self._watch.close()

    def close(self) -> None:
        """Stop following and detach from every CPU (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._destroy()


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
