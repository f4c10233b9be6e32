"""`kernmlops export --web.config.file` where the file, or a certificate, key or CA
file it names, is no plain file of a sane size: a FIFO (put there by another user:
it waited for a writer for ever, or, with none, was read as an empty file that
serves plain HTTP), a device (read to its end, which never comes) or a huge sparse
file. Each is one line naming the field and the file, exit 2, promptly, before any
program is loaded. No root needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _export(web: Path) -> subprocess.CompletedProcess:
    # --tgid -1 is refused right after the web configuration: a run that took a bad
    # one for a good one stops there, without loading any program
    argv = [sys.executable, "-m", "kernmlops", "export", "-c", "syscalls",
            "--web.config.file", str(web), "--tgid", "-1"]  # fmt: skip
    try:
        # long: a starved interpreter (CI's idle lane) may take tens of seconds to start
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"export waited over 120 s on {web}")
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    (line,) = (done.stdout + done.stderr).strip().splitlines()
    return line


def test_a_web_config_file_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    os.mkfifo(web)
    line = _one_line(_export(web))
    assert line == f"error: cannot read web configuration {web}: a FIFO, not a plain file"


def test_a_fifo_whose_writer_never_writes_is_refused_not_waited_on(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    os.mkfifo(web)
    writer = os.open(web, os.O_RDWR)  # a writer that stays and sends nothing
    try:
        line = _one_line(_export(web))
    finally:
        os.close(writer)
    assert line == f"error: cannot read web configuration {web}: a FIFO, not a plain file"


@pytest.fixture
def tls(pki: Path) -> dict[str, Path]:
    return {"cert_file": pki / "server.crt", "key_file": pki / "server.key",
            "client_ca_file": pki / "ca.crt"}  # fmt: skip


def _web(tmp_path: Path, files: dict[str, Path]) -> Path:
    web = tmp_path / "web.yml"
    lines = [f"  {field}: {path}" for field, path in files.items()]
    web.write_text("tls_server_config:\n" + "\n".join(lines) + "\n")
    return web


@pytest.mark.parametrize("field", ["cert_file", "key_file", "client_ca_file"])
def test_a_tls_file_that_is_a_fifo_is_refused_by_its_field(
    tmp_path: Path, tls: dict[str, Path], field: str
) -> None:
    fifo = tmp_path / f"{field}.pem"
    os.mkfifo(fifo)
    web = _web(tmp_path, {**tls, field: fifo})
    line = _one_line(_export(web))
    assert line == (
        f"error: --web.config.file {web}: tls_server_config.{field} {fifo}: a FIFO, "
        "not a plain file: not read"
    )


def test_a_tls_file_that_is_a_device_is_refused(tmp_path: Path, tls: dict[str, Path]) -> None:
    web = _web(tmp_path, {**tls, "cert_file": Path("/dev/zero")})
    line = _one_line(_export(web))
    assert line == (
        f"error: --web.config.file {web}: tls_server_config.cert_file /dev/zero: a device, "
        "not a plain file: not read"
    )


@pytest.mark.parametrize("field", ["cert_file", "client_ca_file"])
def test_a_huge_sparse_tls_file_is_refused_by_its_size(
    tmp_path: Path, tls: dict[str, Path], field: str
) -> None:
    huge = tmp_path / "huge.pem"
    with huge.open("wb") as f:
        f.truncate(1 << 40)  # 1 TiB of holes: no disk, and read to its end, never done
    web = _web(tmp_path, {**tls, field: huge})
    line = _one_line(_export(web))
    assert line == (
        f"error: --web.config.file {web}: tls_server_config.{field} {huge}: 1024.0 GiB, over "
        "the 1.0 MiB a certificate or key file may hold: not read"
    )


def test_the_files_as_they_should_be_pass_to_the_next_check(
    tmp_path: Path, tls: dict[str, Path]
) -> None:
    """The same files, plain: past the web configuration (to --tgid's refusal)."""
    web = _web(tmp_path, {**tls, "client_auth_type": "RequireAndVerifyClientCert"})  # type: ignore[dict-item]
    line = _one_line(_export(web))
    assert line == "error: --tgid -1: a process id is positive"
