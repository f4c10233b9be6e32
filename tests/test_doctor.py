"""`kernmlops doctor` for a user who is not root: what can be seen without
privileges, then one line that says what the user lacks; no traceback."""

from __future__ import annotations

import math
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from kernmlops.doctor import privilege_notes
from kernmlops.ebpf.probe import TRACEFS, Feature
from tests.conftest import skip_here

NOBODY = 65534


def _features(**ok: bool | str) -> dict[str, Feature]:
    """Features as probe_all names them; a str value is a failed feature's detail."""
    base: dict[str, bool | str] = {
        "root": "uid 1000",
        "bpf_capabilities": "missing",
        "tracefs": f"{TRACEFS} not readable (root only)",
        "sw_cpu_clock": "Permission denied",
    }
    base.update(ok)
    return {name: Feature(name, v is True, "" if v is True else str(v)) for name, v in base.items()}


def test_privilege_notes_name_what_is_missing() -> None:
    notes = privilege_notes(_features())
    assert notes[0] == (
        "not root (uid 1000): BPF needs root or CAP_BPF+CAP_PERFMON, so no program type was probed"
    )
    assert notes[1] == f"tracefs {TRACEFS} not readable (root only)"
    assert notes[2].startswith("perf events refused")
    assert len(notes) == 3
    capable = privilege_notes(_features(bpf_capabilities=True, tracefs=True, sw_cpu_clock=True))
    assert capable == ["not root (uid 1000), but has the BPF capabilities"]
    assert privilege_notes(_features(root=True, bpf_capabilities=True, tracefs=True,
                                     sw_cpu_clock=True)) == []  # fmt: skip


def _as_unprivileged(argv: list[str]) -> tuple[list[str], int]:
    """``argv`` run as nobody when we are root (setpriv drops every capability)."""
    if os.geteuid() != 0:
        return argv, os.geteuid()
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run doctor as nobody"
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv], NOBODY


def test_doctor_as_a_user_who_is_not_root_explains_and_prints_what_it_can() -> None:
    argv, uid = _as_unprivileged([sys.executable, "-m", "kernmlops", "doctor"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
    err = proc.stderr
    assert "Traceback" not in err and "Error:" not in err, err[-3000:]
    assert proc.returncode == 1, err[-3000:]  # no BPF hook can run
    # what it can see: the machine, the hooks (system_info needs nothing), the variants
    assert "this machine" in err and "hooks" in err and "program variants" in err
    assert f"uid {uid}" in err
    assert any(line.startswith("│ system_info") and " yes " in line for line in err.splitlines())
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(
        f"not root (uid {uid}): BPF needs root or CAP_BPF+CAP_PERFMON, so no program type "
        "was probed; "
    )
    assert last.endswith("; run `sudo kernmlops doctor` for the full matrix")
    if not os.stat(TRACEFS).st_mode & stat.S_IXOTH:
        assert f"; tracefs {TRACEFS} not readable (root only);" in last
    if int(Path("/proc/sys/kernel/perf_event_paranoid").read_text()) >= 2:
        assert "; perf events refused (kernel.perf_event_paranoid=" in last
    # a map the kernel refuses this user is not a map type the kernel lacks
    if int(Path("/proc/sys/kernel/unprivileged_bpf_disabled").read_text()) != 0:
        for feature in ("ringbuf", "task_storage"):
            line = next(x for x in err.splitlines() if x.startswith(f"│ {feature} "))
            assert " no " in line and "needs root to probe" in line, line
    release = tuple(int(x) for x in os.uname().release.split(".")[:2])
    if release >= (5, 11):
        assert "before Linux 5.11" not in err


def test_doctor_as_a_user_who_cannot_read_the_bpf_folder_says_so_without_a_traceback() -> None:
    # Issue: KERNMLOPS_BPF_DIR (or root's HOME, kept by setpriv and su) naming a folder
    # this user may not search: the copier's and the variants' os.stat raised.
    from tests.nobody import reachable_folder

    if os.geteuid() != 0:
        skip_here("needs root to make a folder nobody may not search")
    with reachable_folder("kernmlops-doctor-") as base:
        private = base / "roots"
        (private / "bpf").mkdir(parents=True)
        (private / "bpf" / "probe.bpf.o").write_bytes(b"")
        private.chmod(0o700)
        argv, _ = _as_unprivileged([sys.executable, "-m", "kernmlops", "doctor"])
        # wide: a table row's detail on one line
        env = {**os.environ, "KERNMLOPS_BPF_DIR": str(private / "bpf"), "COLUMNS": "400"}
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/",
                              env=env)  # fmt: skip
    err = proc.stderr
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == 1, err[-3000:]
    assert "program variants" in err
    last = err.rstrip("\n").splitlines()[-1]
    assert f"cannot read the BPF objects' folder {private / 'bpf'}: permission denied" in last
    # the copier is there, not readable: not "not built"
    said = " ".join(err.split())
    assert "libkmo_ringcopy.so not readable by this user" in said, said[:3000]


def test_the_hardware_counter_rows_say_whether_the_pmu_counts_them_for_any_user() -> None:
    # Issue: on a VM without a PMU, root read "No such file or directory" and any
    # other user "Permission denied" (the CPU-wide open perf_event_paranoid refuses).
    from kernmlops.ebpf.perf_open import (
        HW_CPU_CYCLES,
        HW_INSTRUCTIONS,
        PERF_TYPE_HARDWARE,
        supported,
    )
    from tests.nobody import as_nobody

    perf = shutil.which("perf")
    if perf is None or os.geteuid() != 0:
        skip_here("needs perf (linux-perf) and root, to compare as root and as nobody")
    for event, config in (("cycles", HW_CPU_CYCLES), ("instructions", HW_INSTRUCTIONS)):
        # perf's own answer, user space only: what any user may count
        out = subprocess.run([perf, "stat", "-x,", "-e", f"{event}:u", "true"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        counted = not out.stderr.startswith("<not supported>")

        def step(config: int = config, counted: bool = counted, root: bool = True) -> None:
            ok, why = supported(PERF_TYPE_HARDWARE, config)
            if counted:
                assert ok or (not root and why == "Permission denied"), why
            else:
                assert not ok and "this machine's PMU does not count it" in why, why

        step()
        as_nobody(lambda step=step: step(root=False))


def _df_avail(path: Path) -> int:
    out = subprocess.run(["df", "-B1", "--output=avail", str(path)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return int(out.split()[-1])


def _mib(text: str) -> float:
    """The first "N.N MiB" or "N.N GiB" in text, in MiB."""
    import re

    value, unit = re.search(r"([\d.]+) (MiB|GiB)", text).groups()  # type: ignore[union-attr]
    return float(value) * (1024 if unit == "GiB" else 1)


def test_the_sizing_table_is_this_machines(tmp_path: Path) -> None:
    """CPUs as getconf and nproc count them, the ring size by the README's rule (8 MiB
    per 4 CPUs, a power of two), free space as df sees it."""
    from kernmlops.doctor import collection_sizing

    rows = dict(collection_sizing(tmp_path / "data"))
    online = int(subprocess.run(["getconf", "_NPROCESSORS_ONLN"], capture_output=True,
                                text=True, check=True).stdout)  # fmt: skip
    # nproc counts the CPUs this process may use, or OMP_NUM_THREADS where it is set
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    usable = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True,
                                env=clean).stdout)  # fmt: skip
    assert rows["CPUs"] == f"{online} online; {usable} this process may use"
    rings = math.ceil(online / 16)
    per_ring = math.ceil(online / rings)
    quarters = math.ceil(per_ring / 4)
    ring_mib = min(256, 8 * 2 ** (quarters - 1).bit_length())
    assert rows["rings per table"].startswith(f"{rings}, each written by ")
    assert _mib(rows["rings per table"]) == ring_mib
    free = _df_avail(tmp_path)
    assert rows["output disk"].endswith(f"free at {tmp_path} (collector.output_dir: "
                                        f"{tmp_path / 'data'})")  # fmt: skip
    assert abs(_mib(rows["output disk"]) * 2**20 - free) / free < 0.05  # df and the row's rounding
    if Path("/dev/shm").is_dir() and "tmpfs" in Path("/proc/mounts").read_text():
        shm_free = _df_avail(Path("/dev/shm"))
        ram_mib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
        expected = min(max(256, min(64 * online, ram_mib // 16)), shm_free / 2**21)
        assert abs(_mib(rows["memory spool"]) - expected) / expected < 0.01
    if usable < 4:
        assert rows["row workers at stop"].startswith("none: rows made in the collector")
        assert rows["zstd threads per copier"] == "none (4 CPUs or fewer)"


def test_the_sizing_table_of_a_192_cpu_machine(monkeypatch) -> None:
    """On 192 CPUs (those functions told so): twelve rings of 16 CPUs, 32 MiB each (8
    MiB per 4 CPUs); a zstd thread per 8 CPUs; a row worker per CPU, at most 64 and
    one per GiB of memory."""
    import kernmlops.config
    import kernmlops.hooks.bpf
    from kernmlops.doctor import collection_sizing

    cpus = list(range(192))
    for module in (kernmlops.config, kernmlops.hooks.bpf):
        monkeypatch.setattr(module, "online_cpu_count", lambda: 192)
    monkeypatch.setattr("kernmlops.host.cpus.online_cpu_count", lambda: 192)
    monkeypatch.setattr(kernmlops.hooks.bpf, "online_cpus", lambda: cpus)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus))
    rows = dict(collection_sizing())
    assert rows["CPUs"] == "192 online; 192 this process may use"
    assert rows["rings per table"] == "12, each written by 16 CPUs, 32.0 MiB"
    # 24 in all (one per 8 CPUs), shared by the table's 12 copiers: 2 beside each
    assert rows["zstd threads per copier"] == "2 (24 in all, beside 12 copiers)"
    ram_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**30
    assert rows["row workers at stop"].startswith(f"{min(64, ram_gib)} processes")


def test_the_sizing_table_of_24_cpus_says_what_the_copiers_got(monkeypatch) -> None:
    """On 24 CPUs two rings of 12: the kernel lab's manifests (`python -m bench many-cpus`,
    bench/README.md) gave 2 copiers and 4 zstd workers, 2 beside each, not 3."""
    import kernmlops.config
    import kernmlops.hooks.bpf
    from kernmlops.doctor import collection_sizing

    cpus = list(range(24))
    for module in (kernmlops.config, kernmlops.hooks.bpf):
        monkeypatch.setattr(module, "online_cpu_count", lambda: 24)
    monkeypatch.setattr("kernmlops.host.cpus.online_cpu_count", lambda: 24)
    monkeypatch.setattr(kernmlops.hooks.bpf, "online_cpus", lambda: cpus)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus))
    rows = dict(collection_sizing())
    assert rows["rings per table"].startswith("2, each written by 12 CPUs")
    assert rows["zstd threads per copier"] == "2 (4 in all, beside 2 copiers)"


def test_doctor_says_the_copier_priority_the_kernel_gives_uid0_without_cap_sys_nice() -> None:
    """uid 0 under a bounding set of CAP_BPF and CAP_PERFMON (as a systemd unit may
    run the collector): the kernel refuses the copier SCHED_FIFO and a lower nice, and
    doctor must say normal priority, not real-time "as root"."""
    from kernmlops.ebpf import copier

    if os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("prlimit")):
        skip_here("drops root's capabilities itself: needs root, setpriv and prlimit")
    if not copier.available():
        skip_here(f"{copier.LIBRARY} is not built (`make`)")
    # no rlimit that would let a thread take either without the capability
    drop = ["prlimit", "--rtprio=0", "--nice=0", "setpriv", "--bounding-set=-all,+bpf,+perfmon",
            "--inh-caps=-all", sys.executable]  # fmt: skip
    # this kernmlops (cwd is /, so a relative PYTHONPATH would find another); the row on one line
    env = {**os.environ, "PYTHONPATH": str(Path(copier.__file__).parents[2]), "COLUMNS": "400"}
    check = "from kernmlops.ebpf.copier import realtime; print(realtime(1))"
    kernel = subprocess.run([*drop, "-c", check], capture_output=True, text=True, timeout=60,
                            env=env, check=True).stdout.strip()  # fmt: skip
    assert kernel == "(0, 'SCHED_FIFO 1: Operation not permitted', None)"  # refused, no nice
    proc = subprocess.run([*drop, "-m", "kernmlops", "doctor"], capture_output=True, text=True,
                          timeout=180, cwd="/", env=env)  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    row = next(line for line in (proc.stdout + proc.stderr).splitlines() if "ring copier" in line)
    assert "normal priority: SCHED_FIFO and a lower nice need CAP_SYS_NICE" in row, row
    assert "SCHED_FIFO as root" not in row


def test_doctor_says_a_cgroup_without_a_real_time_budget_refuses_the_copier() -> None:
    """Root (CAP_SYS_NICE) in a cgroup v1 cpu group whose cpu.rt_runtime_us is 0 (every
    new group's; containers run so): the kernel refuses SCHED_FIFO (chrt, the
    independent reading), and doctor says so and why, where it predicted real-time
    from the capability; the copier falls back to nice -20."""
    import uuid

    from kernmlops.ebpf import copier

    cpu = Path("/sys/fs/cgroup/cpu")
    if os.geteuid() != 0 or not (cpu / "cpu.rt_runtime_us").exists() or not shutil.which("chrt"):
        skip_here("needs root, cgroup v1's cpu controller with real-time groups, and chrt")
    if not copier.available():
        skip_here(f"{copier.LIBRARY} is not built (`make`)")
    group = cpu / f"kmo-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        assert (group / "cpu.rt_runtime_us").read_text().strip() == "0"
        env = {**os.environ, "PYTHONPATH": str(Path(copier.__file__).parents[2]),
               "COLUMNS": "400"}  # fmt: skip

        def inside(*argv: str) -> subprocess.CompletedProcess:
            enter = f'echo $$ > "{group}/cgroup.procs" && exec "$@"'
            return subprocess.run(["sh", "-c", enter, "sh", *argv], capture_output=True,
                                  text=True, timeout=180, cwd="/", env=env)  # fmt: skip

        kernel = inside("chrt", "-f", "1", "true")
        assert kernel.returncode != 0 and "Operation not permitted" in kernel.stderr
        proc = inside(sys.executable, "-m", "kernmlops", "doctor")
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        out = proc.stdout + proc.stderr
        row = next(line for line in out.splitlines() if "ring copier" in line)
        assert "nice -20, not real-time (SCHED_FIFO 1: Operation not permitted despite " in row
        assert "a cgroup without a real-time budget (cpu.rt_runtime_us)" in row, row
    finally:
        group.rmdir()


def test_doctor_copier_priority_follows_the_effective_set() -> None:
    """The same decision with a CapEff mask: CAP_SYS_NICE (bit 23) decides, not uid 0."""
    import resource

    from kernmlops.doctor import _copier_row
    from kernmlops.ebpf import copier
    from kernmlops.host.capabilities import effective

    if not copier.available():
        skip_here(f"{copier.LIBRARY} is not built (`make`)")
    if resource.getrlimit(resource.RLIMIT_RTPRIO)[0] or resource.getrlimit(resource.RLIMIT_NICE)[0]:
        skip_here("RLIMIT_RTPRIO or RLIMIT_NICE grants priority without CAP_SYS_NICE here")
    bpf_only = effective("Name:\tx\nCapEff:\t000000c000000000\n")  # CAP_PERFMON, CAP_BPF
    normal = "normal priority: SCHED_FIFO and a lower nice need CAP_SYS_NICE"
    assert normal in _copier_row(bpf_only)[1]
    nice = effective("CapEff:\t000000c000800000\n")
    assert "SCHED_FIFO 1 (CAP_SYS_NICE)" in _copier_row(nice)[1]


def _kernel_config() -> str | None:
    """This kernel's build configuration (/proc/config.gz or Debian's /boot copy)."""
    import gzip

    proc = Path("/proc/config.gz")
    if proc.exists():
        return gzip.decompress(proc.read_bytes()).decode()
    boot = Path(f"/boot/config-{os.uname().release}")
    return boot.read_text() if boot.exists() else None


def test_the_kprobe_row_says_the_kernel_has_none_where_its_config_says_so() -> None:
    # Issue: on a kernel without kprobe events the row read libbpf's "failed to create
    # kprobe 'vfs_read+0x0' perf event: No such file or directory"
    from kernmlops.ebpf.probe import has_bpf_capabilities, probe_program

    config = _kernel_config()
    if config is None or not has_bpf_capabilities():
        skip_here("needs the kernel's config and root, to probe kprobes")
    built = "CONFIG_KPROBE_EVENTS=y" in config.splitlines()
    row = probe_program("kprobe")
    if built:
        assert "has no kprobe events" not in row.detail, row
    else:
        assert not row.ok
        assert row.detail.startswith("this kernel has no kprobe events (built without "
                                     "CONFIG_KPROBE_EVENTS"), row  # fmt: skip


def test_doctors_exit_status_is_the_one_its_help_says() -> None:
    # its help said nothing of it; as root here (kprobes, fentry and the hardware
    # counters missing, BPF hooks able to run) it exits 0, as nobody 1
    from click.testing import CliRunner

    from kernmlops.cli import cli

    said = " ".join(CliRunner().invoke(cli, ["doctor", "--help"]).output.split())
    assert "Exit status 1 when no BPF hook can run here" in said
    if os.geteuid() != 0:
        skip_here("needs root: the other half of the status")
    proc = subprocess.run([sys.executable, "-m", "kernmlops", "doctor"], capture_output=True,
                          text=True, timeout=120, cwd="/")  # fmt: skip
    # the hooks table's row of block_io, a BPF hook (tp_btf or raw_tp)
    row = next(x for x in proc.stderr.splitlines() if x.startswith("│ block_io "))
    runs = row.split("│")[2].strip() == "yes"
    assert proc.returncode == (0 if runs else 1), proc.stderr[-2000:]


def test_a_program_type_the_kernel_refuses_root_is_not_told_as_a_permission() -> None:
    # Issue: as root the fentry row read "Operation not permitted" alone, and libbpf's
    # log beside it suggested raising `ulimit -l`: the kernel refuses the type
    from kernmlops.ebpf.probe import has_bpf_capabilities, probe_program

    bpftool = shutil.which("bpftool") or shutil.which("bpftool", path="/usr/sbin:/sbin")
    if bpftool is None or not has_bpf_capabilities():
        skip_here("needs bpftool and root, to probe program types")
    listing = subprocess.run([bpftool, "feature", "probe", "kernel"], capture_output=True,
                             text=True, timeout=120).stdout  # fmt: skip
    row = probe_program("fentry")
    if "program_type tracing is NOT available" not in listing:
        # a kernel that loads them: whatever else stops a probe, not this refusal
        assert "the kernel refuses fentry programs" not in row.detail, row
        return
    assert not row.ok
    if "Operation not permitted" in row.detail:
        assert row.detail.startswith(
            "the kernel refuses fentry programs even with the BPF capabilities: "
        ), row
