"""CRC32C of the spool's raw frames: the native library's (the CPU's crc32 instruction
in three lanes, or its table) and numpy's lanes (where the library is missing) give
the standard's check values and agree with each other at every length, whole or
going on from the CRC of the bytes before."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf import copier as native
from kernmlops.ebpf.crc32c import crc32c, crc32c_numpy
from tests.conftest import skip_here

#: RFC 3720 (iSCSI), B.4, and the usual check value of "123456789"
VECTORS = [
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
]
#: around the numpy lanes (16 and 64 bytes, from 64 KiB), the library's blocks of
#: three 4-KiB lanes, and a frame of FRAME_RAW
LENGTHS = [0, 1, 7, 8, 9, 15, 16, 17, 33, 511, 512, 513, 4095, 12287, 12288, 12289,
           24583, 65535, 65536, 65537, 200_003, (1 << 20) + 5]  # fmt: skip


@pytest.fixture
def lib(bpf_build_dir: Path) -> ctypes.CDLL:
    found = native.load()
    assert found is not None, f"no {native.LIBRARY} in {bpf_build_dir}"
    return found


def _table(lib: ctypes.CDLL, data: bytes, crc: int = 0) -> int:
    return int(lib.kmo_crc32c_table(crc, data, len(data)))


@pytest.mark.parametrize(("data", "want"), VECTORS)
def test_the_standards_check_values(lib: ctypes.CDLL, data: bytes, want: int) -> None:
    assert crc32c(data) == crc32c_numpy(data) == _table(lib, data) == want


def test_every_way_agrees_at_every_length_whole_or_in_two(lib: ctypes.CDLL) -> None:
    rng = np.random.default_rng(3)
    for n in LENGTHS:
        data = rng.bytes(n)
        want = _table(lib, data)
        assert crc32c(data) == crc32c_numpy(data) == want, n
        assert crc32c(bytearray(data)) == crc32c(memoryview(data)) == want, n
        cut = n // 3
        assert crc32c(data[cut:], crc32c(data[:cut])) == want, n
        assert crc32c_numpy(data[cut:], crc32c_numpy(data[:cut])) == want, n
        assert _table(lib, data[cut:], _table(lib, data[:cut])) == want, n


def test_the_copier_uses_the_cpus_instruction_where_it_has_one(lib: ctypes.CDLL) -> None:
    flags = Path("/proc/cpuinfo").read_text().split()
    if "sse4_2" not in flags:
        skip_here("this CPU has no crc32 instruction (SSE4.2): the table serves")
    assert lib.kmo_crc32c_hw() == 1
