"""CRC32C (Castagnoli, reflected: the CRC of iSCSI and ext4), the checksum of the
spool's raw frames (kernmlops.spool.frames).

The native copier computes it in C (``native/ringcopy.c``: the CPU's crc32
instruction where it has one); Python calls that same function where the library is
loaded. Without it (no C compiler where the tree was built, or
``KERNMLOPS_NATIVE_COPY=0``) the spool writes and reads its frames with this module's
numpy version: the bytes are cut in lanes that numpy steps through side by side,
and the lanes' CRCs are joined after (the register is linear in what it held, so a
lane's CRC moves past the bytes after it by a fixed GF(2) map, applied here through
four byte tables). 100-200 MB/s on the 2-vCPU VM: enough for the Python copy (a
storm there makes ~30 MB/s of ring bytes), far from the native one's 10+ GB/s.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy")

POLY = 0x82F63B78
MASK = 0xFFFFFFFF


def _byte_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ POLY if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = _byte_table()
#: bytes below which one Python loop beats numpy's steps (each step costs microseconds)
SMALL = 512

#: _words[0][v], _words[1][v]: the register after 4 bytes, from the register's low
#: 16 bits v (and the others 0), and from its high 16 bits v: a step of 4 bytes is
#: two lookups (two tables of 256 KiB: in a core's L2 cache)
_words: np.ndarray | None = None
#: _shifts[m]: four byte tables that move a register past 2**m zero bytes
_shifts: list[np.ndarray] = []


def _update_py(reg: int, data: bytes | memoryview) -> int:
    table = TABLE
    for b in bytes(data):
        reg = table[(reg ^ b) & 0xFF] ^ (reg >> 8)
    return reg


def _bytes_step(table: np.ndarray, regs: np.ndarray, n: int) -> np.ndarray:
    """``regs`` after ``n`` zero bytes, one byte at a time."""
    for _ in range(n):
        regs = table[regs & 0xFF] ^ (regs >> 8)
    return regs


def _tables() -> np.ndarray:
    global _words
    if _words is None:
        table = np.array(TABLE, dtype=np.uint32)
        v = np.arange(1 << 16, dtype=np.uint32)
        _words = np.stack([_bytes_step(table, v, 4), _bytes_step(table, v << 16, 4)])
        byte = np.arange(256, dtype=np.uint32)
        regs = np.stack([byte << (8 * i) for i in range(4)])  # one table per byte
        _shifts.append(_bytes_step(table, regs, 1))
    return _words


def _apply(tables: np.ndarray, regs: np.ndarray) -> np.ndarray:
    """The linear map ``tables`` (4 x 256: one table per byte of the register)."""
    return (
        tables[0][regs & 0xFF]
        ^ tables[1][(regs >> 8) & 0xFF]
        ^ tables[2][(regs >> 16) & 0xFF]
        ^ tables[3][regs >> 24]
    )


def _shift(m: int) -> np.ndarray:
    """The tables that move a register past 2**m zero bytes (doubled from one byte's)."""
    _tables()
    while len(_shifts) <= m:
        last = _shifts[-1]
        _shifts.append(_apply(last, last))  # past 2**k bytes, then 2**k more
    return _shifts[m]


def _update_np(reg: int, data: bytes | memoryview | bytearray) -> int:
    buf = np.frombuffer(data, np.uint8)
    n = buf.size
    # lanes of 2**bits bytes, thousands of them: each numpy step moves them all 4 bytes
    bits = 4 if n < 1 << 16 else 6
    lane = 1 << bits
    k = n // lane
    if k < 2:
        return _update_py(reg, data)
    low, high = _tables()
    words = np.ascontiguousarray(buf[: k * lane].view("<u4").reshape(k, lane // 4).T)
    regs = np.zeros(k, np.uint32)
    regs[0] = reg  # the register so far goes on in the first lane
    lo, hi, a = np.empty(k, np.uint32), np.empty(k, np.uint32), np.empty(k, np.uint32)
    for column in words:  # in place: numpy's steps cost more than the work they do
        regs ^= column
        np.bitwise_and(regs, 0xFFFF, out=lo)
        np.right_shift(regs, 16, out=hi)
        np.take(low, lo, out=a)
        np.take(high, hi, out=regs)
        regs ^= a
    # Join neighbours until one is left: the left one moves past the right one's
    # bytes. A zero in front of an odd count changes nothing (it is the leftmost,
    # whose own length never matters).
    m = bits
    while regs.size > 1:
        if regs.size & 1:
            regs = np.concatenate([np.zeros(1, np.uint32), regs])
        regs = _apply(_shift(m), regs[0::2]) ^ regs[1::2]
        m += 1
    return _update_py(int(regs[0]), buf[k * lane :].tobytes())


def _native() -> ctypes.CDLL | None:
    from kernmlops.ebpf.copier import load

    return load()


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """The CRC32C of ``data``, going on from ``crc`` (that of the bytes before it)."""
    lib = _native()
    if lib is not None:
        if isinstance(data, bytes):
            return int(lib.kmo_crc32c(crc, data, len(data)))
        buf = np.frombuffer(data, np.uint8)
        return int(lib.kmo_crc32c(crc, ctypes.c_void_p(buf.ctypes.data), buf.size))
    return crc32c_numpy(data, crc)


def crc32c_numpy(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """:func:`crc32c` without the native library."""
    reg = crc ^ MASK
    if len(memoryview(data).cast("B")) < SMALL:
        return _update_py(reg, data) ^ MASK
    return _update_np(reg, data) ^ MASK
