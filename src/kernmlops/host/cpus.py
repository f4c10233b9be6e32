"""CPU lists in the kernel's notation ("0-3,8"), the CPUs online now, and whether the
machine has CPU to spare (/proc/stat)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def parse_cpu_list(text: str | None) -> list[int] | None:
    """Kernel CPU list ("0-3,8,10-11") → [0, 1, 2, 3, 8, 10, 11]; None if unreadable
    (also a descending range: "3-1")."""
    if text is None:
        return None
    cpus: list[int] = []
    try:
        for part in text.strip().split(","):
            if not part:
                continue
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
            if first < 0 or last < first:
                return None
            cpus.extend(range(first, last + 1))
    except ValueError:
        return None
    return cpus


def format_cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] → "0-3,8", the kernel's own notation."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def online_cpu_count() -> int:
    """CPUs online now (what a workload can be spread over)."""
    online = parse_cpu_list(_read(SYS_CPU / "online"))
    if online:
        return len(online)
    return os.cpu_count() or 1


def read_cpu_list(path: Path) -> list[int]:
    """The CPU list in a sysfs file (``cpulist``, ``online``); [] if unreadable."""
    return parse_cpu_list(_read(path)) or []


def online_cpus() -> list[int]:
    """CPU numbers online now; every CPU Python counts if sysfs cannot say."""
    return read_cpu_list(SYS_CPU / "online") or list(range(os.cpu_count() or 1))


def default_spare_need(cpus: int) -> float:
    """Idle CPUs that count as spare for making rows during a run: a quarter of the
    ``cpus`` the collector may use, at least half a CPU. A 16-core switch storm leaves
    up to 2 of 16 CPUs idle for a moment between its wake-ups (a median of 0), which a
    fixed half CPU called spare: rows were made in it (the collector held 158 MB, 136
    without); the stop's row workers make them in a fraction of the run's time."""
    return max(0.5, cpus / 4)


class SpareCpu:
    """Whether the machine has CPU to spare for making rows: idle CPU time over the
    last ``window_s``, from /proc/stat (cheap: read at most every ``window_s``).
    ``ask()`` answers from the last window.

    The collector's own CPU does not count as spare: it did once, and a collector
    that had started making rows (or importing its libraries) went on calling its
    own use spare under a switch storm, taking up to 20% of a CPU from it."""

    def __init__(
        self, window_s: float = 0.1, need: float | None = None, cpus: set[int] | None = None
    ) -> None:
        self.window_s = window_s
        # Only the CPUs the collector may run on: pinned to 2 CPUs of a 16-CPU
        # machine (taskset, a cpuset), the 14 idle others are not spare for it, and
        # rows made "in spare time" took 24% of the 2 CPUs from a storm.
        allowed = cpus if cpus is not None else os.sched_getaffinity(0)
        self.need = default_spare_need(len(allowed)) if need is None else need
        self._cpus = (
            None if set(online_cpus()) <= allowed else {f"cpu{c}".encode() for c in allowed}
        )
        self._last = self._sample()
        self._at = time.monotonic()
        self.spare = False  # until a window has been measured

    def _sample(self) -> float:
        """Idle seconds of the CPUs watched, since boot."""
        ticks = 0
        try:
            with open("/proc/stat", "rb") as f:
                if self._cpus is None:  # the first line sums every CPU
                    fields = f.readline().split()
                    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")
                for line in f:
                    fields = line.split()
                    if fields and fields[0] in self._cpus:
                        ticks += int(fields[4]) + int(fields[5])
        except (OSError, ValueError, IndexError):
            return 0.0
        return ticks / os.sysconf("SC_CLK_TCK")

    def ask(self) -> bool:
        now = time.monotonic()
        if now - self._at >= self.window_s:
            idle = self._sample()
            self.spare = (idle - self._last) / (now - self._at) >= self.need
            self._last, self._at = idle, now
        return self.spare


def autogroup_nice(pid: int | str = "self") -> int | None:
    """The nice of a process's autogroup, or None without autogroups. With them
    (``/proc/sys/kernel/sched_autogroup_enabled``), every session is a scheduling
    group weighed against other sessions by this nice alone: a process's own nice
    only orders it within its session."""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text().split()
        if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() != "1":
            return None
        return int(text[text.index("nice") + 1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(nice: int, pid: int | str = "self") -> None:
    """Set the nice of a process's autogroup (its whole session); OSError if refused
    (below the current value needs root or CAP_SYS_NICE)."""
    Path(f"/proc/{pid}/autogroup").write_text(str(nice))


#: NETLINK_KOBJECT_UEVENT, and its multicast group of the kernel's own events (udev
#: re-sends them, rewritten, on group 2)
_NETLINK_KOBJECT_UEVENT = 15
_KERNEL_GROUP = 1
_CPU_DEVPATH = b"/devices/system/cpu/cpu"


class CpuHotplugWatch:
    """The CPUs the kernel took offline or brought online since the last look, from
    its uevents (``offline@/devices/system/cpu/cpu1``), which queue on a socket
    between looks: a CPU offline and back between two looks of /sys's online list
    looks as if nothing happened, though every perf event it had is gone.

    Unprivileged and cheap (a non-blocking socket: one recv a look when nothing
    happened). Where the socket cannot be had (another network namespace gets no
    uevents: a container), :attr:`available` is False and callers read the online
    list every look, as before. A message not from the kernel (only it may send on
    this group) is ignored.
    """

    def __init__(self) -> None:
        import socket

        self._sock: socket.socket | None = None
        try:
            sock = socket.socket(
                socket.AF_NETLINK,
                socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                _NETLINK_KOBJECT_UEVENT,
            )
        except (OSError, AttributeError):
            return
        try:
            sock.bind((0, _KERNEL_GROUP))
        except OSError:
            sock.close()
            return
        self._sock = sock

    @property
    def available(self) -> bool:
        return self._sock is not None

    def fileno(self) -> int | None:
        """The socket's descriptor, readable when an event (any device's) waits."""
        return self._sock.fileno() if self._sock is not None else None

    def take(self) -> tuple[set[int], set[int], bool]:
        """``(went_offline, came_online, overflowed)`` since the last call;
        ``overflowed``: the socket's queue ran over (a storm of other devices' events)
        and some events are lost, so any CPU may have gone and come back."""
        offline: set[int] = set()
        online: set[int] = set()
        if self._sock is None:
            return offline, online, False
        while True:
            try:
                data, (sender, _groups) = self._sock.recvfrom(16384)
            except BlockingIOError:
                return offline, online, False
            except OSError:  # ENOBUFS: the queue ran over; the socket goes on
                self._drain()
                return offline, online, True
            if sender != 0:
                continue
            head = data.split(b"\0", 1)[0]
            action, _, path = head.partition(b"@")
            number = path[len(_CPU_DEVPATH) :] if path.startswith(_CPU_DEVPATH) else b""
            if not number.isdigit():
                continue
            if action == b"offline":
                offline.add(int(number))
            elif action == b"online":
                online.add(int(number))

    def _drain(self) -> None:
        assert self._sock is not None
        while True:
            try:
                self._sock.recv(16384)
            except BlockingIOError:
                return
            except OSError as err:
                if err.errno != errno.ENOBUFS:  # it overflowed again meanwhile
                    return

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
