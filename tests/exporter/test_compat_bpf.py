"""ebpf_exporter's configs, loaded unchanged: the test configs in
tests/exporter/ebpf_exporter/ are written in its format (map named after the
metric, bucket in the last key field, one u64 per key) and their .bpf.c
include what its examples include. What is served is checked against what the
workload did (its own counts) and against bpftool and /proc."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from kernmlops.ebpf.libbpf import LibbpfError
from kernmlops.ebpf.perf_open import supported
from kernmlops.exporter.cli import export_command
from kernmlops.exporter.config import resolve_sets
from kernmlops.exporter.core import Exporter
from kernmlops.host.cpus import online_cpus
from tests.exporter.conftest import free_port

pytestmark = pytest.mark.bpf

CONFIGS = Path(__file__).parent / "ebpf_exporter"
SIZES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 20, 21, 999, 1000, 1024, 1025, 65536, 1_000_000, 2_000_000]
GETPPIDS = 3000


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _job(comm: str, sizes: list[int], getppids: int) -> None:
    """A process named ``comm`` passes each size to write(2) on fd 999 (never
    open: EBADF before any byte is read) and calls getppid ``getppids`` times."""
    code = textwrap.dedent(f"""
        import ctypes, os
        open("/proc/self/comm", "w").write({comm!r})
        libc = ctypes.CDLL(None, use_errno=True)
        for n in {sizes!r}:
            assert libc.write(999, None, ctypes.c_size_t(n)) == -1
        for _ in range({getppids}):
            os.getppid()
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


def _exp2_bucket(value: int) -> int:
    """ebpf_exporter's exp2 bucket: the smallest b with value <= 2^b (0 and 1: 0)."""
    b = 0
    while value > 2**b:
        b += 1
    return b


def _expected(kind: str, sizes: list[int]) -> tuple[dict[str, float], float, float]:
    """Cumulative counts by ``le`` as ebpf_exporter's README defines each bucket
    type for our write-sizes.yaml, with the count and sum."""
    cum: dict[str, float] = {}
    if kind == "exp2":  # bucket_max 20, values above go to the last bucket
        slots = [min(_exp2_bucket(v), 20) for v in sizes]
        les = [(b, str(2**b) if 2**b < 10**6 else f"{2**b / 10**6:.6f}e+06") for b in range(21)]
        for b, le in les:
            cum[le] = sum(1 for s in slots if s <= b)
        return cum, float(len(sizes)), float(sum(sizes))
    if kind == "exp2zero":  # bucket 0: zeros; b >= 1: (2^(b-2), 2^(b-1)]
        slots = [0 if v == 0 else min(_exp2_bucket(v) + 1, 20) for v in sizes]
        for b in range(21):
            bound = 0 if b == 0 else 2 ** (b - 1)
            le = str(bound) if bound < 10**6 else f"{bound / 10**6:.6f}e+06"
            cum[le] = sum(1 for s in slots if s <= b)
        return cum, float(len(sizes)), float(sum(sizes))
    if kind == "linear":  # buckets 2..20 shown; 0 and 1 are below bucket_min
        slots = [min(v, 20) for v in sizes]
        for b in range(2, 21):
            cum[str(b)] = sum(1 for s in slots if 2 <= s <= b)
        return cum, float(sum(1 for s in slots if s >= 2)), float(sum(sizes))
    keys = [10, 100, 1000, 10000]  # fixed, multiplier 0.001
    slots = [next((k for k in keys if v <= k), keys[-1]) for v in sizes]
    for k, le in zip(keys, ["0.01", "0.1", "1", "10"], strict=True):
        cum[le] = sum(1 for s in slots if s <= k)
    return cum, float(len(sizes)), sum(sizes) * 0.001


@pytest.fixture(scope="module")
def write_sizes():
    exporter = Exporter(resolve_sets([str(CONFIGS / "write-sizes.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        assert status.attached == 2, [(p.name, p.error) for p in status.programs]
        yield exporter
    finally:
        exporter.close()


def test_counts_and_histograms_as_ebpf_exporter_serves_them(write_sizes: Exporter) -> None:
    comm = f"kmo-ee-{os.getpid() % 10000}"
    _job(comm, SIZES, GETPPIDS)
    text = write_sizes.render().decode()
    got = _samples(text)
    # counters: the name as written, no _total added, labels decoded (syscall)
    key = ("ebpf_exporter_test_syscalls_total", (("comm", comm), ("syscall", "getppid")))
    assert got[key] == GETPPIDS
    assert "# TYPE ebpf_exporter_test_syscalls_total counter" in text
    for kind, metric in [
        ("exp2", "write_size_exp2_bytes"),
        ("exp2zero", "write_size_exp2zero_bytes"),
        ("linear", "write_size_linear_bytes"),
        ("fixed", "write_size_fixed_kilobytes"),
    ]:
        name = f"ebpf_exporter_{metric}"
        labels = (("comm", comm), ("fd", "probe"))  # fd: uint then static_map, after padding
        cum, count, total = _expected(kind, SIZES)
        for le, want in cum.items():
            assert got[(f"{name}_bucket", (*labels, ("le", le)))] == want, (kind, le)
        assert got[(f"{name}_bucket", (*labels, ("le", "+Inf")))] == count, kind
        assert got[(f"{name}_count", labels)] == count, kind
        assert got[(f"{name}_sum", labels)] == pytest.approx(total), kind
        # exactly these buckets, written as Go writes them (1024, not 1024.0)
        les = {
            dict(k[1])["le"] for k in got if k[0] == f"{name}_bucket" and dict(k[1])["comm"] == comm
        }
        assert les == {*cum, "+Inf"}, kind


def test_a_program_that_includes_only_bpf_core_read_h_builds() -> None:
    """Some of ebpf_exporter's examples (biolatency, raw-tracepoints) include
    libbpf's bpf_core_read.h for SEC and __kconfig, which libbpf 1.4 and later
    pull in from there; on an older libbpf (Debian 12's 1.1) they built with a
    wall of clang errors. The set loads and counts the job's calls."""
    exporter = Exporter(resolve_sets([str(CONFIGS / "core-read.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        assert status.attached == 1, [(p.name, p.error) for p in status.programs]
        comm = f"kmo-cr-{os.getpid() % 10000}"
        _job(comm, [], GETPPIDS)
        got = _samples(exporter.render().decode())
        key = (
            "ebpf_exporter_test_core_read_syscalls_total",
            (("comm", comm), ("syscall", "getppid")),
        )
        assert got[key] == GETPPIDS
    finally:
        exporter.close()


def test_a_program_that_includes_linux_errno_h_builds() -> None:
    """ebpf_exporter's cgroup-rstat-flushing and usdt examples include
    <linux/errno.h>, whose <asm/errno.h> is in Debian's architecture folder,
    which ebpf_exporter's Makefile adds for -target bpf; without it they did not
    build ('asm/errno.h' file not found). The errno is taken from that header and
    compared with Python's."""
    exporter = Exporter(resolve_sets([str(CONFIGS / "errno-include.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        assert status.attached == 1, [(p.name, p.error) for p in status.programs]
        comm = f"kmo-en-{os.getpid() % 10000}"
        sizes = [1, 2, 3, 4, 5]
        _job(comm, sizes, 0)  # each write(2) on fd 999 fails with EBADF
        got = _samples(exporter.render().decode())
        key = (
            "ebpf_exporter_test_errno_include_bad_fd_total",
            (("comm", comm), ("errno", str(errno.EBADF))),
        )
        assert got[key] == len(sizes)
    finally:
        exporter.close()


def test_xdp_program_on_the_interface_its_section_names() -> None:
    """ebpf_exporter attaches SEC("xdp/<interface>") (its xdp example: lo) to
    that interface; libbpf alone does not know the section, and the set did not
    load. The UDP datagrams this test sends to lo are counted by port."""
    exporter = Exporter(resolve_sets([str(CONFIGS / "xdp-udp.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        assert status.attached == 1, [(p.name, p.error) for p in status.programs]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
            rx.bind(("127.0.0.1", 0))
            port = rx.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
                for _ in range(11):
                    tx.sendto(b"kmo", ("127.0.0.1", port))
            rx.settimeout(10)
            got_back = [rx.recv(16) for _ in range(11)]  # XDP_PASS: each arrives
        assert got_back == [b"kmo"] * 11
        got = _samples(exporter.render().decode())
        assert got[("ebpf_exporter_test_xdp_udp_packets_total", (("dst_port", str(port)),))] == 11
        # lo runs one XDP program: a second exporter's is not attached, and says why
        second = Exporter(resolve_sets([str(CONFIGS / "xdp-udp.yaml")]))
        try:
            (other,) = second.start()
            assert other.attached == 0
            assert "lo already runs an XDP program" in (other.programs[0].error or "")
        finally:
            second.close()
    finally:
        exporter.close()


def test_xdp_section_naming_no_interface_is_one_line() -> None:
    """An interface that is not there leaves the program unattached with one
    line naming it, as a kprobe on a missing function is."""
    from kernmlops.exporter.xdp import attach_xdp

    class _Prog:
        name = "count_udp_on_lo"
        section = "xdp/kmo-no-such0"

    with pytest.raises(LibbpfError, match="no network interface 'kmo-no-such0'"):
        attach_xdp(_Prog())  # type: ignore[arg-type]


def test_usdt_on_a_script_says_why_it_is_not_attached(tmp_path: Path) -> None:
    """ebpf_exporter's usdt example names ``python3``, which may be a script (a
    pyenv shim): libbpf refuses it with EBADF, which alone says nothing; the
    line carries libbpf's reason."""
    script = tmp_path / "python3"
    script.write_text("#!/bin/sh\nexec true\n")
    script.chmod(0o755)
    (tmp_path / "usdt-script.yaml").write_text(
        "metrics:\n  counters:\n    - name: test_usdt_calls_total\n      help: h\n"
    )
    (tmp_path / "usdt-script.bpf.c").write_text(
        textwrap.dedent(f"""
        #include <vmlinux.h>
        #include <bpf/bpf_helpers.h>
        #include <bpf/usdt.bpf.h>

        struct {{
            __uint(type, BPF_MAP_TYPE_ARRAY);
            __uint(max_entries, 1);
            __type(key, u32);
            __type(value, u64);
        }} test_usdt_calls_total SEC(".maps");

        SEC("usdt/{script}:python:import__find__load__start")
        int BPF_USDT(do_count)
        {{
            u32 zero = 0;
            u64 *value = bpf_map_lookup_elem(&test_usdt_calls_total, &zero);

            if (value)
                __sync_fetch_and_add(value, 1);
            return 0;
        }}

        char LICENSE[] SEC("license") = "GPL";
        """)
    )
    exporter = Exporter(resolve_sets([str(tmp_path / "usdt-script.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.error is None, status.error
        (prog,) = status.programs
        assert not prog.attached
        assert prog.error is not None and "\n" not in prog.error
        assert prog.error.endswith(f"(usdt: unrecognized ELF kind 0 for '{script}')"), prog.error
    finally:
        exporter.close()


def test_program_info_matches_bpftool(write_sizes: Exporter) -> None:
    bpftool = shutil.which("bpftool") or shutil.which("bpftool", path="/usr/sbin:/sbin")
    assert bpftool
    got = _samples(write_sizes.render().decode())
    infos = [dict(k[1]) for k in got if k[0] == "ebpf_exporter_ebpf_program_info"]
    assert sorted(i["program"] for i in infos) == ["count_syscalls", "observe_write"]
    for info in infos:
        shown = json.loads(
            subprocess.run(
                [bpftool, "prog", "show", "id", info["id"], "--json"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        assert shown["tag"] == info["tag"]
        assert shown["name"] == info["program"][:15]
        assert info["config"] == "write-sizes"
        assert got[("ebpf_exporter_ebpf_program_attached", (("id", info["id"]),))] == 1
        ours = {"set": "write-sizes", "program": info["program"], "id": info["id"]}
        ours["tag"] = info["tag"]
        assert got[("kernmlops_exporter_program_info", tuple(sorted(ours.items())))] == 1
    assert got[("ebpf_exporter_enabled_configs", (("name", "write-sizes"),))] == 1


#: ebpf_exporter's own metrics as its source names them (exporter/exporter.go:
#: prometheus.NewDesc and CounterOpts; the Go client serves a name as given,
#: adding no _total): name -> (type, label names)
EBPF_EXPORTER_SELF = {
    "ebpf_exporter_enabled_configs": ("gauge", {"name"}),
    "ebpf_exporter_ebpf_program_info": ("gauge", {"config", "program", "tag", "id"}),
    "ebpf_exporter_ebpf_program_attached": ("gauge", {"id"}),
    "ebpf_exporter_ebpf_program_run_time_seconds": ("counter", {"id"}),
    "ebpf_exporter_ebpf_program_run_count_total": ("counter", {"id"}),
    "ebpf_exporter_decoder_errors_total": ("counter", {"config"}),
}


def _types_and_series(text: str) -> tuple[dict[str, str], dict[str, list[dict[str, str]]]]:
    """The text format read by hand (prometheus_client's parser renames a
    counter's samples): each TYPE line's name and type, each sample's name and
    labels."""
    types: dict[str, str] = {}
    series: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ")
            types[name] = typ
        elif line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group()  # type: ignore[union-attr]
            head = line.rsplit(" ", 1)[0]
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', head))
            series.setdefault(name, []).append(labels)
    return types, series


def test_own_metrics_named_as_ebpf_exporter_names_them() -> None:
    """--bpf-stats: every built-in metric of ebpf_exporter is served under its
    exact name, type and labels; run time and count agree with bpftool."""
    bpftool = shutil.which("bpftool") or shutil.which("bpftool", path="/usr/sbin:/sbin")
    assert bpftool
    exporter = Exporter(resolve_sets([str(CONFIGS / "write-sizes.yaml")]), bpf_stats=True)
    try:
        (status,) = exporter.start()
        assert status.attached == 2, [(p.name, p.error) for p in status.programs]
        _job("kmo-ee-stats", [1, 2, 3], 100)
        text = exporter.render().decode()
        shown = {}
        for prog in status.programs:
            pid = str(_prog_id(prog.fd))
            out = subprocess.run(
                [bpftool, "prog", "show", "id", pid, "--json"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            shown[pid] = json.loads(out)
    finally:
        exporter.close()
    types, series = _types_and_series(text)
    for name, (typ, labels) in EBPF_EXPORTER_SELF.items():
        assert types.get(name) == typ, (name, types.get(name))
        assert series.get(name), name  # its samples carry the same name
        assert all(set(ls) == labels for ls in series[name]), name
    served = {n for n in types if n.startswith("ebpf_exporter_") and "test_" not in n}
    served -= {n for n in types if n.startswith("ebpf_exporter_write_size")}
    assert served == set(EBPF_EXPORTER_SELF)
    run_time = {
        ls["id"]: v for ls, v in _values(text, "ebpf_exporter_ebpf_program_run_time_seconds")
    }
    runs = {ls["id"]: v for ls, v in _values(text, "ebpf_exporter_ebpf_program_run_count_total")}
    assert set(run_time) == set(runs) == set(shown)
    for pid, info in shown.items():
        # bpftool read them after the scrape: at least as much, and the job ran them
        assert 0 < runs[pid] <= info["run_cnt"], pid
        assert 0 < run_time[pid] <= info["run_time_ns"] / 1e9, pid
    assert {"config": "write-sizes"} in series["ebpf_exporter_decoder_errors_total"]


def _prog_id(fd: int) -> int:
    from kernmlops.ebpf import libbpf

    return libbpf.prog_info(fd).id


def _values(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """``name``'s samples: labels and value (read by hand, as above)."""
    out = []
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            head, value = line.rsplit(" ", 1)
            out.append((dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', head)), float(value)))
    return out


def test_perf_event_program_per_cpu() -> None:
    """SEC("perf_event/type=1,config=0,frequency=97"): cpu-clock on every CPU,
    a per-CPU array whose only label is cpu served per CPU."""
    exporter = Exporter(resolve_sets([str(CONFIGS / "cpu-clock.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.attached == 1, [(p.name, p.error) for p in status.programs]
        # Busy on every CPU for 0.5 s: an idle CPU takes no cpu-clock samples.
        spin = "import time\nt = time.monotonic() + 0.5\nwhile time.monotonic() < t: pass"
        spinners = [
            subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", spin])
            for cpu in online_cpus()
        ]
        for proc in spinners:
            proc.wait(timeout=30)
        got = _samples(exporter.render().decode())
    finally:
        exporter.close()
    name = "ebpf_exporter_cpu_clock_samples_total"
    series = {dict(k[1])["cpu"]: v for k, v in got.items() if k[0] == name}
    assert set(series) == {str(c) for c in online_cpus()}
    assert all(v > 0 for v in series.values()), series


def test_hardware_perf_event_where_the_pmu_has_it() -> None:
    """cycles attach where the PMU counts them; elsewhere --config.check fails
    with one line naming the event and why."""
    args = ["--config.dir", str(CONFIGS), "--config.names", "cycles", "--config.check"]
    result = CliRunner().invoke(export_command, args)
    has_pmu, _ = supported(0, 0)
    if has_pmu:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("check failed")]
    assert len(lines) == 1
    assert "perf hardware event cycles (type=0, config=0) cannot be opened on CPU" in lines[0]
    assert "PMU" in lines[0]


@pytest.mark.parametrize(("keep", "mask"), [("none", 0), ("cap_syslog,cap_bpf", 1 << 34 | 1 << 39)])
def test_capabilities_dropped_after_attach(keep: str, mask: int) -> None:
    """--capabilities.keep: every thread of the serving exporter holds only what
    was kept (/proc/PID/task/*/status CapEff and CapPrm), and it still serves."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "kernmlops.exporter", "--config.dir", str(CONFIGS),
        "--config.names", "write-sizes", "--web.listen-address", f"127.0.0.1:{port}",
        f"--capabilities.keep={keep}",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 120
        body = ""
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                body = urllib.request.urlopen(url, timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.2)
        assert body, proc.stdout.read() if proc.poll() is not None else "no answer"  # type: ignore[union-attr]
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            lines = (task / "status").read_text().splitlines()
            status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
            assert int(status["CapEff"], 16) == mask, (task.name, status["CapEff"])
            assert int(status["CapPrm"], 16) == mask, (task.name, status["CapPrm"])
        # a scrape after the drop still reads the maps
        _job("kmo-ee-caps", [], 10)
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        key = (
            "ebpf_exporter_test_syscalls_total",
            (("comm", "kmo-ee-caps"), ("syscall", "getppid")),
        )
        assert _samples(body)[key] == 10
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "capabilities dropped" in out


#: as the user ran it: capabilities for BPF and perf events only, no CAP_SYSLOG
NO_SYSLOG = ["setpriv", "--bounding-set", "-all,+bpf,+perfmon", "--no-new-privs"]
TIMERS = [sys.executable, "-m", "kernmlops.exporter", "--config.dir", str(CONFIGS),
          "--config.names", "timers"]  # fmt: skip


def _text_symbols() -> set[str]:
    lines = Path("/proc/kallsyms").read_text().splitlines()
    return {p[2] for p in map(str.split, lines) if len(p) >= 3 and p[1] in "tT"}


def test_check_fails_when_ksym_labels_cannot_decode() -> None:
    """Without CAP_SYSLOG /proc/kallsyms shows this process zeros: a set with ksym
    labels would serve no series (each key a decoder error), so --check fails
    with one line saying why; with it the check passes."""
    assert shutil.which("setpriv"), "setpriv (util-linux) is needed"
    shown = subprocess.run([*NO_SYSLOG, "head", "-3", "/proc/kallsyms"], capture_output=True,
                           text=True, check=True).stdout  # fmt: skip
    assert {line.split()[0] for line in shown.splitlines()} == {"0" * 16}  # the premise
    done = subprocess.run([*NO_SYSLOG, *TIMERS, "--check"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)  # fmt: skip
    failed = [line for line in done.stdout.splitlines() if line.startswith("check failed")]
    assert done.returncode == 1, done.stdout
    assert failed == [
        "check failed: set timers: its ksym labels cannot be decoded, so every series with "
        "them would be left out: /proc/kallsyms shows this process no addresses; reading "
        f"them needs CAP_SYSLOG (kernel.kptr_restrict is {_kptr_restrict()})"
    ]
    done = subprocess.run([*TIMERS, "--check"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "check passed" in done.stdout, done.stdout


def _kptr_restrict() -> str:
    return Path("/proc/sys/kernel/kptr_restrict").read_text().strip()


def test_ksym_labels_served_or_warned() -> None:
    """Serving with CAP_SYSLOG: timer functions by name, each a text symbol of
    /proc/kallsyms. Without it the exporter serves on, with a warning line."""
    exporter = Exporter(resolve_sets([str(CONFIGS / "timers.yaml")]))
    try:
        (status,) = exporter.start()
        assert status.attached == 1 and not status.label_problems
        time.sleep(0.5)
        got = _samples(exporter.render().decode())
    finally:
        exporter.close()
    functions = {
        dict(labels)["function"]: v
        for (name, labels), v in got.items()
        if name == "ebpf_exporter_test_timer_expirations_total"
    }
    assert functions and set(functions) <= _text_symbols(), functions
    port = free_port()
    listen = ["--web.listen-address", f"127.0.0.1:{port}"]
    proc = subprocess.Popen([*NO_SYSLOG, *TIMERS, *listen], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("serving"):
                break
        assert lines and lines[-1].startswith("serving"), lines
        warned = [line for line in lines if line.startswith("warning:")]
        assert warned == [
            "warning: set timers: its ksym labels cannot be decoded, so every series with them "
            "would be left out: /proc/kallsyms shows this process no addresses; reading them "
            f"needs CAP_SYSLOG (kernel.kptr_restrict is {_kptr_restrict()})"
        ]
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
