"""`kernmlops collect` with CAP_BPF and CAP_PERFMON alone, through the CLI.

Two ways a collector gets less than root: uid 0 under a bounding set of the two (a
systemd unit's CapabilityBoundingSet, setpriv, capsh), and another uid given both as
ambient capabilities. Either collects the default hooks, a command's tree and the
whole system; what root would add (a cgroup of the benchmark's own, the collector's
OOM score, the copier's real-time priority) is said once and kept in the manifest's
``privileges``; what cannot work without a capability is refused in one line before
any folder is made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from contextlib import AbstractContextManager, nullcontext
from functools import cache
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import skip_here
from tests.e2e.conftest import WORKLOADS, kernel_objects, only_collection, wait_released
from tests.nobody import NOBODY, reachable_folder

pytestmark = pytest.mark.bpf

BPF_ONLY = "-all,+bpf,+perfmon"
#: uid 0 whose bounding set holds CAP_BPF and CAP_PERFMON alone (as the exporter's unit)
AS_UID0_BPF_ONLY = ["setpriv", f"--bounding-set={BPF_ONLY}", f"--inh-caps={BPF_ONLY}",
                    f"--ambient-caps={BPF_ONLY}"]  # fmt: skip
#: nobody, given the two as ambient capabilities
AS_NOBODY_BPF_ONLY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                      f"--inh-caps={BPF_ONLY}", f"--ambient-caps={BPF_ONLY}"]  # fmt: skip
#: the lines of what root would add (kernmlops.collect.privileges, ebpf.copier)
NO_CGROUP = "the benchmark runs in a process group, not a cgroup of its own"
NO_OOM = "the collector's OOM score is not lowered"
NO_FIFO = "the ring copier runs at normal priority"

#: the benchmark, its filter and whether it has a process tree of its own
RUNS = {
    "command": (["--"], "tree"),
    "system-wide": (["--system-wide", "-b", "faux", "-d", "1"], "system"),
    "default": (["-d", "1"], "tree"),  # stress-ng, the default hooks
}


@pytest.fixture(autouse=True)
def _setpriv() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        skip_here("drops root's capabilities itself: needs root and setpriv (util-linux)")


def _path_env() -> dict[str, str]:
    """This interpreter's packages (not its standard library) for another one."""
    keep = [p for p in sys.path if p and ("-packages" in p or not p.startswith(sys.base_prefix))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(keep)}


@cache
def nobody_python() -> str | None:
    """An interpreter nobody may run that imports kernmlops and its libraries: this
    one, or (where it lies in a folder only root may enter, e.g. under /root) the
    system's of the same version with this one's packages."""
    check = "import kernmlops.cli, numpy, polars, pyarrow"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if not os.path.exists(python):
            continue
        # through a shell: the path itself must be nobody's to reach, as the collector's
        # check of its command wants (setpriv's own exec got past /root here)
        argv = [*AS_NOBODY_BPF_ONLY, "/bin/sh", "-c", 'exec "$0" -c "$1"', python, check]
        ok = subprocess.run(argv, env=_path_env(), capture_output=True, cwd="/", timeout=120)
        if ok.returncode == 0:
            return python
    return None


def collect(who: str, out: Path, args: list[str], env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`kernmlops collect -o OUT ARGS` as ``who`` (uid0 or nobody), from /."""
    if who == "uid0":
        argv = [*AS_UID0_BPF_ONLY, sys.executable]
    else:
        python = nobody_python()
        if python is None:
            skip_here(f"no interpreter nobody may run imports kernmlops ({sys.executable})")
        argv = [*AS_NOBODY_BPF_ONLY, python]
    argv += ["-m", "kernmlops", "collect", "--no-progress", "-o", str(out), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd="/",
                          env={**_path_env(), **(env or {})})  # fmt: skip


def _output(who: str, tmp_path: Path) -> AbstractContextManager[Path]:
    """A folder ``who`` may write in: pytest's own are root's alone (0700)."""
    if who == "nobody":
        return reachable_folder("kernmlops-privileges-")
    return nullcontext(tmp_path)


@pytest.mark.parametrize("who", ["uid0", "nobody"])
@pytest.mark.parametrize("run", list(RUNS))
def test_bpf_and_perfmon_alone_collect_and_say_what_root_would_add(
    tmp_path: Path, who: str, run: str
) -> None:
    before = kernel_objects()
    args, mode = RUNS[run]
    with _output(who, tmp_path) as base:
        out = base / "out"
        out.mkdir()
        if who == "nobody":
            os.chown(out, NOBODY, NOBODY)
        workload: list[str] = []
        if run == "command":
            python = sys.executable if who == "uid0" else nobody_python()
            assert python is not None
            workload = [python, str(WORKLOADS / "forkburn.py"), "2", "0.3"]
        proc = collect(who, out, [*args, *workload])
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        col = only_collection(out)
        assert col is not None
        m = col.manifest
        # the privileges it ran with, as the kernel gave them (independent of kernmlops)
        prefix = AS_UID0_BPF_ONLY if who == "uid0" else AS_NOBODY_BPF_ONLY
        status = subprocess.run([*prefix, "grep", "^CapEff", "/proc/self/status"],
                                capture_output=True, text=True, check=True)  # fmt: skip
        assert int(status.stdout.split()[1], 16) == (1 << 38) | (1 << 39)
        priv = m["privileges"]
        assert priv["euid"] == (0 if who == "uid0" else NOBODY)
        assert priv["capabilities"] == ["CAP_PERFMON", "CAP_BPF"]
        lesser = priv["lesser"]
        # each lesser way said once on stderr, and kept
        said = [ln.removeprefix("warning: ") for ln in proc.stderr.splitlines()]
        for line in lesser:
            assert said.count(line) == 1, (line, proc.stderr)
        assert any(ln.startswith(NO_OOM) and "CAP_SYS_RESOURCE" in ln for ln in lesser)
        assert any(ln.startswith(NO_FIFO) for ln in lesser)
        has_tree = run != "system-wide"
        assert any(ln.startswith(NO_CGROUP) for ln in lesser) == has_tree, lesser
        if has_tree:
            assert m["benchmark"]["cgroup"] is None
        # every default hook attached and wrote rows; a command's tree lost no record
        # from a ring (the whole system on a busy machine may, with the copier at normal
        # priority: the lesser way said above; the /proc sampler may miss ticks)
        assert m["filter"]["mode"] == mode
        for hook in ("process_trace", "quanta_runtime", "memory_usage", "system_info"):
            assert m["hooks"][hook]["attached"], m["hooks"][hook]
        for hook in ("process_trace", "quanta_runtime") if run == "command" else ():
            assert m["hooks"][hook]["drops"] == 0, m["hooks"][hook]
        assert col["quanta_runtime"].height > 0 and col["memory_usage"].height > 0
        if run == "command":
            report = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
            pt = col["process_trace"]
            forks = pt.filter(pl.col("kind") == "fork")["pid"].to_list()
            assert set(report["children"]) <= set(forks)
            execs = pt.filter(pl.col("kind") == "exec")["pid"].to_list()
            assert report["pid"] in execs
            pids = [report["pid"], *report["children"]]
            quanta = col["quanta_runtime"].filter(pl.col("tgid").is_in(pids))
            traced_s = quanta["quanta_run_length_us"].sum() / 1e6
            assert traced_s == pytest.approx(report["cpu_s"], rel=0.10)
        if who == "nobody":  # the collection is the collector's user's
            folder = next((out / "curated").glob("benchmark=*/collection_id=*"))
            owners = {p.stat().st_uid for p in [folder, *folder.rglob("*")]}
            assert owners == {NOBODY}
    assert not any(wait_released(before).values())


def test_a_tracepoint_hook_refused_by_tracefs_says_why_in_one_line(tmp_path: Path) -> None:
    tracefs = Path("/sys/kernel/tracing")
    if not (tracefs / "events").is_dir():
        skip_here("tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)")
    if tracefs.stat().st_mode & 0o005:
        skip_here("tracefs is open to every user here: nothing to refuse")
    with reachable_folder("kernmlops-privileges-") as base:
        out = base / "out"
        out.mkdir()
        os.chown(out, NOBODY, NOBODY)
        proc = collect("nobody", out, ["-b", "faux", "-d", "1",
                                       "--hooks", "mm_rss_stat,quanta_runtime"])  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        col = only_collection(out)
        assert col is not None
        hook = col.manifest["hooks"]["mm_rss_stat"]
        assert not hook["attached"]
        assert hook["reason"] == (
            "attach rss_stat (tracepoint/kmem/rss_stat): the tracepoint's id in tracefs "
            "cannot be read (tracefs is root's alone: it takes uid 0 or CAP_DAC_READ_SEARCH)"
        )
        assert col.manifest["hooks"]["quanta_runtime"]["attached"]
        # the hook that never attached (its spool closed) is not asked for its records:
        # that raised EBADF, and the others' rows were made on one core
        assert "cannot cut the spool" not in proc.stderr, proc.stderr
