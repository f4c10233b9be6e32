"""`kernmlops collect --export`: a running collection serves the metric sets,
restricted to the benchmark's process tree like the hooks."""

from __future__ import annotations

import base64
import http.client
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import only_collection
from tests.exporter.conftest import client_context, hash_password
from tests.exporter.test_exporter_bpf import free_port

pytestmark = pytest.mark.bpf

CALLS = 4321
PASSWORD = "s3cret pass:word"  # a ':' in the password is allowed
CHILD = f"import os, time\nfor _ in range({CALLS}):\n    os.getppid()\ntime.sleep(30)\n"


def test_collect_serves_the_metrics_of_its_processes(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    collect = subprocess.Popen(
        [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-o", str(tmp_path),
         "--hooks", "process_trace", "--export", f"127.0.0.1:{port}", "-d", "20",
         "--", sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        seen = 0.0
        deadline = time.monotonic() + 60
        while seen < CALLS and time.monotonic() < deadline and collect.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    text = resp.read().decode()
            except OSError:
                time.sleep(0.2)
                continue
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == "kernmlops_syscalls_total" and s.labels["syscall"] == "getppid":
                        seen = s.value
            time.sleep(0.2)
        # only the benchmark's tree is counted: exactly its calls
        assert seen == CALLS
    finally:
        collect.terminate()  # SIGTERM: the collection stops and keeps what it has
        # and serves its final values until a scrape takes them (30 s before it knows
        # the scraper's interval): a scraper's next scrape does
        final = scrape_until_exit(collect, url)
        out, _ = collect.communicate(timeout=60)
    assert collect.returncode == 128 + 15, out
    assert final == CALLS, out
    manifest = only_collection(tmp_path)
    assert manifest is not None
    exported = manifest.manifest["exporter"]
    assert exported["url"] == url
    syscalls = exported["sets"]["syscalls"]
    assert syscalls["loaded"] and syscalls["error"] is None and syscalls["attached"] == 2
    with pytest.raises(OSError):  # the server is gone with the collection
        urllib.request.urlopen(url, timeout=2)


def scrape_until_exit(collect: subprocess.Popen, url: str, timeout_s: float = 60) -> float | None:
    """Scrape every 0.1 s until ``collect`` exits: the last getppid count served."""
    last = None
    deadline = time.monotonic() + timeout_s
    while collect.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            time.sleep(0.1)
            continue
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "kernmlops_syscalls_total" and s.labels["syscall"] == "getppid":
                    last = s.value
        time.sleep(0.1)
    return last


JOB_CALLS = 1_000_000
JOB = f"import os\nfor _ in range({JOB_CALLS}):\n    os.getppid()\n"


def scrape_job_every_second(tmp_path: Path, *extra: str) -> tuple[float | None, int, str, int]:
    """Run JOB under collect --export while scraping once a second, as
    Prometheus would: the last getppid count seen, the scrapes, the output and
    the exit code."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    collect = subprocess.Popen(
        [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-o", str(tmp_path),
         "--hooks", "process_trace", "--export", f"127.0.0.1:{port}", *extra,
         "--", sys.executable, "-c", JOB],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    last, scrapes = None, 0
    try:
        deadline = time.monotonic() + 120
        while collect.poll() is None and time.monotonic() < deadline:
            tick = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    text = resp.read().decode()
            except OSError:
                time.sleep(0.1)
                continue
            scrapes += 1
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == "kernmlops_syscalls_total" and s.labels["syscall"] == "getppid":
                        last = s.value
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    finally:
        if collect.poll() is None:
            collect.terminate()
        out, _ = collect.communicate(timeout=60)
    return last, scrapes, out, collect.returncode


def test_final_values_are_served_until_scraped(tmp_path: Path) -> None:
    """A job that ends between two scrapes: the collection keeps serving its
    final values until the next scrape took them, so the last value a 1 s
    scraper saw is the job's own count, exactly."""
    last, scrapes, out, code = scrape_job_every_second(tmp_path)
    assert code == 0, out
    assert "serving the final values" in out
    assert last == JOB_CALLS, (last, scrapes, out)
    manifest = only_collection(tmp_path)
    assert manifest is not None
    assert manifest.manifest["exporter"]["scrapes"] >= scrapes


def _scrape(
    url: str, ctx: ssl.SSLContext | None, auth: tuple[str, str] | None, method: str = "GET"
) -> tuple[int, str]:
    """GET ``url``: (status, body); an HTTP error's status with its body."""
    request = urllib.request.Request(url, method=method)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5, context=ctx) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_collect_export_serves_tls_and_basic_auth(pki: Path, tmp_path: Path) -> None:
    """--web.config.file as `kernmlops export` takes it: the collection's metrics over
    TLS to a client that checks the certificate, and only with the right password."""
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config:\n"
        f"  cert_file: {pki / 'server.crt'}\n"
        f"  key_file: {pki / 'server.key'}\n"
        f"basic_auth_users:\n  prometheus: '{hash_password(PASSWORD, b'$2y$')}'\n"
    )
    port = free_port()
    url = f"https://127.0.0.1:{port}/metrics"
    collect = subprocess.Popen(
        [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-o", str(tmp_path / "out"),
         "--hooks", "process_trace", "--export", f"127.0.0.1:{port}", "--export-grace", "0",
         "--web.config.file", str(web), "-d", "30", "--", sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    ctx = client_context(pki)
    right = ("prometheus", PASSWORD)
    index = url.removesuffix("/metrics") + "/"
    scraped = 0  # pages of metrics this client received
    try:
        # ready once / answers (not a scrape: a probe timed out while the probes attach
        # is answered later, and must not count)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and collect.poll() is None:
            try:
                if _scrape(index, ctx, right)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        seen = 0.0
        while seen < CALLS and time.monotonic() < deadline and collect.poll() is None:
            status, text = _scrape(url, ctx, right)
            assert status == 200, text
            scraped += 1
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == "kernmlops_syscalls_total" and s.labels["syscall"] == "getppid":
                        seen = s.value
            time.sleep(0.2)
        assert seen == CALLS
        for wrong in (("prometheus", "wrong"), ("nobody", PASSWORD)):
            status, text = _scrape(url, ctx, wrong)
            assert status == 401 and "kernmlops_syscalls_total" not in text
        assert _scrape(url, ctx, None)[0] == 401
        assert _scrape(url.replace("/metrics", "/nothing"), ctx, right)[0] == 404
        assert _scrape(url, ctx, right, method="HEAD") == (200, "")
        # a client that does not trust the certificate gets nothing
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            _scrape(url, ssl.create_default_context(), right)
    finally:
        collect.terminate()
        out, _ = collect.communicate(timeout=60)
    assert collect.returncode == 128 + 15, out
    assert f"metrics at https://127.0.0.1:{port}/metrics" in out
    manifest = only_collection(tmp_path / "out")
    assert manifest is not None and manifest.manifest["exporter"]["url"] == url
    # the scrapes this client made and received, not the 401s, the 404, / or the HEAD;
    # the maps were read once more, for the HEAD
    exported = manifest.manifest["exporter"]
    assert scraped > 0 and exported["scrapes"] == scraped, (exported, scraped)
    assert exported["renders"] == scraped + 1, exported


#: `kernmlops collect ARGS` where, once the web config was read, another user's plain
#: one (no TLS, no auth) is put at its name at once: what a user who may write in its
#: folder can do between collect's check of the file and the exporter's start
SWAP_AFTER_READ = r"""
import os, sys
from pathlib import Path
import kernmlops.exporter.webconfig as webconfig
web = Path(sys.argv[1])
read = webconfig.safe_yaml
def read_then_swap(path, **kwargs):
    data = read(path, **kwargs)
    if Path(path) == web:
        plain = web.with_name("plain.yml")
        plain.write_text("{}\n")
        os.replace(plain, web)
    return data
webconfig.safe_yaml = read_then_swap
sys.argv = ["kernmlops", *sys.argv[2:]]
from kernmlops.cli import main
main()
"""


def test_collect_export_serves_the_web_config_it_checked(pki: Path, tmp_path: Path) -> None:
    """The web config is read once, checked before any BPF work, and served as read: a
    plain one put at its name after that read leaves TLS and basic auth on."""
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config:\n"
        f"  cert_file: {pki / 'server.crt'}\n"
        f"  key_file: {pki / 'server.key'}\n"
        f"basic_auth_users:\n  prometheus: '{hash_password(PASSWORD, b'$2b$')}'\n"
    )
    port = free_port()
    url = f"https://127.0.0.1:{port}/metrics"
    collect = subprocess.Popen(
        [sys.executable, "-c", SWAP_AFTER_READ, str(web), "collect", "--no-progress",
         "-o", str(tmp_path / "out"), "--hooks", "process_trace", "--export",
         f"127.0.0.1:{port}", "--export-grace", "0", "--web.config.file", str(web), "-d", "30",
         "--", sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    ctx = client_context(pki)
    right = ("prometheus", PASSWORD)
    served = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and collect.poll() is None:
            try:
                served = _scrape(url, ctx, right)
                break
            except OSError:  # not listening yet (or, swapped, no TLS)
                time.sleep(0.2)
        assert web.read_text() == "{}\n"  # swapped after collect read it
        assert served is not None and served[0] == 200, served
        assert "kernmlops_syscalls_total" in served[1]
        assert _scrape(url, ctx, None)[0] == 401  # basic auth stays on too
        try:  # plain HTTP gets no metrics
            plain = _scrape(url.replace("https:", "http:"), None, right)
        except (http.client.HTTPException, OSError):
            plain = None
        assert plain is None or "kernmlops_syscalls_total" not in plain[1]
    finally:
        collect.terminate()
        out, _ = collect.communicate(timeout=60)
    assert collect.returncode == 128 + 15, out
