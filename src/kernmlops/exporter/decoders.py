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
import ipaddress
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from kernmlops.exporter.spec import DecoderSpec, LabelSpec
from kernmlops.host.kallsyms import KALLSYMS, KernelSymbols

Value = bytes | str

#: where Debian's pci.ids package and hwdata put the PCI id database
PCI_IDS_PATHS = (Path("/usr/share/misc/pci.ids"), Path("/usr/share/hwdata/pci.ids"))


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


def _why_no_kallsyms() -> str:
    """Why /proc/kallsyms shows zeros (the kernel's kallsyms_show_value:
    kernel.kptr_restrict 2 hides them from all, 1 from those without
    CAP_SYSLOG, 0 too unless kernel.perf_event_paranoid <= 1)."""
    try:
        level = Path("/proc/sys/kernel/kptr_restrict").read_text().strip()
    except OSError:
        level = "?"
    if level == "2":
        return "kernel.kptr_restrict is 2, which hides them from everyone"
    return f"reading them needs CAP_SYSLOG (kernel.kptr_restrict is {level})"


class Kallsyms:
    """Kernel symbols by address, from /proc/kallsyms (read once, on first use)."""

    def __init__(self, path: Path = KALLSYMS) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._symbols: KernelSymbols | None = None

    def load(self) -> None:
        with self._lock:
            if self._symbols is None:
                try:
                    symbols = KernelSymbols.load(self.path)  # text symbols (kernmlops.host)
                except OSError as err:
                    raise DecodeError(f"cannot read {self.path}: {err.strerror}") from None
                if not len(symbols):
                    raise DecodeError(
                        f"{self.path} shows this process no addresses; {_why_no_kallsyms()}"
                    )
                self._symbols = symbols

    def name(self, addr: int) -> str:
        """The function that contains ``addr`` (its address or an IP in it)."""
        found = self.find(addr)
        if found is None:
            raise DecodeError(f"no kernel symbol at {addr:#x}")
        return found

    def find(self, addr: int) -> str | None:
        """:meth:`name`, or None where no symbol is."""
        self.load()
        assert self._symbols is not None
        return self._symbols.name(addr) if addr else None


class PciIds:
    """Names from the PCI id database (pci.ids: vendors with their devices, then
    ``C`` classes with their subclasses), read once on first use. Without the
    file every lookup gives None (the decoders then show the hex id)."""

    def __init__(self, paths: tuple[Path, ...] = PCI_IDS_PATHS) -> None:
        self.paths = paths
        self._lock = threading.Lock()
        self._tables: tuple[dict[int, str], dict[int, str], dict[int, str], dict[int, str]] | None
        self._tables = None

    def _load(self) -> tuple[dict[int, str], dict[int, str], dict[int, str], dict[int, str]]:
        vendors: dict[int, str] = {}
        devices: dict[int, str] = {}  # vendor << 16 | device
        classes: dict[int, str] = {}
        subclasses: dict[int, str] = {}  # class << 8 | subclass
        path = next((p for p in self.paths if p.is_file()), None)
        if path is None:
            return vendors, devices, classes, subclasses
        vendor = klass = None
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip() or line.startswith("#"):
                    continue
                try:
                    if line.startswith("C "):  # C 02  Network controller
                        ident, _, name = line[2:].strip().partition("  ")
                        klass, vendor = int(ident, 16), None
                        classes[klass] = name.strip()
                    elif not line[0].isspace():  # 8086  Intel Corporation
                        ident, _, name = line.strip().partition("  ")
                        vendor, klass = int(ident, 16), None
                        vendors[vendor] = name.strip()
                    elif line.startswith("\t") and not line.startswith("\t\t"):
                        ident, _, name = line.strip().partition("  ")
                        if vendor is not None:
                            devices[vendor << 16 | int(ident, 16)] = name.strip()
                        elif klass is not None:
                            subclasses[klass << 8 | int(ident, 16)] = name.strip()
                except ValueError:
                    continue  # a line of another section (e.g. the device list's end)
        return vendors, devices, classes, subclasses

    @property
    def tables(self) -> tuple[dict[int, str], dict[int, str], dict[int, str], dict[int, str]]:
        with self._lock:
            if self._tables is None:
                self._tables = self._load()
            return self._tables

    def vendor(self, vendor: int) -> str:
        return self.tables[0].get(vendor) or f"0x{vendor:04x}"

    def device(self, vendor_device: int) -> str:
        return self.tables[1].get(vendor_device) or f"0x{vendor_device:08x}"

    def klass(self, klass: int) -> str:
        return self.tables[2].get(klass) or f"0x{klass:02x}"

    def subclass(self, class_subclass: int) -> str:
        return self.tables[3].get(class_subclass) or f"0x{class_subclass:04x}"


class CgroupPaths:
    """cgroup v2 id (its directory's inode number) -> path below the mount, by
    walking the hierarchy; walked again when an id read from a map is not
    known, unless a walk began after the map was read (:meth:`keys_read`).

    A cgroup's values outlive it in the maps (oncpu's CPU time of a job that
    ran in a cgroup of its own, then removed it): a removed cgroup keeps the
    path an earlier walk saw it at, and one that no walk since the map was
    read finds (removed before any walk saw it, or outside this mount) is
    ``unknown_cgroup_id:N``, as ebpf_exporter labels it; its value is kept.
    Cgroup ids are not reused (64-bit kernfs ids), so both labels are final."""

    #: removed cgroups remembered (their label), the oldest forgotten first
    KEEP_GONE = 65536

    def __init__(self, root: Path | None = None) -> None:
        self._root = root
        self._paths: dict[int, str] = {}
        self._gone: dict[int, str] = {}
        self._walk_started = float("-inf")
        self._read_at: float | None = None
        self._lock = threading.Lock()

    @cached_property
    def root(self) -> Path:
        root = self._root or cgroup2_mount()
        if root is None:
            raise DecodeError("no cgroup v2 hierarchy is mounted")
        return root

    def keys_read(self, at: float) -> None:
        """The ids about to be labelled were read from a map at ``at``
        (``time.monotonic()``): a walk begun since then knows every cgroup
        still there."""
        self._read_at = at

    def scan(self) -> None:
        with self._lock:
            self._scan()

    def _scan(self) -> None:
        started = time.monotonic()
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
        for cg_id, path in self._paths.items():
            if cg_id not in paths:
                self._remember_gone(cg_id, path)
        self._paths = paths
        self._walk_started = started

    def _remember_gone(self, cg_id: int, label: str) -> None:
        self._gone[cg_id] = label
        if len(self._gone) > self.KEEP_GONE:
            del self._gone[next(iter(self._gone))]

    def label(self, cgroup_id: int, *, full: bool = False) -> str:
        """The cgroup's path, or the one it had (removed), or
        ``unknown_cgroup_id:N`` (never seen by a walk, and not there now). The
        path is below the mount (``/system.slice/x.service``, as the ``0::`` line
        of /proc/<pid>/cgroup), or with ``full`` the directory's own path, the
        mount point and below (``/sys/fs/cgroup/system.slice/x.service``, or
        ``/sys/fs/cgroup/unified/...`` on a hybrid layout), as ebpf_exporter's
        cgroup decoder labels it: it walks /sys/fs/cgroup and keeps the paths
        it walked."""
        found = self._label(cgroup_id)
        if full and found.startswith("/"):  # not unknown_cgroup_id:N
            root = str(self.root)
            return root if found == "/" else root.rstrip("/") + found
        return found

    def _label(self, cgroup_id: int) -> str:
        with self._lock:
            found = self._paths.get(cgroup_id) or self._gone.get(cgroup_id)
            if found is not None:
                return found
            read_at = time.monotonic() if self._read_at is None else self._read_at
            if self._walk_started < read_at:  # no walk since the id was read: walk
                self._scan()
                found = self._paths.get(cgroup_id) or self._gone.get(cgroup_id)
                if found is not None:
                    return found
            # A walk begun after the id was read does not find it: removed.
            found = f"unknown_cgroup_id:{cgroup_id}"
            self._remember_gone(cgroup_id, found)
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
    pci: PciIds = field(default_factory=PciIds)
    ifname: Callable[[int], str] = socket.if_indextoname

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


def as_bytes(value: Value) -> bytes:
    """Raw bytes, or the bytes of a text an earlier decoder made."""
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


def inet_ip(raw: bytes) -> str:
    """4 bytes: IPv4; 16 bytes: IPv6 (an IPv4-mapped one shown as IPv4)."""
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw))
    if len(raw) == 16:
        addr = ipaddress.IPv6Address(raw)
        return str(addr.ipv4_mapped or addr)
    raise DecodeError(f"{len(raw)} bytes are no IPv4 (4) or IPv6 (16) address")


def dname(raw: bytes) -> str:
    """A DNS name in wire format (length-prefixed labels, e.g. ``\\x07example\\x03com\\x00``)
    in dotted form; the root is ``.``."""
    labels, off = [], 0
    while off < len(raw):
        n = raw[off]
        if n == 0:
            break
        if off + 1 + n > len(raw):
            raise DecodeError(f"label of {n} bytes runs past the name's end")
        labels.append(raw[off + 1 : off + 1 + n].decode("ascii", errors="replace"))
        off += 1 + n
    return ".".join(labels) or "."


def dname_ee(raw: bytes) -> str:
    """:func:`dname` as ebpf_exporter decodes it: each length byte becomes a dot,
    a zero one too (``\\x03com\\x00`` is ``com.``: give it ``string`` first to
    end at the root), and a name whose label runs past the end is its bytes as
    they are, not an error."""
    if not raw:
        return "."
    out, off = bytearray(len(raw)), 0
    while off < len(raw):
        n = raw[off]
        out[off] = ord(".")
        off += 1
        if off + n > len(raw):
            return raw.decode("utf-8", errors="replace")
        out[off : off + n] = raw[off : off + n]
        off += n
    return bytes(out[1:]).decode("utf-8", errors="replace")


def kstack(raw: bytes, kallsyms: Kallsyms, unknown: str = "??") -> str:
    """An array of kernel addresses (u64, ended by 0) as symbols, one per line."""
    if len(raw) % 8:
        raise DecodeError(f"{len(raw)} bytes are no array of u64 addresses")
    frames = []
    for (addr,) in struct.iter_unpack("<Q", raw):
        if addr == 0:
            break
        frames.append(kallsyms.find(addr) or unknown)
    return "\n".join(frames)


def build_decoder(spec: DecoderSpec, ctx: DecoderContext, *, flavor: str = "kernmlops") -> Decoder:
    """The function of one step of a chain. ``flavor="ebpf_exporter"`` gives
    what ebpf_exporter gives where the two differ: a value it cannot resolve is
    a label (``unknown_addr:0x...``, ``unknown_syscall:N``, ...) rather than a
    decoder error, a regexp's label is what matched (its group), device numbers are
    glibc's encoding, a cgroup is its full path (the mount point and below)."""
    name = spec.name
    ee = flavor == "ebpf_exporter"
    if name == "uint":
        signed = bool(spec.signed)
        return lambda v: str(as_int(v, signed=signed))
    if name in ("string", "comm"):
        return as_text
    if name == "static_map":
        table = dict(spec.static_map or {})
        default = spec.default
        allow_unknown = bool(spec.allow_unknown)

        def static_map(v: Value) -> str:
            key = str(as_int(v)) if isinstance(v, bytes) else v
            found = table.get(key)
            if found is not None:
                return found
            if allow_unknown:
                return key
            return default if default is not None else f"unknown:{key}"

        return static_map
    if name == "ksym":
        if ee:
            return lambda v: ctx.kallsyms.find(a := as_int(v)) or f"unknown_addr:0x{a:x}"
        return lambda v: ctx.kallsyms.name(as_int(v))
    if name == "kstack":
        return lambda v: kstack(as_bytes(v), ctx.kallsyms)
    if name == "syscall":
        unknown = "unknown_syscall" if ee else "unknown"

        def syscall(v: Value) -> str:
            n = as_int(v)
            return ctx.syscall_names.get(n) or f"{unknown}:{n}"

        return syscall
    if name == "majorminor":
        user = ee or spec.encoding == "user"
        numbers = spec.output == "numbers"

        def majorminor(v: Value) -> str:
            dev = as_int(v[:4] if ee and isinstance(v, bytes) else v)
            major, minor = (os.major(dev), os.minor(dev)) if user else (dev >> 20, dev & 0xFFFFF)
            if not numbers:
                found = ctx.block_device(major, minor)
                if found:
                    return found
            return f"unknown:{major}:{minor}" if ee else f"{major}:{minor}"

        return majorminor
    if name == "cgroup":  # a removed cgroup: its last path, or unknown_cgroup_id:N
        # ebpf_exporter's configs get its full paths (their users' regexps,
        # dashboards and rules match /sys/fs/cgroup/...); ours the path below
        # the mount, the same on every host whatever its layout
        return lambda v: ctx.cgroups.label(as_int(v), full=ee)
    if name == "errno":
        if ee:

            def errno_ee(v: Value) -> str:
                n = as_int(v)
                try:
                    return errno_name(n)
                except DecodeError:
                    return f"unknown:{n}"

            return errno_ee
        return lambda v: errno_name(as_int(v, signed=True))
    if name == "regexp":
        patterns = [re.compile(p) for p in spec.regexps or ()]

        def regexp(v: Value) -> str:
            text = as_text(v)
            for p in patterns:
                m = p.search(text)
                if m:
                    return text
            raise DropLabelSet

        def regexp_ee(v: Value) -> str:
            # ebpf_exporter's label is what matched: the one group (empty if it took
            # no part), else the whole match, not the text; a pattern with more groups
            # gives neither, so the next one is tried
            text = as_text(v)
            for p in patterns:
                m = p.search(text)
                if m is None or p.groups > 1:
                    continue
                return (m.group(1) or "") if p.groups == 1 else m.group(0)
            raise DropLabelSet

        return regexp_ee if ee else regexp
    if name == "inet_ip":
        return lambda v: inet_ip(as_bytes(v))
    if name == "dname":
        if ee:
            return lambda v: dname_ee(as_bytes(v))
        return lambda v: dname(as_bytes(v))
    if name == "hex":
        return lambda v: as_bytes(v).hex()
    if name == "ifname":

        def ifname(v: Value) -> str:
            index = as_int(v[:4] if isinstance(v, bytes) and len(v) > 4 else v)
            try:
                return ctx.ifname(index)
            except OSError:  # gone since the program saw it
                return f"unknown:{index}"

        return ifname
    if name == "pci_vendor":
        return lambda v: ctx.pci.vendor(as_int(v))
    if name == "pci_device":
        return lambda v: ctx.pci.device(as_int(v))
    if name == "pci_class":
        return lambda v: ctx.pci.klass(as_int(v))
    if name == "pci_subclass":
        return lambda v: ctx.pci.subclass(as_int(v))
    raise ValueError(f"unknown decoder {name!r}")  # the config's Literal prevents this


class LabelDecoder:
    """One label: where its bytes lie in the key and its decoder chain."""

    def __init__(
        self, spec: LabelSpec, offset: int, ctx: DecoderContext, *, flavor: str = "kernmlops"
    ) -> None:
        self.name = spec.name
        self.offset = offset
        self.size = spec.size
        self.names = [d.name for d in spec.decoders]
        self._chain = [build_decoder(d, ctx, flavor=flavor) for d in spec.decoders]

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


def label_decoders(
    labels: Sequence[LabelSpec], ctx: DecoderContext, *, flavor: str = "kernmlops", offset: int = 0
) -> list[LabelDecoder]:
    """Decoders of a metric's labels, laid out in key order from ``offset``."""
    out = []
    for spec in labels:
        offset += spec.padding
        out.append(LabelDecoder(spec, offset, ctx, flavor=flavor))
        offset += spec.size
    return out
