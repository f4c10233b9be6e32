"""--web.config.file: the exporter-toolkit format read and checked, and a server
that speaks TLS (certificates made here by the openssl command) and asks for
basic auth (bcrypt hashes), tested with Python's TLS client and http.client.
No root."""

from __future__ import annotations

import base64
import http.client
import re
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from kernmlops.exporter.server import MetricsServer
from kernmlops.exporter.webconfig import WebConfigError, load_web_config
from tests.exporter.conftest import client_context as _client_ctx
from tests.exporter.conftest import hash_password as _hash

BODY = b"x_total 1.0\n"
PASSWORD = "s3cret pass:word"  # a ':' in the password is allowed


def _get(
    server: MetricsServer, ctx: ssl.SSLContext | None, auth: tuple[str, str] | None = None
) -> tuple[int, bytes, http.client.HTTPMessage]:
    if ctx is not None:
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            "127.0.0.1", server.port, timeout=60, context=ctx
        )
    else:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {}
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.headers
    finally:
        conn.close()


def test_tls_and_basic_auth_with_a_real_tls_client_and_a_wrong_password(
    pki: Path, tmp_path: Path
) -> None:
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config:\n"
        f"  cert_file: {pki / 'server.crt'}\n"
        f"  key_file: {pki / 'server.key'}\n"
        "basic_auth_users:\n"
        f"  prometheus: '{_hash(PASSWORD, b'$2y$')}'\n"  # htpasswd's form
        f"  other: '{_hash('other')}'\n"
    )
    config = load_web_config(web)
    with MetricsServer(lambda: BODY, "127.0.0.1", 0, web_config=config) as server:
        assert server.url.startswith("https://127.0.0.1:")
        ctx = _client_ctx(pki)
        status, body, _ = _get(server, ctx, ("prometheus", PASSWORD))
        assert status == 200 and body.startswith(BODY)
        assert _get(server, ctx, ("other", "other"))[0] == 200
        for wrong in (("prometheus", "wrong"), ("nobody", PASSWORD), ("other", PASSWORD)):
            status, body, headers = _get(server, ctx, wrong)
            assert status == 401 and BODY not in body
            assert headers["WWW-Authenticate"].startswith("Basic ")
        assert _get(server, ctx)[0] == 401  # no credentials
        # the right password again (the verdict is remembered, never the password)
        assert _get(server, ctx, ("prometheus", PASSWORD))[0] == 200
        # plain HTTP to the TLS port gets no metrics
        try:
            plain = _get(server, None, ("prometheus", PASSWORD))
        except (http.client.HTTPException, OSError):
            plain = None
        assert plain is None or BODY not in plain[1]
        # a client that does not trust the certificate refuses it
        with pytest.raises(ssl.SSLCertVerificationError):
            _get(server, ssl.create_default_context())


def test_client_certificates_are_required_when_configured(pki: Path, tmp_path: Path) -> None:
    # relative paths are relative to the file's folder, as exporter-toolkit has it
    web = pki / "mtls.yml"
    web.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_ca_file: ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n"
        "  min_version: TLS13\n"
    )
    with MetricsServer(lambda: BODY, "127.0.0.1", 0, web_config=load_web_config(web)) as server:
        assert _get(server, _client_ctx(pki, cert=True))[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _get(server, _client_ctx(pki, cert=False))


def test_a_file_without_tls_or_users_serves_plain_http(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    with MetricsServer(lambda: BODY, "127.0.0.1", 0, web_config=load_web_config(web)) as server:
        status, _, headers = _get(server, None)
        assert status == 200 and headers["X-Frame-Options"] == "deny"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config:\n  cert_fle: a\n", "did you mean 'cert_file'"),
        ("basic_auth_user:\n  a: b\n", "did you mean 'basic_auth_users'"),
        ("tls_server_config:\n  cert_file: a.crt\n", "needs both cert_file and key_file"),
        # ssl names no file: the first missing one is named, as the file resolves it
        ("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n", "no file {dir}/a.crt$"),
        ("basic_auth_users:\n  prometheus: plaintext\n", "not a bcrypt hash"),
        ("tls_server_config:\n  min_version: TLS99\n", "min_version"),
        ("- a\n", "must be a mapping"),
        ("tls_server_config:\n  client_auth_type: RequestClientCert\n", "not supported"),
        # a header the server could never send: every scrape failed with an empty reply
        (
            'http_server_config:\n  headers:\n    X-Foo: "a\\r\\nX-Injected: yes"\n',
            r"headers.X-Foo: Illegal header value .* \(the server could not send it\)$",
        ),
        ("http_server_config:\n  headers:\n    X Foo: a\n", r"headers.X Foo: Illegal header name"),
    ],
)
def test_bad_files_are_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    web = tmp_path / "web.yml"
    web.write_text(text)
    with pytest.raises(
        WebConfigError, match=message.replace("{dir}", re.escape(str(tmp_path)))
    ) as info:
        load_web_config(web)
    assert "\n" not in str(info.value) and str(web) in str(info.value)


def test_a_missing_key_is_named_when_the_certificate_is_there(pki: Path, tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n  key_file: gone.key\n")
    with pytest.raises(WebConfigError) as info:
        load_web_config(web)
    assert str(info.value).endswith(f"tls_server_config: no file {tmp_path / 'gone.key'}")


def test_a_pair_that_does_not_load_names_the_file_and_what_is_wrong(
    pki: Path, tmp_path: Path
) -> None:
    """Not OpenSSL's "[SSL] PEM lib (_ssl.c:3905)": which file, and that the two are
    no pair, or one is not PEM, or the key wants a passphrase."""
    junk = tmp_path / "junk.pem"
    junk.write_text("not PEM at all\n")
    encrypted = tmp_path / "enc.key"
    subprocess.run(
        ["openssl", "pkey", "-in", pki / "server.key", "-aes128", "-passout", "pass:x",
         "-out", encrypted],
        check=True, capture_output=True,
    )  # fmt: skip
    unreadable = tmp_path / "unreadable.key"
    unreadable.mkdir()  # a folder: open() fails, also for root
    web = tmp_path / "web.yml"
    where = f"--web.config.file {web}: tls_server_config"
    crt, key = pki / "server.crt", pki / "server.key"
    for cert_file, key_file, message in [
        (crt, pki / "client.key",
         f"{where}: {crt} and {pki / 'client.key'} do not form a pair: the key is not the "
         "certificate's"),
        (junk, key, f"{where}.cert_file {junk}: cannot be read as a PEM certificate "
                    "(-----BEGIN CERTIFICATE-----)"),
        (key, key, f"{where}.cert_file {key}: cannot be read as a PEM certificate "
                   "(-----BEGIN CERTIFICATE-----)"),
        (crt, junk, f"{where}.key_file {junk}: cannot be read as a PEM private key"),
        (crt, crt, f"{where}.key_file {crt}: cannot be read as a PEM private key"),
        (crt, encrypted,
         f"{where}.key_file {encrypted}: the key is encrypted (it asks for a passphrase): give "
         "it unencrypted (openssl pkey -in KEY -out KEY.plain)"),
        (crt, unreadable, f"{where}.key_file {unreadable}: Is a directory"),
    ]:  # fmt: skip
        web.write_text(f"tls_server_config:\n  cert_file: {cert_file}\n  key_file: {key_file}\n")
        with pytest.raises(WebConfigError) as info:
            load_web_config(web)
        assert str(info.value) == message
    # and the pair that fits loads
    web.write_text(f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n")
    assert load_web_config(web).scheme == "https"


def test_plain_http_to_the_tls_port_is_told_so_as_go_tells_it(pki: Path, tmp_path: Path) -> None:
    """Go's servers answer 400 "Client sent an HTTP request to an HTTPS server."; an
    empty reply left the operator guessing. TLS clients are served as before, and a
    connection that sends nothing is closed as idle."""
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n  key_file: {pki / 'server.key'}\n"
    )
    config = load_web_config(web)
    # the default deadline (10 s) for the handshakes: 1 s from accept may pass before
    # a starved test's client (in CI's idle lane) has answered the server
    with MetricsServer(lambda: BODY, "127.0.0.1", 0, web_config=config) as server:
        for _ in range(2):
            status, body, headers = _get(server, None)
            assert status == 400
            assert body == b"Client sent an HTTP request to an HTTPS server.\n"
            assert headers["Connection"] == "close"
            status, body, _ = _get(server, _client_ctx(pki))
            assert status == 200 and body.startswith(BODY)
        assert server.stats.responses == {400: 2, 200: 2}
        assert server.stats.closed == {"bad_request": 2}
    with MetricsServer(lambda: BODY, "127.0.0.1", 0, web_config=config, timeout_s=1.0) as server:
        silent = socket.create_connection(("127.0.0.1", server.port))
        try:
            silent.settimeout(60)
            assert silent.recv(1) == b""  # closed by the server at the timeout
        finally:
            silent.close()
        assert server.stats.responses == {}
        assert server.stats.closed == {"idle": 1}


def test_wrong_passwords_never_evict_a_header_that_passed() -> None:
    # 300 distinct wrong passwords (more than the cache holds) once evicted the
    # scraper's good header: its next scrape waited behind their bcrypt checks
    from kernmlops.exporter.webconfig import BasicAuth

    def header(password: str) -> str:
        return "Basic " + base64.b64encode(f"prom:{password}".encode()).decode()

    auth = BasicAuth((("prom", _hash("s3cret").encode()),), cache_size=8)
    good = header("s3cret")
    assert auth.cached(good) is None and auth.check(good) is True
    calls = []
    verify = auth._verify
    auth._verify = lambda h: calls.append(h) or verify(h)  # type: ignore[method-assign]
    for i in range(20):
        assert auth.check(header(f"wrong-{i}")) is False
    assert len(calls) == 20  # each checked by bcrypt once
    assert auth.cached(good) is True and auth.check(good) is True
    assert len(calls) == 20  # the good header: from the cache, no bcrypt
    assert auth.check(header("wrong-19")) is False and len(calls) == 20  # a recent failure too
    assert auth.cached(header("wrong-0")) is None  # the oldest failures make room
