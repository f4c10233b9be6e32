"""Run a duet suite: trials of A and B at the same time, A and B alone, and
sync-duets with a barrier per iteration.

Each side is a process in its own process group (a container's ``exec`` when
the side names an image), created held at a gate; both gates open together, so
A and B start within microseconds of each other (the original tool started
them one after the other). A timeout stops the whole group of each side and
keeps what they wrote; a side that fails is recorded and the suite goes on.

What a suite leaves in its folder (``<outdir>/<suite>/``)::

    duet-run.json        the plan, every trial's record, the artifacts
    artifacts/<name>     uname, lscpu, meminfo, hostname, date, and the config's
    results/<suite>.<duet>.<runid>.<type>.<order>.<pair>.<file>
    logs/<trial>.<pair>.stdout|stderr
    collections/         with --collect: one kernmlops collection per trial

File names are the original asynchronous-duet tool's: ``<suite>`` is the
duet's own ``suite:`` (else the config's), ``<type>`` is duet, syncduet or
seqn, ``<order>`` AB, BA or None. With ``layout="original"`` the result files
sit in the suite folder itself, beside ``artifacts/``, as the original writes
them, so its ``process.py parse <folder>`` reads the folder.

Sync-duet trials: a side with ``syncduet_run_base`` gets ``$$`` in it
replaced by one barrier name shared by both sides, and the runner creates that
barrier (kernmlops.duet.barrier) before releasing them; a side without it
runs in the built-in harness, synchronized through the runner's FIFOs. Both
live where other users cannot plant a file or link first: the barrier under
an unpredictable name created O_EXCL|O_NOFOLLOW, the FIFOs in a folder of the
runner's own made by mkdtemp (0700), removed after the trial.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import select
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kernmlops import __version__
from kernmlops.benchmarks.base import Launch
from kernmlops.collect.gated import GatedProcess, exit_status
from kernmlops.duet.config import Duet, DuetSuite, Side
from kernmlops.duet.harness import SYNC_ENV
from kernmlops.errors import BenchmarkError, KernmlopsError, why_not_written
from kernmlops.fileio import write_atomic
from kernmlops.host.cpus import autogroup_nice, format_cpu_list, set_autogroup_nice
from kernmlops.host.environment import CpuLimit

INDEX = "duet-run.json"
#: a run's index holds a record per trial (~2 KiB): 64 MiB is ~30,000 trials
INDEX_MAX_BYTES = 64 << 20
KINDS = ("duet", "syncduet", "sequential")
#: the kind as the original tool names it in result files
FILE_KIND = {"duet": "duet", "syncduet": "syncduet", "sequential": "seqn"}
LAYOUTS = ("kernmlops", "original")
_SHELL_CHARS = re.compile(r"[|&;<>()$`\\\"'*?\[\]~{}!#=\n]")


class DuetError(KernmlopsError):
    """A duet suite cannot run (engine missing, output folder in the way, ...)."""


# --- plan -----------------------------------------------------------------------
@dataclass(frozen=True)
class Trial:
    """One item of the plan: a duet run, a sync-duet run, or one side alone."""

    duet: str
    kind: str  # duet | syncduet | sequential
    runid: int
    order: str | None  # AB | BA (which side is released first, gets the first CPUs)
    pair: str | None = None  # sequential only: the side that runs

    @property
    def pairs(self) -> tuple[str, ...]:
        if self.pair:
            return (self.pair,)
        return ("A", "B") if self.order != "BA" else ("B", "A")

    def label(self, suite: str) -> str:
        """``<suite>.<duet>.<runid>.<type>.<order>``: the original's file-name prefix."""
        kind = FILE_KIND[self.kind]
        return ".".join(
            [sanitize(suite), sanitize(self.duet), str(self.runid), kind, self.order or "None"]
        )

    def barrier_name(self) -> str:
        """A sync-duet barrier name for both sides: new at each call, with random
        bits no other user can guess (the barrier lives in the shared /dev/shm)."""
        from kernmlops.duet.barrier import new_name

        return new_name(f"syncduet.{sanitize(self.duet)}.{self.runid}")


def sanitize(name: str) -> str:
    """A name as it appears in result file names (dots separate fields there)."""
    return re.sub(r"[^A-Za-z0-9_+-]", "_", name)


def plan_trials(suite: DuetSuite, seed: int | None = None) -> list[Trial]:
    """Every trial of the suite, in the order they run.

    Duet and sync-duet runs alternate AB and BA; sequential runs run A then B
    for even run ids and B then A for odd ones. ``randomized_interleaving_trials``
    shuffles the whole plan with ``seed`` (the same seed, the same order).
    """
    plan: list[Trial] = []
    for duet in suite.duets:
        for i in range(duet.duet_repetitions):
            plan.append(Trial(duet.name, "duet", i, "AB" if i % 2 == 0 else "BA"))
        for i in range(duet.syncduet_repetitions):
            plan.append(Trial(duet.name, "syncduet", i, "AB" if i % 2 == 0 else "BA"))
        for i in range(duet.sequential_repetitions):
            first, second = ("A", "B") if i % 2 == 0 else ("B", "A")
            plan.append(Trial(duet.name, "sequential", i, None, first))
            plan.append(Trial(duet.name, "sequential", i, None, second))
    if suite.schedule == "randomized_interleaving_trials":
        random.Random(seed).shuffle(plan)
    return plan


# --- artifacts ------------------------------------------------------------------
def _lscpu() -> str:
    exe = shutil.which("lscpu")
    if exe is None:
        raise OSError("lscpu not installed (util-linux)")
    return subprocess.run([exe], capture_output=True, text=True, timeout=30, check=True).stdout


_BUILTIN: dict[str, tuple[str, Callable[[], str]]] = {
    "uname": ("uname -a", lambda: " ".join(os.uname()) + "\n"),
    "lscpu": ("lscpu", _lscpu),
    "meminfo": ("cat /proc/meminfo", lambda: Path("/proc/meminfo").read_text()),
    "hostname": ("hostname", lambda: socket.gethostname() + "\n"),
    "date": ("date", lambda: datetime.now(UTC).astimezone().isoformat() + "\n"),
}


def capture_artifacts(commands: dict[str, str], folder: Path) -> dict[str, dict[str, Any]]:
    """The built-in artifacts and the config's commands, each in ``folder/<name>``."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, dict[str, Any]] = {}
    for name, (command, read) in _BUILTIN.items():
        if name in commands:
            continue  # the config's own command wins
        entry: dict[str, Any] = {"command": command, "file": f"artifacts/{name}", "error": None}
        try:
            (folder / name).write_text(read())
        except (OSError, subprocess.SubprocessError) as err:
            entry["error"] = str(err)
            entry["file"] = None
        out[name] = entry
    for name, command in commands.items():
        entry = {"command": command, "file": f"artifacts/{name}", "error": None}
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", command], capture_output=True, text=True, timeout=60
            )
            (folder / name).write_text(proc.stdout)
            if proc.returncode != 0:
                entry["error"] = f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
        except subprocess.TimeoutExpired:
            entry["error"] = "did not finish in 60 s"
        out[name] = entry
    return out


# --- container engine -----------------------------------------------------------
def check_engine(engine: str, images: set[str]) -> None:
    """Raise DuetError unless ``engine`` runs and has every image."""
    exe = shutil.which(engine)
    if exe is None:
        raise DuetError(
            f"container engine {engine!r} not found, but the config names image(s) "
            f"{', '.join(sorted(images))}: install {engine} or drop the image keys"
        )
    try:
        info = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise DuetError(f"`{engine} info` did not answer in 30 s: is its daemon hung?") from None
    if info.returncode != 0:
        lines = [ln for ln in (info.stderr or info.stdout).splitlines() if ln.strip()]
        why = lines[-1].strip() if lines else f"exit {info.returncode}"
        raise DuetError(
            f"{engine} is installed but cannot run containers: {why}"
            + (f" (start it: systemctl start {engine})" if "daemon" in why else "")
        )
    for image in sorted(images):
        found = subprocess.run(
            [exe, "image", "inspect", image], capture_output=True, text=True, timeout=30
        )
        if found.returncode != 0:
            raise DuetError(f"image {image!r} not found by {engine} (`{engine} pull {image}`)")


# --- one trial ------------------------------------------------------------------
@dataclass
class SideRecord:
    pair: str
    command: str
    image: str | None
    cpus: list[int] | None = None
    pid: int | None = None
    container: str | None = None
    status: str = "not-started"  # ok | failed | timeout | error | not-started
    exit_code: int | None = None
    error: str | None = None
    release_ns: int | None = None  # CLOCK_MONOTONIC when the gate opened
    release_epoch_ms: int | None = None
    end_ns: int | None = None
    results: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    stdout: str | None = None
    stderr: str | None = None


@dataclass
class TrialRecord:
    label: str
    suite: str
    benchmark: str
    kind: str
    runid: int
    order: str | None
    aa: bool
    timeout_s: float | None
    started_at: str
    timed_out: bool = False
    #: sync-duet only: how the sides were synchronized ("barrier <name>", "harness")
    sync: str | None = None
    #: seconds between the sides' CPU-list trades (None: each kept its list), and how many
    cpu_swap_s: float | None = None
    cpu_swaps: int = 0
    warnings: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    sides: dict[str, SideRecord] = field(default_factory=dict)
    collection: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(s.status == "ok" for s in self.sides.values())

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        sides = {k: SideRecord(**v) for k, v in data.get("sides", {}).items()}
        return cls(**{**data, "sides": sides})


def side_command(side: Side, kind: str, barrier: str | None = None) -> str:
    """The command a side runs in a trial of ``kind``; in sync-duet trials its
    ``syncduet_run_base`` with ``$$`` replaced by the barrier's name (before any
    shell sees it: ``$$`` would be each shell's own PID)."""
    if kind == "syncduet" and side.sync_command:
        return side.sync_command.replace("$$", barrier or "")
    return side.command


def _argv(side: Side, kind: str, barrier: str | None = None) -> list[str]:
    """The side's command line for a trial kind."""
    command = side_command(side, kind, barrier)
    if side.harness is not None and not (kind == "syncduet" and side.sync_command):
        inner = shlex.split(command) if not _SHELL_CHARS.search(command) else None
        inner = inner or ["/bin/sh", "-c", command]
        h = side.harness
        argv = [sys.executable, "-m", "kernmlops.duet.harness", "--output", h.output]
        if h.iterations is not None:
            argv += ["--iterations", str(h.iterations)]
        if h.budget_s is not None:
            argv += ["--budget", repr(h.budget_s)]
        return [*argv, "--", *inner]
    return ["/bin/sh", "-c", command]


class _Running:
    """One side of a trial while it runs (local process or container exec)."""

    def __init__(
        self, rec: SideRecord, side: Side, trial: Trial, duet: Duet, suite: DuetSuite,
        work: Path, log_base: Path, sync_dir: Path | None, cpus: frozenset[int] | None,
        barrier: str | None = None, limit: CpuLimit | None = None,
    ) -> None:  # fmt: skip
        self.rec = rec
        self.side = side
        self.engine = suite.engine
        self.work = work
        self.sync_dir = sync_dir
        self.proc: GatedProcess | None = None
        self.stopped = False  # stopped by the runner (timeout), not ended by itself
        work.mkdir(parents=True, exist_ok=True)
        env = {
            "KERNMLOPS_DUET_SUITE": duet.suite,
            "KERNMLOPS_DUET_BENCHMARK": duet.name,
            "KERNMLOPS_DUET_KIND": trial.kind,
            "KERNMLOPS_DUET_RUNID": str(trial.runid),
            "KERNMLOPS_DUET_PAIR": side.pair,
            "KERNMLOPS_DUET_OUT": str(work),
            **side.env,
        }
        if sync_dir is not None:
            env[SYNC_ENV] = str(sync_dir)
        argv = _argv(side, trial.kind, barrier)
        if side.image:
            self.container = f"kmo-duet-{os.getpid()}-{sanitize(rec.pair)}-{time.monotonic_ns()}"
            rec.container = self.container
            run = [self.engine, "run", "-d", "-i", "--name", self.container,
                   "--entrypoint", "/bin/sh"]  # fmt: skip
            if cpus:
                run += ["--cpuset-cpus", ",".join(map(str, sorted(cpus)))]
            if sync_dir is not None:
                run += ["-v", f"{sync_dir}:{sync_dir}"]
            if barrier is not None:  # the barrier lives in the host's /dev/shm
                run += ["-v", "/dev/shm:/dev/shm", "--ipc", "host"]
            _engine([*run, side.image], "start the container")
            exports = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
            argv = [self.engine, "exec", *exports, self.container, *argv]
            env = {}
        else:
            self.container = None
        with (
            Path(f"{log_base}.{rec.pair}.stdout").open("wb") as stdout,
            Path(f"{log_base}.{rec.pair}.stderr").open("wb") as stderr,
        ):  # the child keeps its own copies
            self.proc = GatedProcess(Launch(argv, env, str(work)), stdout, stderr)
        rec.pid = self.proc.pid
        if duet.nice is not None and not side.image:
            try:  # the gate is held: the command and its children inherit it
                os.setpriority(os.PRIO_PROCESS, self.proc.pid, duet.nice)
                # Each side is a session of its own, so with autogroups (the
                # default on desktop kernels) it is a scheduling group of its own,
                # weighed against other sessions by the group's nice alone.
                if autogroup_nice(self.proc.pid) is not None:
                    set_autogroup_nice(duet.nice, self.proc.pid)
            except OSError as err:
                self.proc.stop(grace_s=0)
                raise BenchmarkError(
                    f"nice: cannot set {duet.nice} for side {side.pair}: {err.strerror}"
                    + (" (a negative nice needs root)" if duet.nice < 0 else "")
                ) from None
        if limit is not None:  # its own cpuset (the gate is held: all it starts is in it)
            limit.add(self.proc.pid)
            rec.cpus = sorted(cpus or limit.cpus)
        elif cpus and not side.image:
            # The gate shell is pinned before it execs: the command and its
            # children inherit the affinity.
            os.sched_setaffinity(self.proc.pid, cpus)
            rec.cpus = sorted(cpus)
        elif cpus:
            rec.cpus = sorted(cpus)

    def release(self) -> None:
        assert self.proc is not None
        self.rec.release_epoch_ms = time.time_ns() // 1_000_000
        self.proc.release()
        self.rec.release_ns = self.proc.started_ns

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else 0

    def stop(self) -> None:
        self.stopped = True
        if self.container:
            with contextlib.suppress(BenchmarkError):
                _engine([self.engine, "kill", self.container], "stop the container", check=False)
        if self.proc is not None:
            self.proc.stop(grace_s=2.0)

    def finish(self, timeout_s: float | None) -> None:
        rec = self.rec
        if self.proc is None:
            return
        if self.proc.poll() is None:  # an error or Ctrl+C in the runner: stop it too
            self.proc.stop(grace_s=2.0)
        self.proc.reap_group()
        rec.end_ns = self.proc.ended_ns
        code = self.proc.returncode
        rec.exit_code = exit_status(code) if code is not None else None
        if rec.release_ns is None:  # held at the gate, never released
            rec.status = "not-started"
            rec.error = "not started: the other side could not start"
        elif self.stopped:
            rec.status = "timeout"
            rec.error = f"stopped after the {timeout_s:g} s timeout"
        elif rec.exit_code == 0:
            rec.status = "ok"
        else:
            rec.status = "failed"
            rec.error = f"exit status {rec.exit_code}"

    def collect(self, dest: Path, prefix: str, rel: str) -> None:
        """Copy the side's result files to ``dest`` (``rel``: its name in the suite's
        folder). A file it did not leave is named in ``missing`` as the user knows it:
        relative to the side's working folder, which is removed after the trial (the
        runner reaches it through /proc/<pid>/fd/<n>, a name of no use to anyone). A
        side that ended ok but left none of its declared files (or only empty ones)
        has failed: nothing of it can be measured."""
        for name in self.side.results:
            target = dest / f"{prefix}.{self.side.pair}.{os.path.basename(name.rstrip('/'))}"
            kept = f"{rel}{target.name}"
            if target.exists():
                shutil.rmtree(target) if target.is_dir() else target.unlink()
            if self.container:
                proc = subprocess.run(
                    [self.engine, "cp", f"{self.container}:{name}", str(target)],
                    capture_output=True, text=True, timeout=300,
                )  # fmt: skip
                if proc.returncode != 0:
                    why = proc.stderr.strip() or f"exit {proc.returncode}"
                    self.rec.missing[name] = f"not copied from container {self.container}: {why}"
                    continue
            else:
                src = Path(name) if os.path.isabs(name) else self.work / name
                if not src.exists():
                    self.rec.missing[name] = (
                        f"no such file {name}" if os.path.isabs(name) else left_no(name)
                    )
                    continue
                try:
                    if src.is_dir():  # a link in it is copied as a link, never its target
                        shutil.copytree(src, target, symlinks=True, copy_function=_copy_plain)
                    else:
                        _copy_plain(src, target)
                except (OSError, shutil.Error, KernmlopsError) as err:
                    part = f" (a part is kept as {kept})" if target.exists() else ""
                    self.rec.missing[name] = f"copying it to {kept} failed{part}: {_why(err)}"
                    continue
            if target.is_file() and not target.is_symlink() and target.stat().st_size == 0:
                # an empty file holds no iteration: as good as none (duet process
                # would only warn about it later, the trial counted ok)
                target.unlink()
                self.rec.missing[name] = f"the side left {name} empty"
                continue
            self.rec.results.append(kept)
        if self.side.results and not self.rec.results and self.rec.status == "ok":
            self.rec.status = "failed"
            self.rec.error = none_left(self.rec.missing)

    def cleanup(self, remove: bool) -> None:
        if self.container:
            cmd = "rm" if remove else "stop"
            args = [self.engine, cmd, *(["-f"] if remove else []), self.container]
            _engine(args, f"{cmd} the container", check=False)


def _copy_plain(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> str:
    """``shutil.copy2`` of a plain file, from one descriptor: copy2 looks at ``src`` by
    name, then opens that name again, so a FIFO put there in between would keep the
    runner waiting for a writer for ever. A result may be named anywhere (an absolute
    path in a folder other users can change): it is opened as root reads what a user
    may have planted (kernmlops.host.pinned.open_named), so a link of theirs to a
    file of root's is not copied into the suite's folder. OSError (EINVAL) for what
    is not a plain file, ELOOP for a link not followed."""
    from kernmlops.host.pinned import create_new, open_named

    fd = open_named(Path(src), what="the result's folder")
    with open(fd, "rb") as f, open(create_new(Path(dst)), "wb") as out:
        shutil.copyfileobj(f, out)
        st = os.fstat(fd)
        os.fchmod(out.fileno(), st.st_mode & 0o777)  # never a set-id bit on root's copy
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    return os.fspath(dst)


def left_no(name: str) -> str:
    """Why result file ``name`` (relative to the side's working folder) is missing."""
    return f"the side left no {name} in its working folder"


def none_left(missing: dict[str, str]) -> str:
    """The error of a side that ended ok but left none of its result files."""
    head = "exit status 0, but it left none of its result files: "
    if all(why == left_no(name) for name, why in missing.items()):
        return head + f"no {', '.join(missing)} in its working folder"
    return head + "; ".join(f"{name}: {why}" for name, why in missing.items())


def _why(err: BaseException) -> str:
    """An OSError's reason without the paths it names (the runner's, not the user's)."""
    if isinstance(err, KernmlopsError):  # a refused folder: its message says which
        return str(err)
    if getattr(err, "errno", None) == errno.ELOOP:
        return "a link root does not follow (another user's, or in a folder others can change)"
    return getattr(err, "strerror", None) or type(err).__name__


def _engine(argv: list[str], what: str, check: bool = True) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise BenchmarkError(f"cannot {what}: {proc.stderr.strip() or proc.returncode}")


class _CpuSwap:
    """Two sides, each in a cpuset of its own, trading CPU lists every ``period_s``.

    A CPU that is slower for a while (another task queued on it, the host
    running something on that vCPU) then slows both sides alike, and the
    pairs of iterations see the same machine. Pinning alone gives that CPU to
    one side for a whole trial; AB/BA orders then cancel it only on average
    over runs, at the price of a wider interval (`python -m bench duet`).
    """

    def __init__(self, cpus: tuple[frozenset[int], frozenset[int]], period_s: float) -> None:
        self.cpus = cpus
        self.period_s = period_s
        self.limits = [CpuLimit(sorted(c)) for c in cpus]
        self.swapped = False
        self.swaps = 0
        self.next_at: float | None = None
        self._policy: tuple[int, os.sched_param] | None = None

    @property
    def ok(self) -> bool:
        return all(limit.own_cpuset for limit in self.limits)

    def start(self) -> None:
        self.next_at = time.monotonic() + self.period_s
        # The sides may outweigh the runner (nice -10 in sessions of their own):
        # a runner left waiting trades late. As root it waits for the next trade
        # as a real-time thread (it runs ~20 us per trade), until the trial ends.
        try:
            self._policy = (os.sched_getscheduler(0), os.sched_getparam(0))
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError:  # not root: it trades at the runner's own priority
            self._policy = None

    def _restore(self) -> None:
        if self._policy is not None:
            policy, param = self._policy
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, policy, param)
            self._policy = None

    def wait_s(self, poll_s: float) -> float:
        """How long the runner may sleep before the next trade is due."""
        if self.next_at is None:
            return poll_s
        return max(0.0, min(poll_s, self.next_at - time.monotonic()))

    def step(self) -> None:
        if self.next_at is None or time.monotonic() < self.next_at:
            return
        self.swapped = not self.swapped
        lists = (self.cpus[1], self.cpus[0]) if self.swapped else self.cpus
        # The side moved first shares the other's CPU until the second write
        # (microseconds): each side goes first every other trade.
        for slot in (0, 1) if self.swaps % 2 == 0 else (1, 0):
            self.limits[slot].move(lists[slot])
        self.swaps += 1
        # a late runner does not trade twice in a row to catch up
        self.next_at = max(self.next_at + self.period_s, time.monotonic() + self.period_s / 2)

    def close(self) -> None:
        self._restore()
        for limit in self.limits:
            limit.close()


class _SyncBarrier:
    """The runner's end of the sync-duet protocol (see kernmlops.duet.harness)."""

    def __init__(self, folders: dict[str, Path]) -> None:
        self.ready: dict[str, int] = {}
        self.go: dict[str, int] = {}
        self.buf: dict[str, bytes] = {}
        self.waiting: set[str] = set()
        self.iterations = 0
        # The folders are new and private (see _sync_folders): a FIFO that is
        # already there, or a link, is an error, never opened.
        nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
        for pair, folder in folders.items():
            for name in ("ready", "go"):
                os.mkfifo(folder / name, 0o600)
            # Read-write opens never block and never see EOF: the side's own
            # opens (write ready, read go) then never block either.
            self.ready[pair] = os.open(folder / "ready", os.O_RDWR | os.O_NONBLOCK | nofollow)
            self.go[pair] = os.open(folder / "go", os.O_RDWR | nofollow)
            self.buf[pair] = b""

    def step(self, alive: dict[str, bool], wait_s: float) -> None:
        fds = {fd: p for p, fd in self.ready.items()}
        readable, _, _ = select.select(list(fds), [], [], wait_s)
        for fd in readable:
            pair = fds[fd]
            with contextlib.suppress(BlockingIOError):
                self.buf[pair] += os.read(fd, 4096)
            while b"\n" in self.buf[pair]:
                line, self.buf[pair] = self.buf[pair].split(b"\n", 1)
                if line.startswith(b"ready"):
                    self.waiting.add(pair)
        live = {p for p, a in alive.items() if a}
        if self.waiting and self.waiting >= live and len(live) == len(self.ready):
            for pair in self.waiting:
                os.write(self.go[pair], b"go\n")
            self.iterations += 1
            self.waiting.clear()
        elif self.waiting and len(live) < len(self.ready):
            for pair in self.waiting:  # the other side has ended: so does this one
                os.write(self.go[pair], b"stop\n")
            self.waiting.clear()

    def close(self) -> None:
        for fd in (*self.ready.values(), *self.go.values()):
            with contextlib.suppress(OSError):
                os.close(fd)


def _sync_folders(pairs: tuple[str, ...]) -> tuple[Path, dict[str, Path]]:
    """A private folder (mkdtemp: 0700, a random name, in the sticky temp folder)
    with one sub-folder per side for its FIFOs: no other user can plant a file
    or link in it, or rename it away."""
    root = Path(tempfile.mkdtemp(prefix="kernmlops-duet-sync-"))
    folders = {p: root / p for p in pairs}
    for folder in folders.values():
        folder.mkdir(mode=0o700)
    return root, folders


def run_trial(
    trial: Trial,
    suite: DuetSuite,
    outdir: Path,
    *,
    poll_s: float = 0.02,
    layout: str = "kernmlops",
) -> TrialRecord:
    """Run one trial; never raises for a side that fails (it is recorded)."""
    duet = next(d for d in suite.duets if d.name == trial.duet)
    label = trial.label(duet.suite)
    rec = TrialRecord(
        label=label,
        suite=duet.suite,
        benchmark=duet.name,
        kind=trial.kind,
        runid=trial.runid,
        order=trial.order,
        aa=duet.aa,
        timeout_s=duet.timeout_s,
        started_at=datetime.now(UTC).isoformat(),
    )
    work = outdir / "work" / (label + (f".{trial.pair}" if trial.pair else ""))
    logs = outdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results, rel = (outdir, "") if layout == "original" else (outdir / "results", "results/")
    results.mkdir(parents=True, exist_ok=True)
    running: dict[str, _Running] = {}
    barrier: _SyncBarrier | None = None
    swapper: _CpuSwap | None = None
    shm_name: str | None = None
    shm_made = False  # only the barrier this trial created is removed
    sync_root: Path | None = None
    broken: str | None = None
    t0 = time.monotonic()
    try:
        sync_dirs: dict[str, Path] = {}
        if trial.kind == "syncduet":
            sync_root, sync_dirs = _sync_folders(trial.pairs)
            barrier = _SyncBarrier(sync_dirs)
            sides = [duet.side(p) for p in trial.pairs]
            speaks = [s for s in sides if s.sync_command and "$$" in s.sync_command]
            if speaks:
                shm_name = trial.barrier_name()
                from kernmlops.duet.barrier import make_barrier

                try:
                    make_barrier(shm_name, 2)
                    shm_made = True
                except OSError as err:  # nothing starts; the trial is recorded as failed
                    broken = f"cannot create the sync barrier {shm_name}: {err}"
                rec.sync = f"barrier {shm_name}"
            elif all(s.harness and not s.sync_command for s in sides):
                rec.sync = "harness"
            for s in sides:
                if s.sync_command and "$$" not in s.sync_command:
                    rec.warnings.append(
                        f"{s.pair}: syncduet_run_base has no $$ (the barrier's name): "
                        "this side is not synchronized"
                    )
                elif speaks and not (s.sync_command and "$$" in s.sync_command):
                    rec.warnings.append(
                        f"{s.pair}: the other side waits on barrier {shm_name} and this one "
                        "does not (give it a syncduet_run_base with $$)"
                    )
        cpu_lists = duet.cpus
        if duet.cpus_auto and (
            trial.kind == "sequential" or any(duet.side(p).image for p in trial.pairs)
        ):
            cpu_lists = None  # auto pins duets only: alone, a side has the whole machine
        if (
            cpu_lists
            and duet.cpu_swap_s
            and trial.kind != "sequential"
            and not any(duet.side(p).image for p in trial.pairs)
        ):
            swapper = _CpuSwap(duet.cpus, duet.cpu_swap_s)
            if swapper.ok:
                rec.cpu_swap_s = duet.cpu_swap_s
            elif duet.cpus_auto:  # not pinned, as run_suite decides (see resolve_auto_cpus)
                swapper.close()
                swapper, cpu_lists = None, None
            else:
                swapper.close()
                swapper = None
                rec.warnings.append(
                    "cpu_swap_ms: no cpuset cgroup could be made (it needs root and a "
                    "cgroup v1 cpuset hierarchy): each side kept its CPUs for the whole trial"
                )
        for slot, pair in enumerate(trial.pairs):
            side = duet.side(pair)
            if broken:
                rec.sides[pair] = SideRecord(pair, side_command(side, trial.kind, shm_name),
                                             side.image, status="error", error=broken)  # fmt: skip
                continue
            srec = SideRecord(
                pair=pair, command=side_command(side, trial.kind, shm_name), image=side.image
            )
            rec.sides[pair] = srec
            cpus = cpu_lists[slot] if cpu_lists else None
            srec.stdout = f"logs/{label}.{pair}.stdout"
            srec.stderr = f"logs/{label}.{pair}.stderr"
            try:
                running[pair] = _Running(
                    srec, side, trial, duet, suite, work / pair, logs / label, sync_dirs.get(pair),
                    cpus, shm_name, swapper.limits[slot] if swapper else None,
                )  # fmt: skip
            except (BenchmarkError, OSError) as err:
                srec.status = "error"
                srec.error = str(err)
                break
        if len(running) == len(trial.pairs):
            for r in running.values():  # both gates open back to back
                r.release()
            if swapper is not None:
                swapper.start()
            deadline = t0 + duet.timeout_s if duet.timeout_s else None
            while True:
                alive = {p: r.poll() is None for p, r in running.items()}
                if not any(alive.values()):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    rec.timed_out = True
                    for p, r in running.items():
                        if alive[p]:
                            r.stop()
                    break
                wait_s = swapper.wait_s(poll_s) if swapper is not None else poll_s
                if barrier is not None:
                    barrier.step(alive, wait_s)
                else:
                    time.sleep(wait_s)
                if swapper is not None:
                    swapper.step()
    finally:
        for r in running.values():
            try:
                r.finish(duet.timeout_s)
            except Exception as err:  # recorded; the next trial still runs
                r.rec.status, r.rec.error = "error", f"stopping failed: {err}"
        if barrier is not None:
            barrier.close()
        if swapper is not None:
            rec.cpu_swaps = swapper.swaps
            swapper.close()  # the sides are reaped: their cpusets are empty
        if shm_made and shm_name is not None:
            from kernmlops.duet.barrier import remove_barrier

            remove_barrier(shm_name)
        if sync_root is not None:
            shutil.rmtree(sync_root, ignore_errors=True)
        for r in running.values():
            try:
                r.collect(results, label, rel)
            except (OSError, subprocess.SubprocessError) as err:
                r.rec.missing["*"] = f"collecting results failed: {_why(err)}"
            r.cleanup(duet.remove_containers)
        rec.duration_s = round(time.monotonic() - t0, 6)
        shutil.rmtree(work, ignore_errors=True)
    return rec


# --- a suite --------------------------------------------------------------------
@dataclass
class SuiteResult:
    suite: str
    folder: Path
    trials: list[TrialRecord]

    @property
    def failed(self) -> list[TrialRecord]:
        return [t for t in self.trials if not t.ok]


def cpusets_available() -> bool:
    """Whether this runner can make cpusets of its own (for trading CPUs)."""
    probe = CpuLimit(sorted(os.sched_getaffinity(0)))
    try:
        return probe.own_cpuset
    finally:
        probe.close()


def resolve_auto_cpus(suite: DuetSuite) -> tuple[DuetSuite, str | None]:
    """The suite as it will run, and a line saying where ``cpus: auto`` put the sides.
    ``cpus: auto`` duets unpinned where no cpuset can be made: pinning without
    trading was the worst setup measured (`python -m bench duet`)."""
    auto = [d for d in suite.duets if d.cpus_auto]
    if not auto:
        return suite, None
    if cpusets_available():
        assert auto[0].cpus is not None
        a, b = (format_cpu_list(sorted(c)) for c in auto[0].cpus)
        return suite, f"auto: duet trials on CPUs {a} and {b}, traded every few ms"
    duets = tuple(
        replace(d, cpus=None, cpu_swap_s=None, cpus_auto=False) if d.cpus_auto else d
        for d in suite.duets
    )
    note = (
        "auto: not pinned (no cpuset cgroup could be made to trade the sides' CPUs: "
        "that needs root and a cgroup v1 cpuset hierarchy)"
    )
    return replace(suite, duets=duets), note


def suite_folder(outdir: Path, suite: DuetSuite) -> Path:
    return Path(outdir) / sanitize(suite.suite)


def prepare_folder(folder: Path, force: bool) -> None:
    """The suite's folder cleared away to be made new (:func:`run_suite` makes it and
    holds it): root writes in it as it pleases, so under sudo it must be no folder (nor
    link) its user made, where they could plant a link."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise DuetError(f"{folder} is a link or a file, not a folder: not written through")
    if folder.exists() and not any(folder.iterdir()):
        folder.rmdir()  # made again below: root's until handed over
    if folder.exists() and any(folder.iterdir()):
        if not force:
            raise DuetError(f"{folder} exists and is not empty: use --force to replace it")
        if not (folder / INDEX).exists():
            raise DuetError(
                f"{folder} exists and holds no {INDEX}: not replacing a folder that "
                "is not a duet run's, even with --force"
            )
        shutil.rmtree(folder)


def write_index(folder: Path, index: dict[str, Any], shown: Path | None = None) -> None:
    """The suite's duet-run.json; DuetError, one line naming it as ``shown`` (the
    folder's name, where ``folder`` is its /proc/self/fd path), when it cannot be
    written (a full disk)."""
    try:
        write_atomic(folder / INDEX, json.dumps(index, indent=1, default=str))
    except OSError as err:
        where = (shown or folder) / INDEX
        raise DuetError(f"cannot write {where}: {why_not_written(err, where)}") from None


def run_suite(
    suite: DuetSuite,
    outdir: Path,
    *,
    force: bool = False,
    collect: Any = None,
    on_trial: Callable[[int, int, Trial, TrialRecord | None], None] | None = None,
    layout: str = "kernmlops",
) -> SuiteResult:
    """Run every trial of ``suite`` into ``<outdir>/<suite>/``.

    ``collect`` (a kernmlops.duet.collect.Collector) runs each trial under a
    kernel collection; None runs them directly. ``layout="original"`` puts the
    result files in the suite folder itself, as the original tool does.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    images = {s.image for d in suite.duets for s in (d.a, d.b) if s.image}
    if images:
        check_engine(suite.engine, images)
    suite, cpu_note = resolve_auto_cpus(suite)
    named = suite_folder(outdir, suite)
    prepare_folder(named, force)
    from kernmlops.host.invoker import invoker
    from kernmlops.host.pinned import pin

    who = invoker()
    # made new and held open: everything of the suite (the index, logs, the trials'
    # collections) is written through the descriptor, never by the folder's name,
    # which its user can give to another folder (a rename, a link) mid-run. As
    # /proc/<pid>/fd/N: the trial processes and the collector's pin reach it too
    held = pin(named, create=True, fresh=True, invoker_uid=who.uid if who else None,
               what="the suite's folder")  # fmt: skip
    try:
        return _run_held(suite, named, Path(f"/proc/{os.getpid()}/fd/{held.fd}"),
                         collect=collect, on_trial=on_trial, layout=layout,
                         images=images, cpu_note=cpu_note)  # fmt: skip
    finally:
        held.close()


def _run_held(suite: DuetSuite, named: Path, folder: Path, *, collect: Any,
              on_trial: Callable[[int, int, Trial, TrialRecord | None], None] | None,
              layout: str, images: set[str], cpu_note: str | None) -> SuiteResult:  # fmt: skip
    """:func:`run_suite` in the held suite folder ``folder`` (``named`` as asked)."""
    seed = suite.seed if suite.seed is not None else random.SystemRandom().randrange(2**31)
    plan = plan_trials(suite, seed)
    index: dict[str, Any] = {
        "format": "kernmlops-duet-run/1",
        "suite": suite.suite,
        "config_file": suite.source,
        "config": suite.raw,
        "seed": seed,
        "schedule": suite.schedule,
        "layout": layout,
        "engine": suite.engine if images else None,
        "kernmlops": __version__,
        "started_at": datetime.now(UTC).isoformat(),
        "finished_at": None,
        "collect": collect is not None,
        "plan": [asdict(t) for t in plan],
        "cpus": cpu_note,
        "artifacts": capture_artifacts(suite.artifacts, folder / "artifacts"),
        "trials": [],
    }
    write_index(folder, index, named)
    records: list[TrialRecord] = []
    try:
        for n, trial in enumerate(plan):
            if on_trial:
                on_trial(n, len(plan), trial, None)
            if collect is not None:
                rec = collect.run_trial(trial, suite, folder, layout=layout)
            else:
                rec = run_trial(trial, suite, folder, layout=layout)
            records.append(rec)
            index["trials"].append(rec.as_dict())
            write_index(folder, index, named)
            if on_trial:
                on_trial(n, len(plan), trial, rec)
    finally:
        index["finished_at"] = datetime.now(UTC).isoformat()
        write_index(folder, index, named)
        shutil.rmtree(folder / "work", ignore_errors=True)
    return SuiteResult(suite.suite, named, records)


def read_index(folder: Path) -> dict[str, Any]:
    """A suite folder's duet-run.json (at most INDEX_MAX_BYTES); DuetError with
    one line when it is missing, too large, a link out of the folder, or not
    a JSON object."""
    from kernmlops.confined import UnsafePathError, read_confined

    path = Path(folder) / INDEX
    try:
        doc = json.loads(read_confined(folder, INDEX, INDEX_MAX_BYTES, what=INDEX))
    except UnsafePathError as err:
        raise DuetError(str(err)) from None
    except OSError as err:
        raise DuetError(
            f"{folder}: no {INDEX} ({err.strerror}); is it a `duet run` folder?"
        ) from err
    except (ValueError, RecursionError) as err:  # also a number past 4300 digits
        raise DuetError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(doc, dict):
        raise DuetError(f"{path}: not a duet run's index (a JSON object)")
    return doc
