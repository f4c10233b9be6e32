"""ctypes binding over the system's libbpf.so.1 (libbpf >= 1.0 semantics:
functions return -errno, or NULL with errno set).

Only what kernmlops uses is declared. libbpf's log lines are captured, so a
failed load raises an error carrying libbpf's message and the verifier log.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    c_bool,
    c_char_p,
    c_int,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)

from kernmlops.errors import KernmlopsError

LIBBPF_WARN, LIBBPF_INFO, LIBBPF_DEBUG = 0, 1, 2


class LibbpfError(KernmlopsError):
    """A libbpf call failed; ``errno`` and libbpf's own log lines are kept."""

    def __init__(self, message: str, errno: int = 0, log: str = "") -> None:
        self.errno = errno
        self.log = log
        text = message
        if errno:
            text += f": {strerror(errno)} (errno {errno})"
        if log:
            text += "\n" + log
        super().__init__(text)

    def reason(self) -> str:
        """One line: the message and why, from libbpf's log: the verifier's complaint
        (its last line before the ``processed N insns`` summary) where a program was
        refused, else libbpf's last line that says what failed."""
        line = str(self).split("\n", 1)[0]
        lines = [x.strip().removeprefix("libbpf: ") for x in self.log.splitlines()]
        for i, x in enumerate(lines):
            if x.startswith("processed ") and " insns" in x and i and lines[i - 1]:
                return f"{line} (the verifier: {lines[i - 1]})"
        for hint in lines[::-1]:
            if "failed" in hint or "Invalid" in hint or "not" in hint:
                return f"{line} ({hint})"
        return line


def _load() -> ctypes.CDLL:
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError as err:
        raise LibbpfError(f"cannot load libbpf ({name}); install libbpf1 / libbpf-dev") from err


lib = _load()
_libc = ctypes.CDLL(None, use_errno=True)

PRINT_FN = CFUNCTYPE(c_int, c_int, c_char_p, c_void_p)
_libc.vsnprintf.argtypes = [c_char_p, c_size_t, c_char_p, c_void_p]
_libc.vsnprintf.restype = c_int


def _fn(name: str, restype, *argtypes) -> None:
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


obj_p = c_void_p
prog_p = c_void_p
map_p = c_void_p
link_p = c_void_p

_fn("libbpf_major_version", c_uint32)
_fn("libbpf_strerror", c_int, c_int, c_char_p, c_size_t)
_fn("libbpf_minor_version", c_uint32)
_fn("libbpf_set_print", c_void_p, PRINT_FN)
_fn("libbpf_num_possible_cpus", c_int)
_fn("libbpf_probe_bpf_prog_type", c_int, c_int, c_void_p)
_fn("libbpf_probe_bpf_map_type", c_int, c_int, c_void_p)
_fn("bpf_object__open_file", obj_p, c_char_p, c_void_p)
_fn("bpf_object__load", c_int, obj_p)
_fn("bpf_object__close", None, obj_p)
_fn("bpf_object__name", c_char_p, obj_p)
_fn("bpf_object__next_program", prog_p, obj_p, prog_p)
_fn("bpf_object__next_map", map_p, obj_p, map_p)
_fn("bpf_object__find_map_by_name", map_p, obj_p, c_char_p)
_fn("bpf_program__name", c_char_p, prog_p)
_fn("bpf_program__section_name", c_char_p, prog_p)
_fn("bpf_program__set_autoload", c_int, prog_p, c_bool)
_fn("bpf_program__autoload", c_bool, prog_p)
_fn("bpf_program__fd", c_int, prog_p)
_fn("bpf_program__attach", link_p, prog_p)
_fn("bpf_program__attach_perf_event", link_p, prog_p, c_int)
_fn("bpf_program__attach_xdp", link_p, prog_p, c_int)
_fn("bpf_program__attach_iter", link_p, prog_p, c_void_p)
_fn("bpf_program__attach_tracepoint", link_p, prog_p, c_char_p, c_char_p)
_fn("bpf_program__attach_raw_tracepoint", link_p, prog_p, c_char_p)
_fn("bpf_link__destroy", c_int, link_p)
_fn("bpf_link__fd", c_int, link_p)
_fn("bpf_map__name", c_char_p, map_p)
_fn("bpf_map__fd", c_int, map_p)
_fn("bpf_map__type", c_int, map_p)
_fn("bpf_map__key_size", c_uint32, map_p)
_fn("bpf_map__value_size", c_uint32, map_p)
_fn("bpf_map__max_entries", c_uint32, map_p)
_fn("bpf_map__set_max_entries", c_int, map_p, c_uint32)
_fn("bpf_map__set_type", c_int, map_p, c_int)
_fn("bpf_map__reuse_fd", c_int, map_p, c_int)
_fn("bpf_map__initial_value", c_void_p, map_p, POINTER(c_size_t))
_fn("bpf_map_create", c_int, c_int, c_char_p, c_uint32, c_uint32, c_uint32, c_void_p)
_fn("bpf_map_lookup_elem", c_int, c_int, c_void_p, c_void_p)
_fn("bpf_map_update_elem", c_int, c_int, c_void_p, c_void_p, c_uint64)
_fn("bpf_map_delete_elem", c_int, c_int, c_void_p)
_fn("bpf_map_lookup_and_delete_elem", c_int, c_int, c_void_p, c_void_p)
_fn("bpf_map_get_next_key", c_int, c_int, c_void_p, c_void_p)
_fn("bpf_iter_create", c_int, c_int)
_fn("bpf_enable_stats", c_int, c_int)
_fn("bpf_prog_get_next_id", c_int, c_uint32, POINTER(c_uint32))
_fn("bpf_link_get_next_id", c_int, c_uint32, POINTER(c_uint32))
_fn("bpf_map_get_next_id", c_int, c_uint32, POINTER(c_uint32))


class ProgTestRunOpts(ctypes.Structure):
    """struct bpf_test_run_opts (libbpf 1.x bpf.h), for BPF_PROG_TEST_RUN."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


_fn("bpf_prog_test_run_opts", ctypes.c_int, ctypes.c_int, ctypes.POINTER(ProgTestRunOpts))


class BpfProgInfo(ctypes.Structure):
    """struct bpf_prog_info (uapi/linux/bpf.h) up to recursion_misses. The
    kernel fills only as many bytes as we pass, so a prefix is valid."""

    _fields_ = [
        ("type", c_uint32),
        ("id", c_uint32),
        ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", c_uint32),
        ("xlated_prog_len", c_uint32),
        ("jited_prog_insns", c_uint64),
        ("xlated_prog_insns", c_uint64),
        ("load_time", c_uint64),
        ("created_by_uid", c_uint32),
        ("nr_map_ids", c_uint32),
        ("map_ids", c_uint64),
        ("name", ctypes.c_char * 16),
        ("ifindex", c_uint32),
        ("gpl_compatible", c_uint32),
        ("netns_dev", c_uint64),
        ("netns_ino", c_uint64),
        ("nr_jited_ksyms", c_uint32),
        ("nr_jited_func_lens", c_uint32),
        ("jited_ksyms", c_uint64),
        ("jited_func_lens", c_uint64),
        ("btf_id", c_uint32),
        ("func_info_rec_size", c_uint32),
        ("func_info", c_uint64),
        ("nr_func_info", c_uint32),
        ("nr_line_info", c_uint32),
        ("line_info", c_uint64),
        ("jited_line_info", c_uint64),
        ("nr_jited_line_info", c_uint32),
        ("line_info_rec_size", c_uint32),
        ("jited_line_info_rec_size", c_uint32),
        ("nr_prog_tags", c_uint32),
        ("prog_tags", c_uint64),
        ("run_time_ns", c_uint64),
        ("run_cnt", c_uint64),
        ("recursion_misses", c_uint64),
    ]


_fn("bpf_obj_get_info_by_fd", c_int, c_int, c_void_p, POINTER(c_uint32))
_fn("btf__load_vmlinux_btf", c_void_p)
_fn("btf__find_by_name_kind", c_int, c_void_p, c_char_p, c_uint32)
_fn("btf__type_by_id", c_void_p, c_void_p, c_uint32)
_fn("btf__name_by_offset", c_char_p, c_void_p, c_uint32)


def prog_info(fd: int) -> BpfProgInfo:
    """The kernel's facts about a loaded program: id, name, run time and count
    (when BPF stats are enabled), and runs skipped by its recursion guard."""
    info = BpfProgInfo()
    size = c_uint32(ctypes.sizeof(info))
    rc = lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size))
    check_int(rc if rc >= 0 else -ctypes.get_errno(), "bpf_obj_get_info_by_fd")
    return info


# BPF map types we treat specially (uapi/linux/bpf.h).
MAP_PERCPU_HASH = 5
MAP_PERCPU_ARRAY = 6
MAP_LRU_PERCPU_HASH = 10
MAP_RINGBUF = 27
PERCPU_MAPS = frozenset({MAP_PERCPU_HASH, MAP_PERCPU_ARRAY, MAP_LRU_PERCPU_HASH})


def strerror(errno: int) -> str:
    """libbpf's own codes (>= 4000, e.g. 'Invalid ELF') or the C library's."""
    if errno >= 4000:
        buf = ctypes.create_string_buffer(256)
        lib.libbpf_strerror(errno, buf, len(buf))
        return buf.value.decode(errors="replace")
    return os.strerror(errno)


def version() -> str:
    return f"{lib.libbpf_major_version()}.{lib.libbpf_minor_version()}"


class _HandlerOpts(ctypes.Structure):
    """struct libbpf_prog_handler_opts: no callbacks, the caller attaches itself."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("cookie", ctypes.c_long),
        ("prog_setup_fn", ctypes.c_void_p),
        ("prog_prepare_load_fn", ctypes.c_void_p),
        ("prog_attach_fn", ctypes.c_void_p),
    ]


_handlers: dict[str, int] = {}
_handlers_lock = threading.Lock()


def register_prog_handler(prefix: str, prog_type: int, attach_type: int) -> None:
    """Teach libbpf (once per process and ``prefix``) that sections starting with
    ``prefix`` are programs of ``prog_type``: sections libbpf does not know (an
    ebpf_exporter program's ``perf_event/...``, ``xdp/<interface>``) would fail to
    open. Nothing attaches them: the caller does.

    Raises:
        LibbpfError: libbpf refused the handler.
    """
    with _handlers_lock:
        if prefix in _handlers:
            return
        opts = _HandlerOpts(sz=ctypes.sizeof(_HandlerOpts))
        fn = lib.libbpf_register_prog_handler
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        rc = fn(prefix.encode(), prog_type, attach_type, ctypes.byref(opts))
        if rc < 0:
            raise LibbpfError(f"register the {prefix} section handler", -rc)
        _handlers[prefix] = rc


#: enum bpf_map_type
MAP_TYPE_HASH = 1
MAP_TYPE_RINGBUF = 27
MAP_TYPE_TASK_STORAGE = 29


@functools.cache
def has_map_type(map_type: int) -> bool:
    """Whether this kernel makes maps of ``map_type`` (libbpf's probe: one map made
    and closed, once per process)."""
    return lib.libbpf_probe_bpf_map_type(map_type, None) == 1


def create_ringbuf(name: str, size: int) -> int:
    """A new BPF ring buffer map of ``size`` bytes (a power of two, whole pages): its
    fd, the caller's to close."""
    fd = lib.bpf_map_create(MAP_TYPE_RINGBUF, name.encode()[:15], 0, 0, size, None)
    if fd < 0:
        raise LibbpfError(f"create ring {name}", -fd)
    return fd


def num_possible_cpus() -> int:
    n = lib.libbpf_num_possible_cpus()
    if n < 0:
        raise LibbpfError("cannot count possible CPUs", -n)
    return n


# --- log capture -----------------------------------------------------------
_log = threading.local()
_DEBUG = bool(os.environ.get("KERNMLOPS_DEBUG"))


@PRINT_FN
def _print(level: int, fmt: bytes, args: int) -> int:
    buf = ctypes.create_string_buffer(8192)
    n = _libc.vsnprintf(buf, len(buf), fmt, args)
    text = buf.value.decode(errors="replace")
    lines = getattr(_log, "lines", None)
    if lines is not None and level <= LIBBPF_INFO:
        lines.append(text)
    if _DEBUG:
        os.write(2, buf.value)
    return n


lib.libbpf_set_print(_print)


class capture_log:
    """Collect libbpf's log lines (this thread) while the block runs."""

    def __enter__(self) -> capture_log:
        self.previous = getattr(_log, "lines", None)
        _log.lines = []
        return self

    def __exit__(self, *exc: object) -> None:
        self.lines: list[str] = _log.lines
        _log.lines = self.previous

    @property
    def text(self) -> str:
        lines = _log.lines if getattr(_log, "lines", None) is not None else self.lines
        return "".join(lines).rstrip()


def check_int(rc: int, what: str, log: str = "") -> int:
    """libbpf int calls return -errno on failure."""
    if rc < 0:
        raise LibbpfError(what, -rc, log)
    return rc


def check_ptr(ptr: int | None, what: str, log: str = "") -> int:
    """libbpf pointer calls return NULL and set errno on failure."""
    if not ptr:
        raise LibbpfError(what, ctypes.get_errno(), log)
    return ptr


def _ids(fn) -> list[int]:
    out, cur, nxt = [], 0, c_uint32()
    while fn(cur, ctypes.byref(nxt)) == 0:
        cur = nxt.value
        out.append(cur)
    return out


def prog_ids() -> list[int]:
    """IDs of every BPF program loaded in the kernel (needs CAP_SYS_ADMIN)."""
    return _ids(lib.bpf_prog_get_next_id)


def link_ids() -> list[int]:
    return _ids(lib.bpf_link_get_next_id)


def map_ids() -> list[int]:
    return _ids(lib.bpf_map_get_next_id)


__all__ = [
    "PERCPU_MAPS",
    "LibbpfError",
    "c_uint",
    "capture_log",
    "check_int",
    "check_ptr",
    "lib",
    "num_possible_cpus",
    "version",
]
