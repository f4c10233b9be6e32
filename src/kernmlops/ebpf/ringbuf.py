"""BPF ring buffer consumer: map the ring, decode whole batches with numpy.

Layout (kernel/bpf/ringbuf.c): page 0 holds the consumer position (mapped
read-write), page 1 the producer position, then the data area, which the kernel
lets user space map twice in a row so that a batch that wraps is contiguous.
We map it once (a second mapping counts the whole ring again in the collector's
RSS) and join the two pieces of the rare wrapping batch. Each record has an 8-byte header:
length in the low 30 bits, bit 31 = busy (reserved, not committed yet), bit
30 = discarded; records are 8-byte aligned.

User space drains on a timer, and no Python code runs per event. Programs
submit without a wake-up, except the record that takes the ring across a
quarter of its size (common.h, KMO_SUBMIT / KMO_BATCH_PUSH): the map's fd,
in an edge-triggered epoll, then wakes the collector before a burst can fill
the ring (see kernmlops.collect.session).

The two positions are read and written whole, through 8-byte memoryviews (one
load, one store), as the kernel reads and writes them. ``struct.pack_into``
zeroes its target before it writes the bytes: a producer reading the consumer
position in between sees 0, takes the ring for full and refuses the record
(measured: 8-12 refused 32-record batches per 30-s switch storm, none with the
one-store write).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernmlops.lazy import imported, lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy")


BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
LEN_MASK = DISCARD_BIT - 1
HEADER_SIZE = 8


def record_stride(itemsize: int) -> int:
    """Bytes a record of ``itemsize`` takes in the ring, header included."""
    return (HEADER_SIZE + itemsize + 7) & ~7


def join_records(parts: Sequence[np.ndarray]) -> np.ndarray:
    """``parts`` (structured arrays of one dtype) end to end, in that dtype:
    np.concatenate packs a dtype with padding or explicit offsets (the C record's
    layout) into one without, which a reader of the record's raw bytes misreads."""
    out = np.empty(sum(len(p) for p in parts), dtype=parts[0].dtype)
    at = 0
    for part in parts:
        out[at : at + len(part)] = part
        at += len(part)
    return out


@dataclass
class Batch:
    """What one drain returned."""

    records: np.ndarray  # structured, committed records in order
    consumed: int  # new consumer position
    discarded: int  # records skipped because the program discarded them


def decode(
    data: np.ndarray,
    size: int,
    cons: int,
    prod: int,
    dtype: np.dtype,
    max_records: int | None = None,
) -> Batch:
    """Decode committed records between ``cons`` and ``prod``.

    ``data`` is the data area mapped twice (``2 * size`` bytes, uint8), so a
    batch starting anywhere is contiguous. Stops at the first busy record.
    All records in the ring must be of ``dtype`` (one record type per ring).
    """
    stride = record_stride(dtype.itemsize)
    avail = prod - cons
    if avail <= 0:
        return Batch(np.empty(0, dtype), cons, 0)
    if avail % stride:
        raise ValueError(
            f"ring holds {avail} bytes, not a multiple of the {stride}-byte record: "
            "records of another size in a one-record ring"
        )
    n = avail // stride
    if max_records is not None:
        n = min(n, max_records)
    start = cons & (size - 1)
    region = data[start : start + n * stride].reshape(n, stride)
    header = region[:, :4].copy().view("<u4").ravel()
    busy = np.flatnonzero(header & BUSY_BIT)
    if busy.size:
        n = int(busy[0])
        region, header = region[:n], header[:n]
    lengths = header & LEN_MASK
    if n and not np.all(lengths == dtype.itemsize):
        bad = int(lengths[np.flatnonzero(lengths != dtype.itemsize)[0]])
        raise ValueError(f"record of {bad} bytes in a ring of {dtype.itemsize}-byte records")
    keep = (header & DISCARD_BIT) == 0
    body = region[:, HEADER_SIZE : HEADER_SIZE + dtype.itemsize]
    if not keep.all():
        body = body[keep]
    # Always a copy: the ring's memory is reused once the consumer moves on
    # (ascontiguousarray would return a view for a single-row batch).
    records = body.copy(order="C").view(dtype).ravel()
    return Batch(records, cons + n * stride, int(n - keep.sum()))


class RingBuffer:
    """Consumer side of one BPF_MAP_TYPE_RINGBUF map.

    Mapping the ring needs no numpy; its record type (``dtype``) may be given
    later, before the first :meth:`drain`. Until then :meth:`spill` can move
    committed records out of the ring as bytes, which the first drain decodes
    ahead of the ring's own: a collection attaches its probes and keeps up with
    the events while numpy and polars are still being imported.
    """

    def __init__(
        self, map_fd: int, size: int, dtype: np.dtype | None = None, name: str = ""
    ) -> None:
        if size <= 0 or size & (size - 1):
            raise ValueError(f"ring size {size} is not a power of two")
        self.name = name
        self.size = size
        self.dtype = dtype
        #: the map's fd (not owned): readable, for epoll, when a program woke readers
        self.fd = map_fd
        page = mmap.PAGESIZE
        self._page = page
        self._cons_map = mmap.mmap(
            map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0
        )
        self._prod_map = mmap.mmap(map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        # One 8-byte load or store each (see the module's docstring).
        self._cons = memoryview(self._cons_map)[:8].cast("Q")
        self._prod = memoryview(self._prod_map)[:8].cast("Q")
        # The data area is mapped at its first read: the kernel maps all of a ring's
        # pages at once and they count in RSS, and where the native copier reads the
        # ring (it maps it itself) this mapping is never read: 32 MiB at 16 CPUs.
        self._data_map_: mmap.mmap | None = None
        self._words_: memoryview | None = None
        self._data: np.ndarray | None = None
        self._spilled: list[bytes] = []
        self.records = 0
        self.discarded = 0

    @property
    def _data_map(self) -> mmap.mmap:
        """The producer page and the data area (once), mapped on first use."""
        if self._data_map_ is None:
            self._data_map_ = mmap.mmap(
                self.fd, self._page + self.size, mmap.MAP_SHARED, mmap.PROT_READ,
                offset=self._page,
            )  # fmt: skip
        return self._data_map_

    @property
    def _words(self) -> memoryview:
        """The mapping as 32-bit words: record headers, whole."""
        if self._words_ is None:
            self._words_ = memoryview(self._data_map).cast("I")
        return self._words_

    @property
    def data_mapped(self) -> bool:
        """Whether the data area is mapped (read at least once)."""
        return self._data_map_ is not None

    def _positions(self) -> tuple[int, int]:
        return self._cons[0], self._prod[0]

    @property
    def spilled(self) -> bool:
        """Whether spilled records wait for the next drain."""
        return bool(self._spilled)

    @property
    def spilled_bytes(self) -> int:
        return sum(len(chunk) for chunk in self._spilled)

    def pending_bytes(self) -> int:
        cons, prod = self._positions()
        return prod - cons

    def spill(self, itemsize: int) -> int:
        """Copy the committed records of ``itemsize`` bytes out of the ring (as bytes, for
        the next :meth:`drain` to decode) and free their space; the records spilled.
        Pure Python: it runs while numpy is not imported yet."""
        cons, prod = self._positions()
        stride = record_stride(itemsize)
        n = self._committed_py(cons, max(0, (prod - cons) // stride), stride)
        if n:
            self._spilled.append(self._bytes(cons, n * stride))
            self._cons[0] = cons + n * stride
        return n

    def copy_to(self, fd: int, itemsize: int) -> int:
        """Write what :meth:`take_bytes` takes to the file ``fd``; the bytes written."""
        return sum(write_all(fd, chunk) for chunk in self.take_bytes(itemsize))

    def take_bytes(self, itemsize: int) -> list[bytes]:
        """The committed records of ``itemsize`` bytes as they lie in the ring (headers
        included: :func:`decode` reads them back), spilled ones first, as copies; their
        space is freed. No record is decoded: for a spool (kernmlops.spool.copy)."""
        chunks, self._spilled = self._spilled, []
        cons, prod = self._positions()
        stride = record_stride(itemsize)
        n = (prod - cons) // stride
        if n <= 0:
            return chunks
        # The records still being written end the run (their header's busy bit).
        if imported("numpy"):
            committed = self._committed_np(cons, n, stride)
        else:
            committed = self._committed_py(cons, n, stride)
        length = committed * stride
        if length:
            chunks.append(self._bytes(cons, length))
            self._cons[0] = cons + length
        return chunks

    def take_records(self) -> list[bytes]:
        """Every committed record, each as its own bytes and of whatever length
        its program gave it (a ring whose programs submit records of several
        sizes: ebpf_exporter's span rings); discarded ones are skipped. Their
        space is freed. One Python step per record: for rings of rare events."""
        cons, prod = self._positions()
        mask, out, pos = self.size - 1, [], cons
        while pos < prod:
            header = self._words[(self._page + (pos & mask)) // 4]
            if header & BUSY_BIT:
                break  # still being written: it and all after wait for the next take
            length = header & LEN_MASK
            if header & DISCARD_BIT:
                self.discarded += 1
            else:
                out.append(self._bytes(pos + HEADER_SIZE, length))
            pos += record_stride(length)
        if pos != cons:
            self._cons[0] = pos
        self.records += len(out)
        return out

    def _committed_py(self, cons: int, n: int, stride: int) -> int:
        """Committed records from ``cons`` (of ``n``): up to the first one still being
        written (a header never straddles the ring's end)."""
        mask = self.size - 1
        for i in range(n):
            at = self._page + ((cons + i * stride) & mask)
            if self._words[at // 4] & BUSY_BIT:
                return i
        return n

    def _committed_np(self, cons: int, n: int, stride: int) -> int:
        """Committed records from ``cons`` (of ``n``), with one numpy pass over the
        headers (a header never straddles the ring's end: records are 8-aligned)."""
        mask = self.size - 1
        start = cons & mask
        first = min(n, (self.size - start + stride - 1) // stride)
        words = np.frombuffer(self._data_map, dtype="<u4", offset=self._page)
        headers = [words[start // 4 :: stride // 4][:first]]
        if n > first:
            wrap = (start + first * stride) & mask
            headers.append(words[wrap // 4 :: stride // 4][: n - first])
        busy_at = 0
        for h in headers:
            busy = np.flatnonzero(h & BUSY_BIT)
            if busy.size:
                return busy_at + int(busy[0])
            busy_at += len(h)
        return n

    def _bytes(self, pos: int, length: int) -> bytes:
        """``length`` bytes of the data area from ring position ``pos`` (wrapping)."""
        start = self._page + (pos & (self.size - 1))
        end = self._page + self.size
        if start + length <= end:
            return self._data_map[start : start + length]
        return self._data_map[start:end] + self._data_map[self._page : start + length - self.size]

    def drain(self, max_records: int | None = None) -> np.ndarray:
        """Every committed record since the last drain (a copy), spilled ones first,
        and free their space."""
        if self.dtype is None:
            raise ValueError(f"ring {self.name or '?'}: no record type to decode with")
        if self._data is None:
            self._data = np.frombuffer(self._data_map, dtype=np.uint8, offset=self._page)
        data = self._data
        parts = []
        for chunk in self._spilled:
            buf = np.frombuffer(chunk, dtype=np.uint8)
            batch = decode(buf, self.size, 0, len(buf), self.dtype)
            parts.append(batch.records)
            self.discarded += batch.discarded
        self._spilled.clear()
        cons, prod = self._positions()  # prod read once: later commits wait for the next drain
        start = cons & (self.size - 1)
        if start + (prod - cons) > self.size:
            # A run that wraps: its two pieces joined (the data area is mapped once).
            joined = np.frombuffer(self._bytes(cons, prod - cons), dtype=np.uint8)
            batch = decode(joined, self.size, 0, prod - cons, self.dtype, max_records)
            batch.consumed += cons
        else:
            batch = decode(data, self.size, cons, prod, self.dtype, max_records)
        if batch.consumed != cons:
            self._cons[0] = batch.consumed
        self.discarded += batch.discarded
        records = join_records([*parts, batch.records]) if parts else batch.records
        self.records += len(records)
        return records

    def close(self) -> None:
        # Views pin the mmaps; drop them first.
        self._data = None
        for view in (self._cons, self._prod, self._words_):
            if view is not None:
                view.release()
        self._cons_map.close()
        self._prod_map.close()
        if self._data_map_ is not None:
            self._data_map_.close()

    def __enter__(self) -> RingBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_all(fd: int, data: bytes | memoryview) -> int:
    """Write all of ``data`` to ``fd`` (a write may take less than asked)."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])
    return done


class RingGroup:
    """The rings of one table on a machine with ring groups (one ring per group of
    CPUs, common.h's KMO_RING_OF), read as one ring: what each holds is taken ring
    by ring, so the records of one ring (and of one CPU) keep their order, and no
    order is kept across rings. Sizes and fill levels are each ring's own: the
    group is due for a drain as soon as one of its rings is."""

    def __init__(self, rings: Sequence[RingBuffer]) -> None:
        if not rings or len({r.size for r in rings}) != 1:
            raise ValueError("a ring group is rings of one size")
        self.rings = list(rings)
        self.name = rings[0].name
        self.size = rings[0].size

    @property
    def fd(self) -> int:
        """The first ring's map fd (see :attr:`fds` for all of them)."""
        return self.rings[0].fd

    @property
    def fds(self) -> list[int]:
        return [r.fd for r in self.rings]

    @property
    def dtype(self) -> np.dtype | None:
        return self.rings[0].dtype

    @dtype.setter
    def dtype(self, dtype: np.dtype | None) -> None:
        for r in self.rings:
            r.dtype = dtype

    @property
    def records(self) -> int:
        return sum(r.records for r in self.rings)

    @property
    def discarded(self) -> int:
        return sum(r.discarded for r in self.rings)

    @property
    def data_mapped(self) -> bool:
        return any(r.data_mapped for r in self.rings)

    @property
    def spilled(self) -> bool:
        return any(r.spilled for r in self.rings)

    @property
    def spilled_bytes(self) -> int:
        return sum(r.spilled_bytes for r in self.rings)

    def pending_bytes(self) -> int:
        """The fullest ring's unread bytes (each ring fills on its own)."""
        return max(r.pending_bytes() for r in self.rings)

    def spill(self, itemsize: int) -> int:
        return sum(r.spill(itemsize) for r in self.rings)

    def take_bytes(self, itemsize: int) -> list[bytes]:
        return [chunk for r in self.rings for chunk in r.take_bytes(itemsize)]

    def copy_to(self, fd: int, itemsize: int) -> int:
        return sum(r.copy_to(fd, itemsize) for r in self.rings)

    def drain(self, max_records: int | None = None) -> np.ndarray:
        parts = [r.drain(max_records) for r in self.rings]
        return join_records(parts) if len(parts) > 1 else parts[0]

    def close(self) -> None:
        for r in self.rings:
            r.close()

    def __enter__(self) -> RingGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
