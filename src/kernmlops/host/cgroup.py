"""Containment of a benchmark: a cgroup v2 of its own and a watchdog.

Everything the benchmark starts stays in its cgroup, whatever it does with sessions and
process groups (``setsid``, daemons), so ``cgroup.kill`` ends all of it at once. A tiny
watchdog process, started before the benchmark and outside its cgroup, holds the read end
of a pipe that only the collector can write: if the collector dies (SIGKILL, the OOM
killer), the pipe reads end-of-file and the watchdog kills the cgroup (or, where no cgroup
v2 could be made, the benchmark's process group). A collector that finishes normally says
``done`` first, so the watchdog never signals a recycled process group.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import subprocess
import time
from pathlib import Path

__all__ = ["Containment", "cgroup2_mount", "own_cgroup", "set_oom_score_adj"]

# $1: the cgroup folder ('' for none). First line: the process group to kill; then wait
# for 'done' (normal end) or end-of-file (the collector died).
_WATCHDOG = r"""
cg=$1
read -r pg || pg=
[ "$pg" = done ] && exit 0
while read -r line; do [ "$line" = done ] && exit 0; done
[ -n "$pg" ] && kill -KILL -- "-$pg" 2>/dev/null
if [ -n "$cg" ]; then
  echo 1 > "$cg/cgroup.kill" 2>/dev/null
  i=0
  while grep -q 'populated 1' "$cg/cgroup.events" 2>/dev/null && [ $i -lt 200 ]; do
    sleep 0.05; i=$((i+1))
  done
  rmdir "$cg" 2>/dev/null
fi
exit 0
"""

_counter = itertools.count()


def cgroup2_mount() -> Path | None:
    """Where the unified (v2) hierarchy is mounted, if it is."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                pre, _, post = line.partition(" - ")
                if post.split(" ", 1)[0] == "cgroup2":
                    return Path(pre.split()[4].replace("\\040", " "))
    except OSError:
        pass
    return None


def own_cgroup(v1_controller: str | None = None) -> str | None:
    """This process's cgroup v2 path (``/`` for the root), from /proc/self/cgroup; with
    ``v1_controller`` (``memory``), its path in the v1 hierarchy of that controller."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if v1_controller is None and line.startswith("0::"):
                    return path.strip()
                if v1_controller is not None and v1_controller in controllers.split(","):
                    return path.strip()
    except (OSError, ValueError):
        pass
    return None


def set_oom_score_adj(pid: int | str, value: int) -> bool:
    """Set a process's OOM score adjustment; False where not permitted (lowering needs
    CAP_SYS_RESOURCE)."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w", encoding="ascii") as f:
            f.write(str(value))
    except OSError:
        return False
    return True


def _make_cgroup(name: str) -> tuple[Path | None, str | None]:
    """The new cgroup, or None and why not (for the manifest and the user)."""
    mount, own = cgroup2_mount(), own_cgroup()
    if mount is None or own is None:
        return None, "no cgroup v2 hierarchy is mounted"
    # The collector's own cgroup is the parent: limits set on it (a memory limit around
    # the whole collection) hold for the benchmark too. No controller is enabled in the
    # child, so the parent may keep its processes.
    path = mount / own.lstrip("/") / name
    try:
        path.mkdir()
    except OSError as err:  # not root, no delegation, read-only: a process group only
        why = f"cannot create a cgroup in {path.parent}: {err.strerror or err}"
        if err.errno in (errno.EACCES, errno.EPERM):
            # uid 0 without CAP_DAC_OVERRIDE too: the hierarchy's root is 0555
            why += "; that takes CAP_DAC_OVERRIDE or a cgroup delegated to this user"
        return None, why
    if not (path / "cgroup.kill").exists():  # before Linux 5.14
        with contextlib.suppress(OSError):
            path.rmdir()
        return None, "the kernel has no cgroup.kill (before Linux 5.14)"
    return path, None


class Containment:
    """A cgroup (where one can be made) and the watchdog for one benchmark process tree."""

    def __init__(self, label: str = "bench") -> None:
        name = f"kernmlops-{os.getpid()}-{label}-{next(_counter)}"
        made = _make_cgroup(name)
        self.path: Path | None = made[0]
        #: why the benchmark has no cgroup of its own (None: it has one)
        self.why_not: str | None = made[1]
        mount = cgroup2_mount()
        #: the cgroup's path in the hierarchy (as /proc/<pid>/cgroup shows it), kept
        #: after it is removed (for the manifest); None: a process group only
        self.cgroup = "/" + self.path.relative_to(mount).as_posix() if self.path and mount else None
        self.pgid: int | None = None
        self._watchdog: subprocess.Popen[bytes] | None = subprocess.Popen(
            ["/bin/sh", "-c", _WATCHDOG, "kernmlops-watchdog", str(self.path or "")],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl+C on the terminal must not reach it
        )
        # The last process the OOM killer should pick: it is what cleans up.
        set_oom_score_adj(self._watchdog.pid, -1000)

    def add(self, pid: int) -> None:
        """Move ``pid`` (a new process group leader, held before it forks) in."""
        if self.path is not None:
            try:
                (self.path / "cgroup.procs").write_text(f"{pid}\n")
            except OSError as err:
                self._remove()
                self.cgroup = None
                self.why_not = f"cannot move the benchmark into its cgroup: {err.strerror or err}"
        self.pgid = pid
        self._tell(f"{pid}\n")

    def pids(self) -> list[int]:
        """Processes in the cgroup (and any it made below), else in the process group."""
        if self.path is not None:
            found: list[int] = []
            for folder, _, _ in os.walk(self.path):
                with contextlib.suppress(OSError):
                    text = (Path(folder) / "cgroup.procs").read_text()
                    found += [int(p) for p in text.split()]
            return found
        return []

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process of the benchmark."""
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def kill(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL everything and wait until it is gone; True when the cgroup is empty."""
        if self.path is None:
            self.signal(signal.SIGKILL)
            return True
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1\n")
        deadline = time.monotonic() + timeout_s
        while self.populated():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def populated(self) -> bool:
        if self.path is None:
            return False
        try:
            return "populated 1" in (self.path / "cgroup.events").read_text()
        except OSError:
            return False

    def close(self) -> None:
        """Kill what is left, remove the cgroup and dismiss the watchdog (idempotent)."""
        if self.path is not None:
            self.kill()
            self._remove()
        if self._watchdog is not None:
            self._tell("done\n")
            with contextlib.suppress(OSError):
                assert self._watchdog.stdin is not None
                self._watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=5)
            self._watchdog = None

    def _remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.rmdir()
            self.path = None

    def _tell(self, line: str) -> None:
        if self._watchdog is not None and self._watchdog.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self._watchdog.stdin.write(line.encode())
                self._watchdog.stdin.flush()
