"""Label decoders: raw bytes of a map key to a label value, as small chains.

Each label's chain starts with the label's raw key bytes. ``uint`` and
``string`` turn bytes into text; the others take a number, as raw bytes
(first in a chain) or as the decimal text ``uint`` made, so ``[uint,
static_map]`` and ``[static_map]`` read the same. A decoder that cannot
decode raises :class:`DecodeError` (the label set is dropped and counted as a
decoder error); ``regexp`` raises :class:`DropLabelSet` for label sets it does
not keep, which is no error.
"""

from __future__ import annotations

import errno as errno_module
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from kernmlops.exporter.config import DecoderSpec, LabelSpec
from kernmlops.host.kallsyms import KALLSYMS, KernelSymbols

Value = bytes | str


class DecodeError(Exception):
    """A value a decoder cannot decode."""


class LabelDecodeError(DecodeError):
    """A label of a key could not be decoded: which label, which decoder, why."""

    def __init__(self, label: str, decoder: str, reason: str) -> None:
        self.label, self.decoder, self.reason = label, decoder, reason
        super().__init__(f"label {label}, decoder {decoder}: {reason}")


class DropLabelSet(Exception):
    """The label set is not wanted (regexp did not match)."""


def as_int(value: Value, *, signed: bool = False) -> int:
    """A number from raw little-endian key bytes or from decimal text."""
    if isinstance(value, bytes):
        if len(value) not in (1, 2, 4, 8):
            raise DecodeError(f"{len(value)} bytes are no integer")
        return int.from_bytes(value, "little", signed=signed)
    try:
        return int(value, 10)
    except ValueError:
        raise DecodeError(f"{value!r} is not a number") from None


def as_text(value: Value) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", errors="replace")
    return value


# --- system sources (paths injectable for tests) ----------------------------------
def cgroup2_mount(mountinfo: Path = Path("/proc/self/mountinfo")) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or
    /sys/fs/cgroup/unified on hybrid systems); None without one."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if " - " not in line:
            continue
        after = line.split(" - ", 1)[1].split()
        if after and after[0] == "cgroup2":
            return Path(fields[4].replace("\\040", " "))
    return None


class Kallsyms:
    """Kernel symbols by address, from /proc/kallsyms (read once, on first use)."""

    def __init__(self, path: Path = KALLSYMS) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._symbols: KernelSymbols | None = None

    def load(self) -> None:
        with self._lock:
            if self._symbols is None:
                symbols = KernelSymbols.load(self.path)  # text symbols (kernmlops.host)
                if not len(symbols):
                    raise DecodeError(
                        f"{self.path} shows no addresses (kptr_restrict): "
                        "the exporter must run as root"
                    )
                self._symbols = symbols

    def name(self, addr: int) -> str:
        """The function that contains ``addr`` (its address or an IP in it)."""
        self.load()
        assert self._symbols is not None
        found = self._symbols.name(addr)
        if found is None:
            raise DecodeError(f"no kernel symbol at {addr:#x}")
        return found


class CgroupPaths:
    """cgroup v2 id (its directory's inode number) -> path below the mount, by
    walking the hierarchy; walked again when an unknown id shows up, at most
    once a second."""

    def __init__(self, root: Path | None = None, *, rescan_s: float = 1.0) -> None:
        self._root = root
        self.rescan_s = rescan_s
        self._paths: dict[int, str] = {}
        self._scanned_at = float("-inf")
        self._lock = threading.Lock()

    @cached_property
    def root(self) -> Path:
        root = self._root or cgroup2_mount()
        if root is None:
            raise DecodeError("no cgroup v2 hierarchy is mounted")
        return root

    def scan(self) -> None:
        paths: dict[int, str] = {}
        stack = [(self.root, "/")]
        while stack:
            directory, rel = stack.pop()
            try:
                paths[os.stat(directory).st_ino] = rel
                with os.scandir(directory) as it:
                    for entry in it:
                        if entry.is_dir(follow_symlinks=False):
                            child = rel.rstrip("/") + "/" + entry.name
                            stack.append((Path(entry.path), child))
            except OSError:
                continue  # removed while we walked
        self._paths = paths
        self._scanned_at = time.monotonic()

    def path(self, cgroup_id: int) -> str:
        with self._lock:
            found = self._paths.get(cgroup_id)
            if found is None and time.monotonic() - self._scanned_at >= self.rescan_s:
                self.scan()
                found = self._paths.get(cgroup_id)
        if found is None:
            raise DecodeError(f"no cgroup with id {cgroup_id} under {self.root}")
        return found

    def id_of(self, path: str | Path) -> tuple[int, int]:
        """(id, depth below the root) of a cgroup given by its path below the
        mount, or by its full path."""
        p = Path(path)
        full = p if p.is_relative_to(self.root) else self.root / str(p).lstrip("/")
        try:
            st = os.stat(full)
        except OSError as err:
            raise DecodeError(f"cgroup {path} not found ({full}: {err.strerror})") from None
        if not full.is_dir():
            raise DecodeError(f"cgroup {path}: {full} is not a directory")
        return st.st_ino, len(full.resolve().relative_to(self.root.resolve()).parts)


#: errno names the kernel uses inside (include/linux/errno.h); a syscall's
#: exit tracepoint can see them before the restart logic turns them around
KERNEL_ERRNOS = {
    512: "ERESTARTSYS", 513: "ERESTARTNOINTR", 514: "ERESTARTNOHAND", 515: "ENOIOCTLCMD",
    516: "ERESTART_RESTARTBLOCK", 517: "EPROBE_DEFER", 518: "EOPENSTALE", 519: "ENOPARAM",
    521: "EBADHANDLE", 522: "ENOTSYNC", 523: "EBADCOOKIE", 524: "ENOTSUPP", 525: "ETOOSMALL",
    526: "ESERVERFAULT", 527: "EBADTYPE", 528: "EJUKEBOX", 529: "EIOCBQUEUED",
    530: "ERECALLCONFLICT", 531: "ENOGRACE",
}  # fmt: skip
#: where Python's errno picks an alias, the name Linux' headers use first
_ERRNO_CANONICAL = {"EDEADLOCK": "EDEADLK", "ENOTSUP": "EOPNOTSUPP", "EWOULDBLOCK": "EAGAIN"}


def errno_name(number: int) -> str:
    n = abs(number)
    name = errno_module.errorcode.get(n) or KERNEL_ERRNOS.get(n)
    if name is None:
        raise DecodeError(f"{number} is no errno")
    return _ERRNO_CANONICAL.get(name, name)


@dataclass
class DecoderContext:
    """Shared, lazily read system sources; tests hand in their own."""

    kallsyms: Kallsyms = field(default_factory=Kallsyms)
    cgroups: CgroupPaths = field(default_factory=CgroupPaths)
    sys_dev_block: Path = Path("/sys/dev/block")
    syscalls: Callable[[], dict[int, str]] | None = None

    @cached_property
    def syscall_names(self) -> dict[int, str]:
        if self.syscalls is not None:
            return self.syscalls()
        from kernmlops.syscall_names import syscall_table

        return syscall_table()

    def block_device(self, major: int, minor: int) -> str | None:
        try:
            text = (self.sys_dev_block / f"{major}:{minor}" / "uevent").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("DEVNAME="):
                return line.removeprefix("DEVNAME=")
        return None


# --- the decoders ---------------------------------------------------------------
Decoder = Callable[[Value], Value]


def build_decoder(spec: DecoderSpec, ctx: DecoderContext) -> Decoder:
    """The function of one step of a chain."""
    name = spec.name
    if name == "uint":
        signed = bool(spec.signed)
        return lambda v: str(as_int(v, signed=signed))
    if name in ("string", "comm"):
        return as_text
    if name == "static_map":
        table = dict(spec.static_map or {})
        default = spec.default

        def static_map(v: Value) -> str:
            key = str(as_int(v)) if isinstance(v, bytes) else v
            found = table.get(key)
            if found is not None:
                return found
            return default if default is not None else f"unknown:{key}"

        return static_map
    if name == "ksym":
        return lambda v: ctx.kallsyms.name(as_int(v))
    if name == "syscall":

        def syscall(v: Value) -> str:
            n = as_int(v)
            return ctx.syscall_names.get(n) or f"unknown:{n}"

        return syscall
    if name == "majorminor":
        user = spec.encoding == "user"
        numbers = spec.output == "numbers"

        def majorminor(v: Value) -> str:
            dev = as_int(v)
            major, minor = (os.major(dev), os.minor(dev)) if user else (dev >> 20, dev & 0xFFFFF)
            if not numbers:
                found = ctx.block_device(major, minor)
                if found:
                    return found
            return f"{major}:{minor}"

        return majorminor
    if name == "cgroup":
        return lambda v: ctx.cgroups.path(as_int(v))
    if name == "errno":
        return lambda v: errno_name(as_int(v, signed=True))
    if name == "regexp":
        patterns = [re.compile(p) for p in spec.regexps or ()]

        def regexp(v: Value) -> str:
            text = as_text(v)
            if any(p.search(text) for p in patterns):
                return text
            raise DropLabelSet

        return regexp
    raise ValueError(f"unknown decoder {name!r}")  # the config's Literal prevents this


class LabelDecoder:
    """One label: where its bytes lie in the key and its decoder chain."""

    def __init__(self, spec: LabelSpec, offset: int, ctx: DecoderContext) -> None:
        self.name = spec.name
        self.offset = offset
        self.size = spec.size
        self.names = [d.name for d in spec.decoders]
        self._chain = [build_decoder(d, ctx) for d in spec.decoders]

    def __call__(self, key: bytes) -> str:
        value: Value = key[self.offset : self.offset + self.size]
        for step, fn in zip(self.names, self._chain, strict=True):
            try:
                value = fn(value)
            except DropLabelSet:
                raise
            except (DecodeError, ValueError, OSError, UnicodeError, OverflowError) as err:
                raise LabelDecodeError(self.name, step, str(err)) from err
        return as_text(value)


def label_decoders(labels: Sequence[LabelSpec], ctx: DecoderContext) -> list[LabelDecoder]:
    """Decoders of a metric's labels, laid out in key order."""
    out, offset = [], 0
    for spec in labels:
        offset += spec.padding
        out.append(LabelDecoder(spec, offset, ctx))
        offset += spec.size
    return out
