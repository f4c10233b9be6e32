"""The tests of test_deploy.py that need root and BPF (the main lane), apart from the
others so that those run beside it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import needs_tools
from tests.exporter.conftest import LiveExporter, free_port
from tests.exporter.test_deploy import (
    UNIT,
    _activity,
    _query,
    _seconds,
    dashboard_queries,
    unit_command,
    unit_sets,
    unit_settings,
)


@pytest.mark.bpf  # root: the port is reached after the privilege check
def test_the_unit_restarts_the_exporter_when_its_port_is_busy(tmp_path: Path) -> None:
    """A port busy at boot (the previous instance still exiting, a restart race) may
    be free 5 s later: the exporter's own command line, on a port really held, exits
    with a status that Restart=on-failure restarts (not RestartPreventExitStatus's),
    in one line, and the unit bounds the retries by a start limit."""
    text = UNIT.read_text()
    settings = unit_settings(text)
    assert settings["Restart"] == "on-failure"
    prevented = {int(s) for s in settings["RestartPreventExitStatus"].split()}
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users: {}\n")
    # every interface, as the unit listens (":PORT"): held by another socket
    with socket.create_server(("0.0.0.0", 0)) as busy:
        port = busy.getsockname()[1]
        out = subprocess.run(
            unit_command(settings, web, f":{port}"), capture_output=True, text=True, timeout=60
        )
    assert out.returncode not in (0, *prevented), out.stdout + out.stderr
    assert out.returncode == 75  # sysexits.h's EX_TEMPFAIL, as --help says
    assert out.stderr.strip().splitlines() == [
        f"error: cannot listen on :{port}: Address already in use"
    ]
    # retried, but not forever: a port held for good ends in the failed state
    assert int(settings["StartLimitBurst"]) * 5 < _seconds(settings["StartLimitIntervalSec"])
    assert settings["RestartSec"] == "5s"


@pytest.mark.bpf
@needs_tools("setpriv")
def test_the_units_capabilities_and_no_new_privileges_still_load_the_programs() -> None:
    settings = unit_settings(UNIT.read_text())
    caps = ",".join(
        "+" + c.removeprefix("CAP_").lower() for c in settings["CapabilityBoundingSet"].split()
    )
    cmd = ["setpriv", "--no-new-privs", "--bounding-set", f"-all,{caps}", sys.executable]
    cmd += ["-m", "kernmlops.exporter", "--check"]
    cmd += [x for s in unit_sets(settings) for x in ("-c", s)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "check passed" in out.stdout + out.stderr


@pytest.mark.bpf
@needs_tools("promtool", "prometheus")
def test_every_dashboard_query_parses_and_returns_data_from_a_real_prometheus(
    live_exporter: LiveExporter, tmp_path: Path
) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 10
    # promtool parses each expression (as a recording rule)
    rules = tmp_path / "rules.yml"
    recorded = [{"record": f"dashboard:q{i}", "expr": e} for i, (_, e) in enumerate(queries)]
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    out = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr

    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: kernmlops\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{live_exporter.port}']}}]\n"
    )
    # the block I/O must reach a disk: not a tmpfs
    io_dir = Path(tempfile.mkdtemp(prefix="kmo-dash-", dir="/var/tmp"))
    stop = threading.Event()
    worker = threading.Thread(target=_activity, args=(stop, io_dir), daemon=True)
    log = (tmp_path / "prometheus.log").open("w")
    prom = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    api = f"http://127.0.0.1:{prom_port}"
    try:
        worker.start()
        pending = dict(enumerate(queries))
        deadline = time.monotonic() + 25
        while pending and time.monotonic() < deadline:
            time.sleep(1)
            for i, (_, expr) in list(pending.items()):
                try:
                    result = _query(api, expr)
                except OSError:
                    break  # Prometheus is not up yet
                if any(r["value"][1] != "NaN" for r in result):
                    del pending[i]
        assert not pending, f"no data for: {list(pending.values())}"
    finally:
        stop.set()
        worker.join()
        prom.terminate()
        prom.wait(timeout=20)
        log.close()
        shutil.rmtree(io_dir, ignore_errors=True)
