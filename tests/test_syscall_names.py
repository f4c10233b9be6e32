"""Syscall names: the header's table, and the newer calls it lacks, checked on
the running kernel by what the calls do."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from pathlib import Path

import pytest

from kernmlops.syscall_names import NEWER_CALLS, parse_unistd, syscall_table

AT_FDCWD = -100
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def by_name() -> dict[str, int]:
    return {name: nr for nr, name in syscall_table().items()}


def kernel_at_least(major: int, minor: int) -> bool:
    release = tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2])
    return release >= (major, minor)


def test_header_numbers_are_what_libc_runs() -> None:
    nr = by_name()
    assert libc.syscall(nr["getpid"]) == os.getpid()
    assert libc.syscall(nr["getppid"]) == os.getppid()


def test_header_wins_and_gap_is_filled() -> None:
    table = syscall_table()
    assert all(table[n] == name for n, name in NEWER_CALLS.items())
    header = "#define __NR_read 0\n#define __NR_cachestat 451\n"
    assert parse_unistd(header) == {0: "read", 451: "cachestat"}


@pytest.mark.skipif(not kernel_at_least(6, 17), reason="the calls up to 469 came in 6.17")
def test_every_newer_call_exists_on_this_kernel() -> None:
    # Bad arguments give EBADF/EINVAL/EFAULT/...; a number the kernel lacks gives ENOSYS.
    missing = set()
    for nr, name in NEWER_CALLS.items():
        ctypes.set_errno(0)
        assert libc.syscall(nr, -1, 0, 0, 0, 0) == -1, name
        if ctypes.get_errno() == errno.ENOSYS:
            missing.add(name)
    # map_shadow_stack is built only with user shadow stacks (x86, a config option)
    assert missing <= {"map_shadow_stack"}, missing


@pytest.mark.skipif(not kernel_at_least(6, 6), reason="fchmodat2 came in 6.6")
def test_fchmodat2_by_its_number_changes_a_mode(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x")
    path.chmod(0o644)
    rc = libc.syscall(by_name()["fchmodat2"], AT_FDCWD, str(path).encode(), 0o600, 0)
    assert rc == 0, os.strerror(ctypes.get_errno())
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(not kernel_at_least(6, 5), reason="cachestat came in 6.5")
def test_cachestat_by_its_number_counts_cached_pages(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"\1" * (16 * 4096))
    rng = (ctypes.c_uint64 * 2)(0, 0)  # off, len (0: to the end)
    stat = (ctypes.c_uint64 * 5)()  # nr_cache, nr_dirty, nr_writeback, nr_evicted, ...
    with path.open("rb") as fh:
        fh.read()
        rc = libc.syscall(by_name()["cachestat"], fh.fileno(), rng, stat, 0)
    assert rc == 0, os.strerror(ctypes.get_errno())
    assert stat[0] == 16
