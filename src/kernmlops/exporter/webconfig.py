"""``--web.config.file``: TLS and basic auth in the format of the Prometheus
exporter-toolkit (the file node_exporter takes; ebpf_exporter has none)::

    tls_server_config:
      cert_file: server.crt          # relative to this file's folder
      key_file: server.key
      client_ca_file: clients.crt    # optional: client certificates
      client_auth_type: RequireAndVerifyClientCert
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...         # bcrypt (htpasswd -nBC 10 "" | tr -d ':\\n')

Everything is checked before serving: keys, the certificate and key (loaded
into the context once), each hash. A file with neither section serves plain
HTTP, as exporter-toolkit does.

The exporter starts as root, and any of these files may sit where another user
can put something else at its name: each is a plain file (a FIFO would be
waited on for ever, or read as an empty file that serves plain HTTP) of a
bounded size (a device or a huge sparse file would be read to its end), read
once from one descriptor. The TLS library, which takes file names only, reads
the certificates and the key from a private in-memory copy of those bytes.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import hashlib
import os
import ssl
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernmlops.errors import ConfigError
from kernmlops.validation import key_path, keys_at, not_a_config, unknown_key
from kernmlops.yamlfile import not_plain, safe_yaml

#: the largest certificate, key or CA file read: PEM is a few KiB a certificate (a
#: system's whole CA bundle ~200 KiB); one far over it is no certificate file
PEM_MAX_BYTES = 1 << 20


class WebConfigError(ConfigError):
    """The web configuration file is missing, invalid, or names unusable files."""


_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
#: exporter-toolkit's client_auth_type values that Python's ssl module can do
#: (it cannot ask for a certificate without verifying it)
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsServerConfig(_Strict):
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] | None = None
    # Accepted so that a node_exporter file reads as it is; Python's ssl picks
    # the suites and curves of its OpenSSL (naming them is refused below).
    cipher_suites: list[str] | None = None
    curve_preferences: list[str] | None = None
    prefer_server_cipher_suites: bool | None = None
    client_allowed_sans: list[str] | None = None


class HttpServerConfig(_Strict):
    http2: bool = True
    headers: dict[str, str] = Field(default_factory=dict)


class WebConfigFile(_Strict):
    tls_server_config: TlsServerConfig | None = None
    http_server_config: HttpServerConfig | None = None
    basic_auth_users: dict[str, str] | None = None


@dataclass(frozen=True)
class WebConfig:
    """What the server needs from the file: a TLS context (None: plain HTTP),
    the users' bcrypt hashes (empty: no authentication), extra headers."""

    ssl_context: ssl.SSLContext | None = None
    users: tuple[tuple[str, bytes], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    source: str = ""

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context else "http"


def load_web_config(path: str | Path) -> WebConfig:
    """Read and check ``path``; every problem is a :class:`WebConfigError`."""
    path = Path(path)
    # a plain file, of at most yamlfile.MAX_BYTES (1 MiB: a thousand users' hashes fit)
    data = safe_yaml(path, what="web configuration", error=WebConfigError, plain=True)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise WebConfigError(f"--web.config.file {path}: the top level must be a mapping")
    if not_a_config(data):  # a password file given by mistake: its lines are not echoed
        raise WebConfigError(
            f"--web.config.file {path}: not a web configuration (no key of its top level "
            "looks like one; its lines are not shown)"
        )
    try:
        cfg = WebConfigFile.model_validate(data)
    except ValidationError as err:
        raise WebConfigError(_format(err, path)) from None
    where = f"--web.config.file {path}"
    ctx = _ssl_context(cfg.tls_server_config, path.parent, where)
    users = []
    for user, hashed in (cfg.basic_auth_users or {}).items():
        if ":" in str(user):
            raise WebConfigError(f"{where}: basic_auth_users: user {user!r} contains ':'")
        raw = str(hashed).encode()
        if not _is_bcrypt(raw):
            raise WebConfigError(
                f"{where}: basic_auth_users.{user}: not a bcrypt hash ($2a$/$2b$/$2y$...; "
                "make one with: htpasswd -nBC 10 '' | tr -d ':\\n')"
            )
        users.append((str(user), raw))
    headers = tuple((cfg.http_server_config or HttpServerConfig()).headers.items())
    _check_headers(headers, where)
    return WebConfig(ssl_context=ctx, users=tuple(users), headers=headers, source=str(path))


def _check_headers(headers: tuple[tuple[str, str], ...], where: str) -> None:
    """Refuse, at the start, a header the server could never send (a CR or LF in its
    value, a space or colon in its name): the rule is the HTTP library's own, which
    otherwise failed every scrape with an empty reply."""
    import h11

    for name, value in headers:
        try:
            h11.Response(status_code=200, headers=[(name, value)])
        except h11.LocalProtocolError as err:
            raise WebConfigError(
                f"{where}: http_server_config.headers.{name}: {err} (the server could not send it)"
            ) from None


def _format(err: ValidationError, path: Path) -> str:
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        where = key_path(loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            problems.append(
                f"{where}: {unknown_key(str(loc[-1]), keys_at(WebConfigFile, loc[:-1]))}"
            )
        else:
            problems.append(f"{where}: {e['msg']}")
    return f"--web.config.file {path}: " + "; ".join(problems)


def _is_bcrypt(raw: bytes) -> bool:
    # $2a$10$ + 53 characters (22 of salt, 31 of hash)
    return len(raw) == 60 and raw[:4] in (b"$2a$", b"$2b$", b"$2y$") and raw[6:7] == b"$"


def _ssl_context(tls: TlsServerConfig | None, base: Path, where: str) -> ssl.SSLContext | None:
    if tls is None:
        return None
    for key in ("cipher_suites", "curve_preferences", "client_allowed_sans"):
        if getattr(tls, key):
            raise WebConfigError(
                f"{where}: tls_server_config.{key} is not supported here (the TLS library's "
                "defaults apply); remove it"
            )
    if tls.client_auth_type not in _CLIENT_AUTH:
        raise WebConfigError(
            f"{where}: tls_server_config.client_auth_type {tls.client_auth_type!r} is not "
            f"supported (supported: {', '.join(_CLIENT_AUTH)})"
        )
    if not tls.cert_file or not tls.key_file:
        raise WebConfigError(f"{where}: tls_server_config needs both cert_file and key_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _TLS_VERSIONS[tls.min_version]
    if tls.max_version:
        ctx.maximum_version = _TLS_VERSIONS[tls.max_version]
    cert, key = (_resolve(base, f) for f in (tls.cert_file, tls.key_file))
    section = f"{where}: tls_server_config"
    cert_pem = _read_pem(cert, "cert_file", section)
    key_pem = _read_pem(key, "key_file", section)
    with _in_memory(cert_pem) as cert_at, _in_memory(key_pem) as key_at:
        _load_pair(ctx, (cert, cert_at), (key, key_at), section)
    mode = _CLIENT_AUTH[tls.client_auth_type]
    if tls.client_ca_file:
        ca = _resolve(base, tls.client_ca_file)
        ca_pem = _read_pem(ca, "client_ca_file", section)
        try:
            with _in_memory(ca_pem) as ca_at:
                ctx.load_verify_locations(cafile=ca_at)
        except (ssl.SSLError, OSError) as err:
            reason = getattr(err, "reason", None) or err.strerror or str(err)
            raise WebConfigError(f"{section}.client_ca_file {ca}: {reason}") from None
    elif mode != ssl.CERT_NONE:
        raise WebConfigError(
            f"{where}: tls_server_config: client_auth_type {tls.client_auth_type} needs "
            "client_ca_file"
        )
    ctx.verify_mode = mode
    return ctx


class _Encrypted(Exception):
    """The key asked for a passphrase."""


def _no_passphrase() -> str:
    raise _Encrypted


def _read_pem(path: Path, field: str, where: str) -> bytes:
    """The bytes of ``path`` (``field`` of the config), read once from one descriptor:
    a plain file of at most PEM_MAX_BYTES, else one line that names the field, the
    file and what it is."""
    from kernmlops.host.pinned import open_regular, read_bounded

    try:
        fd = open_regular(path)
    except FileNotFoundError:
        raise WebConfigError(f"{where}: no file {path}") from None
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise WebConfigError(f"{where}.{field} {path}: {err.strerror or err}") from None
        with contextlib.suppress(OSError):  # what it is, for the line (opened: refused)
            mode = os.stat(path).st_mode
            if stat.S_ISDIR(mode):
                raise WebConfigError(
                    f"{where}.{field} {path}: {os.strerror(errno.EISDIR)}"
                ) from None
            raise WebConfigError(
                f"{where}.{field} {path}: {not_plain(mode)}, not a plain file: not read"
            ) from None
        raise WebConfigError(f"{where}.{field} {path}: not a plain file: not read") from None
    with open(fd, "rb") as f:
        try:
            return read_bounded(
                f, PEM_MAX_BYTES, path, of_limit="a certificate or key file may hold"
            )
        except OSError as err:
            raise WebConfigError(f"{where}.{field} {path}: {err.strerror or err}") from None


@contextlib.contextmanager
def _in_memory(data: bytes) -> Iterator[str]:
    """A name for ``data`` that the TLS library can open (it takes file names only): a
    file in memory, this process's alone, so what it reads is what was checked."""
    fd = os.memfd_create("kernmlops-web-config", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _load_pair(
    ctx: ssl.SSLContext, cert_file: tuple[Path, str], key_file: tuple[Path, str], where: str
) -> None:
    """Load the certificate and key into ``ctx`` (each: its path as given, the name its
    checked bytes are read from), or say which file is wrong and how: OpenSSL's own
    error ("[SSL] PEM lib") names neither file nor what is wrong."""
    (cert, cert_at), (key, key_at) = cert_file, key_file
    try:  # the certificates alone, in a context of their own
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=cert_at)
    except ssl.SSLError:
        raise WebConfigError(
            f"{where}.cert_file {cert}: cannot be read as a PEM certificate "
            "(-----BEGIN CERTIFICATE-----)"
        ) from None
    try:
        ctx.load_cert_chain(cert_at, key_at, password=_no_passphrase)
    except _Encrypted:
        raise WebConfigError(
            f"{where}.key_file {key}: the key is encrypted (it asks for a passphrase): give "
            "it unencrypted (openssl pkey -in KEY -out KEY.plain)"
        ) from None
    except ssl.SSLError as err:
        if err.reason == "KEY_VALUES_MISMATCH":
            raise WebConfigError(
                f"{where}: {cert} and {key} do not form a pair: the key is not the certificate's"
            ) from None
        if err.reason is None:  # "PEM lib": the certificate was read above, the key not
            raise WebConfigError(
                f"{where}.key_file {key}: cannot be read as a PEM private key"
            ) from None
        raise WebConfigError(
            f"{where}: cannot load {cert} with {key}: {err.reason.replace('_', ' ').lower()}"
        ) from None


def _resolve(base: Path, name: str) -> Path:
    # exporter-toolkit: relative paths are relative to the config file's folder
    p = Path(name)
    return p if p.is_absolute() else base / p


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against the users' bcrypt hashes.

    bcrypt costs tens of milliseconds by design; a scraper sends the same
    header every time, so each distinct header's verdict is remembered (keyed
    by a digest, never the password), bounded, as exporter-toolkit caches its
    checks. Headers that passed and headers that failed are remembered apart:
    a flood of distinct wrong passwords evicts only other failures, and a
    scraper whose header passed once is answered without waiting for bcrypt.
    Unknown users are checked against a dummy hash, so that a reply's time does
    not tell which users exist."""

    def __init__(self, users: tuple[tuple[str, bytes], ...], cache_size: int = 256) -> None:
        import bcrypt  # only when a file configures users

        self._bcrypt = bcrypt
        self._users = dict(users)
        self._dummy = bcrypt.hashpw(b"not a password", bcrypt.gensalt(rounds=10))
        # passed, failed: each bounded, the oldest first
        self._cache: dict[bool, OrderedDict[bytes, None]] = {
            True: OrderedDict(),
            False: OrderedDict(),
        }
        self._size = cache_size
        self._lock = threading.Lock()

    def cached(self, header: str | None) -> bool | None:
        """The remembered verdict for this header, None when it must be checked."""
        if header is None:
            return False
        key = self._digest(header)
        with self._lock:
            for verdict, seen in self._cache.items():
                if key in seen:
                    return verdict
        return None

    def check(self, header: str | None) -> bool:
        """Verify (slow: run it off the event loop) and remember the verdict."""
        if header is None:
            return False
        found = self.cached(header)
        if found is not None:
            return found
        ok = self._verify(header)
        with self._lock:
            seen = self._cache[ok]
            seen[self._digest(header)] = None
            while len(seen) > self._size:
                seen.popitem(last=False)
        return ok

    def _verify(self, header: str) -> bool:
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = (
                base64.b64decode(value.strip(), validate=True).decode().partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        try:
            ok = self._bcrypt.checkpw(password.encode(), hashed or self._dummy)
        except ValueError:
            return False
        return bool(sep) and hashed is not None and ok

    @staticmethod
    def _digest(header: str) -> bytes:
        return hashlib.sha256(header.encode("utf-8", "surrogateescape")).digest()
