"""`kernmlops collect --export` refused before anything is set up (a bad web config, a
busy port): no BPF is loaded, so these run beside the main lane (tests/lanes.py); the
collections that serve are test_collect_export.py's."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--web.config.file", "{web}"], "--web.config.file {web}: serves --export's metrics"),
        (["--export", "127.0.0.1:0", "--web.config.file", "{web}"],
         "--web.config.file {web}: tls_server_config: no file"),
        (["--export", "127.0.0.1:0", "--web.config.file", "{missing}"], "{missing}"),
    ],
)  # fmt: skip
def test_collect_a_bad_web_config_is_one_line_before_collecting(
    tmp_path: Path, args: list[str], message: str
) -> None:
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: none.crt\n  key_file: none.key\n")
    names = {"web": web, "missing": tmp_path / "missing.yml"}
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-o", str(out),
         *(a.format(**names) for a in args), "--", "true"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,  # no overrides.yaml
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert message.format(**names) in lines[0]
    assert not out.exists()  # nothing collected


def test_collect_a_busy_export_port_is_refused_before_anything_is_set_up(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-o", str(out),
             "--export", f"127.0.0.1:{port}", "--", "true"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip
    # the status of a condition that may pass (sysexits.h's EX_TEMPFAIL), as export's
    assert done.returncode == 75, done.stderr
    assert (
        done.stderr.strip() == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    # no collection folder (so no .spool in it nor in /dev/shm: no collection id was made)
    assert not out.exists()
    # and --help says so
    from click.testing import CliRunner

    from kernmlops.cli import cli

    shown = CliRunner().invoke(cli, ["collect", "--help"]).output
    assert "is refused before collecting, exit 75" in " ".join(shown.split())
