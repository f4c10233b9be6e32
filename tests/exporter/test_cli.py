"""`kernmlops export`: user errors are refused with a clear message before
anything is loaded (no root needed for these)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.exporter.cli import export_command


def run(*args: str):
    return CliRunner().invoke(export_command, list(args))


def test_list_shows_every_builtin_set_and_its_metrics() -> None:
    result = run("--list")
    assert result.exit_code == 0, result.output
    assert "biolatency (on by default)" in result.output
    assert "syscalls_comm (off by default)" in result.output
    assert "kernmlops_block_io_latency_seconds{device,op}  histogram" in result.output
    assert "kernmlops_cgroup_cpu_seconds_total{cgroup}  counter" in result.output


def test_list_writes_a_metric_without_labels_bare_as_prometheus_does() -> None:
    result = run("--list")
    assert result.exit_code == 0, result.output
    # runqlat's histogram has no label: its name alone, as /metrics writes it
    assert "    kernmlops_runqueue_latency_seconds  histogram\n" in result.output
    assert "{}" not in result.output


def test_bad_metric_file_names_file_key_and_reason(tmp_path: Path) -> None:
    bad = tmp_path / "io.yaml"
    bad.write_text(
        "metrics:\n"
        "  histograms:\n"
        "    - name: io_latency_seconds\n"
        "      help: latency\n"
        "      map: lat\n"
        "      bucket_type: exp2\n"
        "      labels:\n"
        "        - {name: dev, size: 3, decoders: [{name: majorminor}]}\n"
    )
    result = run("--config", str(bad), "--check")
    assert result.exit_code == 2
    out = result.output
    assert f"invalid metric set {bad}" in out
    assert (
        "metrics.histograms[0] (io_latency_seconds).labels[0] (dev): decoder 'majorminor' "
        "reads an integer: size must be 1, 2, 4 or 8" in out
    )
    bad.write_text(bad.read_text().replace("size: 3", "size: 4"))
    result = run("--config", str(bad), "--check")
    assert result.exit_code == 2
    assert "metrics.histograms[0] (io_latency_seconds): bucket_type 'exp2' needs bucket_max" in (
        result.output
    )


def test_a_metric_set_with_one_problem_is_one_line_and_many_are_listed(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "m.yaml"
    bad.write_text("metrics: 5\n")
    result = run("--config", str(bad), "--check")
    assert result.exit_code == 2
    # one line, as every other error (before: the file's name, then its one problem
    # on a second line)
    assert result.output == (
        f"error: invalid metric set {bad}: metrics: Input should be a valid dictionary or "
        "instance of MetricsSpec (got 5)\n"
    )
    # thousands of unknown keys are not echoed back whole
    bad.write_text("metrics: {}\n" + "".join(f"k{i}: 1\n" for i in range(500)))
    result = run("--config", str(bad), "--check")
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert lines[0] == f"error: invalid metric set {bad}:"
    assert "  - k0: unknown key" in result.output and lines[-1] == "  ... and 481 more"
    assert len(lines) == 22


def test_unknown_set_missing_file_and_bad_listen() -> None:
    result = run("-c", "biolatncy")
    assert result.exit_code == 2 and "did you mean 'biolatency'" in result.output
    result = run("-c", "nowhere/io.yaml")
    assert result.exit_code == 2 and "cannot read metric set nowhere/io.yaml" in result.output
    result = run("--listen", ":9435")
    assert result.exit_code == 2 and "give the host" in result.output
    result = run("--max-label-sets", "0")
    assert result.exit_code == 2 and "--max-label-sets" in result.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--tgid", "999999999"], "--tgid 999999999: no process 999999999"),
        (["--tgid", "0"], "--tgid 0: a process id is positive"),
        (["--config.dir", "examples"],
         "--config.dir examples needs --config.names (the configs in it to load)"),
        (["--config.names", "biolatency,timers"],
         "--config.names biolatency,timers needs --config.dir (the folder they are in)"),
    ],
)  # fmt: skip
def test_a_flag_error_is_one_line(args: list[str], said: str) -> None:
    result = run(*args)
    assert result.exit_code == 2
    # not click's usage form (Usage:, Try ..., a blank line, Error: ...)
    assert result.output == f"error: {said}\n"


def test_a_bad_web_config_file_is_one_line_before_anything_loads(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: none.crt\n  key_file: none.key\n")
    result = run("-c", "syscalls", "--web.config.file", str(web))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    # the missing file is named (ssl's error names none)
    no_cert = tmp_path / "none.crt"
    assert lines[0] == f"error: --web.config.file {web}: tls_server_config: no file {no_cert}"
    result = run("--web.config.file", str(tmp_path / "missing.yml"))
    assert result.exit_code == 2 and "missing.yml" in result.output


@pytest.fixture
def no_bpf(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No program loaded: the exporter's start is recorded (and loads nothing), so that
    what comes before it is seen without root."""
    from kernmlops.exporter.core import Exporter

    started: list[str] = []
    monkeypatch.setattr("kernmlops.exporter.cli.require_bpf_privileges", lambda _cmd: None)
    monkeypatch.setattr("kernmlops.ebpf.build.build", lambda *a, **k: [])
    monkeypatch.setattr(Exporter, "start", lambda self: started.append("start") or [])
    return started


#: sysexits.h's EX_TEMPFAIL: what a listen address that cannot be bound now exits with
#: (a port busy at boot may pass; the systemd unit restarts on it, not on 2)
TEMPFAIL = 75


def test_a_busy_port_is_refused_before_anything_is_loaded_and_check_tests_it(
    no_bpf: list[str],
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        for check in ((), ("--check",)):
            result = run("-c", "syscalls", "--listen", f"127.0.0.1:{port}", *check)
            # not 2, a user error's status: a busy port may be free at the next try
            assert result.exit_code == TEMPFAIL, result.output
            line = f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
            assert result.output.strip().splitlines() == [
                line + (" (--check tests the port too; --listen 127.0.0.1:0 checks the sets alone)"
                        if check else "")
            ]  # fmt: skip
        assert no_bpf == []  # said before any program was loaded
    # a free port: the check passes, says so, and lets the port go
    result = run("-c", "syscalls", "--web.listen-address", f"127.0.0.1:{port}", "--check")
    assert result.exit_code == 0, result.output
    assert f"check passed: 0 sets loaded, all 0 programs attached, 127.0.0.1:{port} free" in (
        result.output
    )
    assert no_bpf == ["start"]
    socket.create_server(("127.0.0.1", port)).close()
    # and --help says so
    assert "(exit 75) when the listen address cannot be bound" in " ".join(
        run("--help").output.split()
    )


def test_listen_errors_name_the_flag_given_and_both_flags_are_refused(no_bpf: list[str]) -> None:
    result = run("--web.listen-address", "127.0.0.1:99999")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: --web.listen-address '127.0.0.1:99999': port 99999 is out of range 0-65535"
    )
    result = run("--web.listen-address", "localhost")
    assert result.exit_code == 2
    assert "error: --web.listen-address 'localhost': expected HOST:PORT" in result.output
    # the same setting under two names: which one wins would be a guess (a busy port
    # for the second: code that took it would stop there, not serve)
    with socket.create_server(("127.0.0.1", 0)) as busy:
        other = f"127.0.0.1:{busy.getsockname()[1]}"
        result = run("--listen", "127.0.0.1:9435", "--web.listen-address", other)
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: --listen 127.0.0.1:9435 and --web.listen-address {other}: both name where "
        "to serve; give one"
    )
    assert no_bpf == []


def test_ebpf_exporters_flags_are_taken_or_refused_in_one_line(no_bpf: list[str]) -> None:
    """Its flags that mean something here are taken (--web.telemetry-path,
    --log.no-timestamps: kernmlops' lines carry no timestamps); the others are
    refused with why, in one line each, never ignored in silence."""
    result = run("-c", "syscalls", "--log.no-timestamps", "--web.telemetry-path", "/m",
                 "--listen", "127.0.0.1:0", "--check")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert no_bpf == ["start"]
    for args, line in [
        (["--debug"], "error: --debug (ebpf_exporter's libbpf debug log and raw /maps page) is "
                      "not supported by kernmlops export: remove it"),
        (["--btf.path", "/b.btf"], "error: --btf.path /b.btf: not supported; programs load "
                                   "against the running kernel's own BTF "
                                   "(/sys/kernel/btf/vmlinux): remove it"),
        (["--config.skip-cache-size", "64"], "error: --config.skip-cache-size 64: "
                                             "ebpf_exporter's decoder skip cache is not "
                                             "supported by kernmlops export: remove it"),
        (["--web.listen-address", "fd://0"], "error: --web.listen-address fd://0: systemd "
                                             "socket activation (fd://) is not supported: give "
                                             "HOST:PORT (the unit in deploy/systemd binds the "
                                             "port itself)"),
        (["--web.telemetry-path", "metrics"], "error: --web.telemetry-path 'metrics': give a "
                                              "path below / of letters, digits and /._~-, e.g. "
                                              "/metrics"),
    ]:  # fmt: skip
        result = run("-c", "syscalls", *args)
        assert result.exit_code == 2, result.output
        assert result.output.strip() == line
    assert no_bpf == ["start"]


def test_a_bad_cgroup_id_map_is_refused_before_loading(tmp_path: Path) -> None:
    bad = tmp_path / "filter.yaml"
    bad.write_text(
        "metrics:\n"
        "  counters:\n"
        "    - {name: calls_total, help: calls, labels: []}\n"
        "cgroup_id_map:\n"
        "  name: ids\n"
        "  regexps: ['^(system.slice']\n"
    )
    result = run("--config", str(bad), "--check")
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert (
        "cgroup_id_map.regexps: regexps[0] '^(system.slice' is not a valid regexp" in result.output
    )
