"""The machine a benchmark runs on: transparent huge pages, the page cache, its CPUs.

``benchmark.transparent_hugepages`` is set before the benchmark starts and put back as
it was when the collection ends (also after a failure or Ctrl+C); with
``benchmark.drop_page_cache`` the page cache is written back and dropped first, so a
run does not start with another's cached files; ``benchmark.cpus`` keeps the benchmark
(and the servers it starts) on some CPUs: a cpuset cgroup where one can be made, else
the CPU affinity its processes inherit. What was done is recorded in the manifest
(``benchmark.environment``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field

from kernmlops.errors import BenchmarkError
from kernmlops.host.cpus import format_cpu_list, online_cpus, parse_cpu_list

THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
MEMINFO = Path("/proc/meminfo")
MOUNTINFO = Path("/proc/self/mountinfo")
THP_MODES = ("always", "madvise", "never")

#: the benchmark section's settings of the environment (kernmlops.config adds them)
ENVIRONMENT_FIELDS: dict[str, Any] = {
    "cpus": (
        int | str | None,
        Field(
            None,
            description="CPUs the benchmark may use: a count N (the first N CPUs online), "
            "or a list such as '0-3,8'; null or 0: all",
        ),
    ),
    "transparent_hugepages": (
        Literal["always", "madvise", "never"] | None,
        Field(
            None,
            description="transparent huge page mode during the run (restored after); "
            "null: leave as it is",
        ),
    ),
    "drop_page_cache": (
        bool,
        Field(False, description="write back and drop the page cache before the run (root)"),
    ),
}

_counter = itertools.count()


def resolve_cpus(value: int | str | None, available: list[int] | None = None) -> list[int] | None:
    """The CPU numbers ``benchmark.cpus`` names, or None for all.

    Raises:
        BenchmarkError: more CPUs than are online, a bad list, or CPUs not online.
    """
    if value in (None, 0, ""):
        return None
    available = available if available is not None else online_cpus()
    if isinstance(value, int):
        if value < 0 or value > len(available):
            raise BenchmarkError(
                f"benchmark.cpus: {value} CPUs asked for, {len(available)} online "
                f"({format_cpu_list(available)})"
            )
        return available[:value]
    cpus = parse_cpu_list(value)
    if not cpus:
        raise BenchmarkError(
            f"benchmark.cpus: {value!r} is not a CPU count or list (e.g. 2 or '0-1,4')"
        )
    missing = sorted(set(cpus) - set(available))
    if missing:
        raise BenchmarkError(
            f"benchmark.cpus: CPU(s) {format_cpu_list(missing)} not online "
            f"(online: {format_cpu_list(available)})"
        )
    return sorted(set(cpus))


def read_thp_mode(path: Path = THP_ENABLED) -> str | None:
    """The bracketed mode of ``always [madvise] never``; None where THP is absent."""
    try:
        m = re.search(r"\[(\w+)\]", path.read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def cached_bytes(path: Path = MEMINFO) -> int | None:
    """``Cached`` of /proc/meminfo in bytes."""
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            if line.startswith("Cached:"):
                return int(line.split()[1]) * 1024
    return None


def drop_page_cache() -> tuple[int | None, int | None]:
    """sync, then drop clean page cache, dentries and inodes; (Cached before, after).

    Raises:
        BenchmarkError: not permitted (needs root).
    """
    before = cached_bytes()
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
    except OSError as err:
        raise BenchmarkError(
            f"benchmark.drop_page_cache: cannot write {DROP_CACHES}: {err.strerror} "
            "(needs root); set it to false"
        ) from None
    return before, cached_bytes()


def _cpuset_v1_root() -> Path | None:
    """Mount point of a cgroup v1 hierarchy with the cpuset controller (hybrid systems)."""
    with contextlib.suppress(OSError):
        for line in MOUNTINFO.read_text().splitlines():
            pre, _, post = line.partition(" - ")
            fields = post.split()
            if len(fields) >= 3 and fields[0] == "cgroup" and "cpuset" in fields[2].split(","):
                return Path(pre.split()[4])
    return None


class CpuLimit:
    """Keeps processes on ``cpus``: a cpuset cgroup of their own where one can be made
    (cgroup v2 with the cpuset controller given to the benchmark's cgroup, else a v1
    cpuset hierarchy), else their CPU affinity, which their children inherit."""

    def __init__(self, cpus: list[int], cgroup: Path | None = None) -> None:
        self.cpus = cpus
        self.path: Path | None = None
        self._made = False
        self._cpus_fd: int | None = None
        self.method: Literal["cpuset", "affinity"] = "affinity"
        if cgroup is not None and (cgroup / "cpuset.cpus").exists():
            # v2: the parent hands the cpuset controller down
            with contextlib.suppress(OSError):
                (cgroup / "cpuset.cpus").write_text(format_cpu_list(cpus))
                self.path, self.method = cgroup, "cpuset"
                return
        root = _cpuset_v1_root()
        if root is not None:
            path = root / f"kernmlops-{os.getpid()}-{next(_counter)}"
            try:
                path.mkdir()
                self._made = True
                # v1 refuses tasks until both cpus and mems are set
                mems = (root / "cpuset.mems").read_text().strip()
                (path / "cpuset.mems").write_text(mems)
                (path / "cpuset.cpus").write_text(format_cpu_list(cpus))
                self.path, self.method = path, "cpuset"
            except OSError:
                self.close()

    def add(self, pid: int) -> None:
        """Put ``pid`` (held before it forks or execs) on the CPUs."""
        if self.path is not None and self._made:
            try:
                (self.path / "cgroup.procs").write_text(f"{pid}\n")
                return
            except OSError:
                self.method = "affinity"
        if self.method == "cpuset":
            return  # v2: the pid is in the benchmark's cgroup, which has the cpuset
        try:
            os.sched_setaffinity(pid, self.cpus)
        except OSError as err:
            raise BenchmarkError(
                f"benchmark.cpus: cannot keep pid {pid} on CPUs "
                f"{format_cpu_list(self.cpus)}: {err.strerror}"
            ) from None

    @property
    def own_cpuset(self) -> bool:
        """A cpuset cgroup made here for these processes alone (``move`` works)."""
        return self._made and self.path is not None

    def move(self, cpus: list[int] | frozenset[int]) -> bool:
        """Put every process of a cpuset made here on ``cpus`` now (the kernel
        migrates them all at once); False when there is no such cpuset."""
        if not self.own_cpuset:
            return False
        assert self.path is not None
        try:
            if self._cpus_fd is None:
                # kept open: an open per move costs ~0.5 ms here, a write ~13 us
                self._cpus_fd = os.open(self.path / "cpuset.cpus", os.O_WRONLY)
            os.write(self._cpus_fd, format_cpu_list(sorted(cpus)).encode())
        except OSError:
            return False
        self.cpus = sorted(cpus)
        return True

    def close(self) -> None:
        """Remove a v1 cpuset made here, once its processes are gone (idempotent)."""
        if self._cpus_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._cpus_fd)
            self._cpus_fd = None
        if self._made and self.path is not None:
            # A process that just exited leaves the cpuset when it is released, a
            # moment after its parent reaped it: busy until then.
            deadline = time.monotonic() + 2.0
            while True:
                try:
                    self.path.rmdir()
                except OSError as err:
                    if err.errno == errno.EBUSY and time.monotonic() < deadline:
                        time.sleep(0.01)
                        continue
                break
            self._made = False


class EnvironmentOptions(Protocol):
    """What a benchmark section says of the machine (``config.BenchmarkConfig``:
    the host layer names its shape without importing the config)."""

    cpus: int | str | None
    transparent_hugepages: str | None
    drop_page_cache: bool


@dataclass
class Environment:
    """Apply a benchmark section's environment settings, and undo them."""

    cpus: list[int] | None = None
    transparent_hugepages: str | None = None
    drop_page_cache: bool = False
    #: what was done, for the manifest
    record: dict[str, Any] = field(default_factory=dict)
    _thp_before: str | None = None
    _limits: list[CpuLimit] = field(default_factory=list)

    @classmethod
    def from_options(cls, options: EnvironmentOptions) -> Environment:
        """From ``config.benchmark`` (its ``cpus``, ``transparent_hugepages``,
        ``drop_page_cache``); checks the CPUs now, before anything starts."""
        return cls(
            cpus=resolve_cpus(options.cpus),
            transparent_hugepages=options.transparent_hugepages,
            drop_page_cache=options.drop_page_cache,
        )

    def apply(self) -> None:
        """Set THP, drop the page cache. Raises BenchmarkError (after undoing what it
        did) when the kernel refuses."""
        if self.transparent_hugepages is not None:
            before = read_thp_mode()
            if before is None:
                raise BenchmarkError(
                    f"benchmark.transparent_hugepages: this kernel has no {THP_ENABLED}"
                )
            try:
                THP_ENABLED.write_text(self.transparent_hugepages)
            except OSError as err:
                raise BenchmarkError(
                    f"benchmark.transparent_hugepages: cannot write {THP_ENABLED}: "
                    f"{err.strerror} (needs root)"
                ) from None
            self._thp_before = before
            self.record["transparent_hugepages"] = {
                "set": self.transparent_hugepages,
                "was": before,
            }
        if self.drop_page_cache:
            try:
                before_b, after_b = drop_page_cache()
            except BenchmarkError:
                self.restore()
                raise
            self.record["page_cache"] = {
                "dropped": True,
                "cached_bytes_before": before_b,
                "cached_bytes_after": after_b,
            }
        if self.cpus is not None:
            self.record["cpus"] = {"cpus": format_cpu_list(self.cpus), "method": None}

    def limit(self, pid: int, cgroup: Path | None = None) -> None:
        """Keep ``pid`` (held before it runs anything) and its children on the CPUs."""
        if self.cpus is None:
            return
        lim = CpuLimit(self.cpus, cgroup)
        self._limits.append(lim)
        lim.add(pid)
        self.record.setdefault("cpus", {"cpus": format_cpu_list(self.cpus)})
        self.record["cpus"]["method"] = lim.method

    def restore(self) -> None:
        """Put THP back as it was and remove cpusets made here (idempotent)."""
        for lim in self._limits:
            lim.close()
        self._limits.clear()
        if self._thp_before is not None:
            with contextlib.suppress(OSError):
                THP_ENABLED.write_text(self._thp_before)
                self.record["transparent_hugepages"]["restored"] = read_thp_mode()
            self._thp_before = None
