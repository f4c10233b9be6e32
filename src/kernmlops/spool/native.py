"""The ring copy's side of the native copier (kernmlops.ebpf.copier): while a C thread
moves a ring into the spool's segments, the spool hands it its next segments (an
active one, and a standby on disk for when the memory budget is spent) and learns
from it what was written. A part of :class:`kernmlops.spool.copy.RingSpool`."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kernmlops.ebpf.copier import ACTIVE, DONE, STANDBY, ChecksummedZstd, CopiedRing, Copier
from kernmlops.spool.frames import read_codec
from kernmlops.spool.segment import Segment

if TYPE_CHECKING:
    from kernmlops.spool.memory import SpoolMemory


class CopierSide:
    """RingSpool's methods for the native copier: a mixin, whose state, its tail
    (``_tail``) and its ``_new_segment`` are the spool's, under its lock (``_cond``)."""

    memory: SpoolMemory | None
    _cond: threading.Condition
    _live: list[Segment]
    _queued: int
    #: the native copier and its ring, while it moves this ring (attach)
    _copier: Copier | None
    _ring: CopiedRing | None
    #: the other rings that write into this spool's segments, each with its copier
    #: (a hook's rings of several CPU groups); their errors are the spool's too
    _shared: list[tuple[Copier, CopiedRing]]
    #: the disk segment the copier goes on in once the memory budget is spent
    _standby: Segment | None
    #: segments the copier left whose runway (native/runway.c) is not given back yet
    _untrimmed: list[Segment]

    def attach(
        self, copier: Copier, ring: CopiedRing, shared: Sequence[tuple[Copier, CopiedRing]] = ()
    ) -> None:
        """From now on ``copier`` moves ``ring`` into this spool and :meth:`take` only
        looks at what it did: the empty tail becomes its active segment (zstd frames
        on disk, where it is not in memory), and a disk segment waits as its standby
        for when the memory budget is spent. ``shared``: more rings, each moved by its
        own copier, that write into the same segments (ring groups): one spool, so
        its rows are counted, made and recovered as one ring's."""
        with self._cond:
            if any(c.compresses != copier.compresses for c, _ in shared):
                raise RuntimeError("the copiers of one spool write one format")
            for other, other_ring in shared:
                other.share(other_ring, ring)
            self._shared = list(shared)
            tail = self._tail
            if tail.written or self._queued:
                raise RuntimeError("the copier takes over an empty spool")
            if not tail.in_memory and copier.compresses:
                tail.zstd_native, tail.codec = True, None
                tail.write_meta()
            tail.native = copier.segment(tail.fd, zstd=tail.zstd_native, memory=tail.in_memory)
            self._copier, self._ring = copier, ring
            self._standby = self._standby_segment()
            copier.rotate(ring, tail.native, self._standby.native)

    @property
    def standby_waits(self) -> tuple[int, float]:
        """(times, seconds) the copier waited for a standby (CopiedRing.standby_waits):
        the spool's first ring holds its segments, its standby and these counts."""
        return self._ring.standby_waits if self._ring is not None else (0, 0.0)

    def _standby_segment(self) -> Segment:
        """A new disk segment for the copier to go on in once the budget is spent."""
        copier = self._copier
        assert copier is not None
        seg = self._new_segment(False, zstd_native=copier.compresses)
        if seg.rows_exact:  # the tail goes on taking records until the copier switches
            seg.rows_exact = False
            seg.write_meta()
        seg.native = copier.segment(seg.fd, zstd=seg.zstd_native, memory=False)
        return seg

    def _arm_standby(self) -> None:
        assert self._copier is not None and self._ring is not None
        self._standby = self._standby_segment()
        self._copier.set_standby(self._ring, self._standby.native)

    def _discard(self, seg: Segment) -> None:
        """Delete a segment the copier never wrote in (and can no longer take)."""
        os.close(seg.fd)
        seg.remove()
        if self._copier is not None:
            self._copier.forget(seg.native)

    def _drop_standby(self) -> None:
        """Take the standby back from the copier; delete it unless it was taken up."""
        if self._copier is None or self._ring is None:
            return
        self._copier.set_standby(self._ring, None)  # from here the copier cannot take it
        seg, self._standby = self._standby, None
        if seg is None:
            return
        if seg.native.state != STANDBY:
            self._taken_up(seg)  # just before: it is the copier's tail now
            return
        self._discard(seg)

    def _taken_up(self, seg: Segment) -> None:
        """The copier went on in the standby ``seg``: it is live from now on."""
        self._pull(seg)
        self._live.append(seg)

    def _pull(self, seg: Segment) -> None:
        """Bring ``seg``'s counts up to what the copier wrote; once the copier left it,
        its runway goes back."""
        # before written; done once the disk writer, too, has written all it queued
        seg.native_done = seg.native.state == DONE and not seg.native.queued
        seg.written = seg.on_disk = int(seg.native.written)
        seg.file_bytes = int(seg.native.file_bytes)
        if seg.native_done:
            self._left(seg)

    def _left(self, seg: Segment) -> None:
        """The copier left ``seg`` (it is done): what its runway allocated past its
        end goes back to the filesystem, now or at a later sync."""
        if self._copier is not None and not self._copier.trim(seg.native, seg.fd):
            self._untrimmed.append(seg)

    def _sync(self, check: bool = True) -> None:
        """Bring the segments' counts up to what the copier wrote; a segment it went
        on in becomes live (and a new standby is armed); its write error is raised
        (``check``: a detach after the error was reported does not raise it again)."""
        ring, copier = self._ring, self._copier
        if ring is None or copier is None:
            return
        for each, each_ring in ((copier, ring), *self._shared):
            if check and each.result is not None and each.result < 0:
                err = -each.result  # its loop ended on an error (epoll): nothing copies now
                raise OSError(err, f"the ring copier stopped: {os.strerror(err)}")
            if each_ring.error and check:
                # the segment the copier was writing: its filesystem is the one that failed
                writing = next((s for s in self._live if s.native is not None
                                and not s.native_done and s.native.state == ACTIVE),
                               self._tail)  # fmt: skip
                raise OSError(each_ring.error, os.strerror(each_ring.error), str(writing.path))
        waiting, self._untrimmed = self._untrimmed, []
        for seg in waiting:
            if seg.native is not None:  # (a retired one is deleted: its blocks with it)
                self._left(seg)
        for seg in self._live:
            if seg.native is not None and not seg.native_done:
                self._pull(seg)
        sb = self._standby
        if sb is not None and sb.native.state != STANDBY:
            self._standby = None
            self._taken_up(sb)
            self._arm_standby()

    def detach(self) -> None:
        """The copier has stopped (its last copy made): the spool goes on in Python."""
        with self._cond:
            if self._ring is None:
                return
            self._sync(check=False)
            self._drop_standby()
            self._untrimmed = []
            for seg in self._live:
                if seg.native is not None:
                    # the copiers have stopped (their runway threads with them): the
                    # active segment's runway too, before Python writes on in it
                    self._copier.trim(seg.native, seg.fd)
                    if seg.zstd_native:
                        # for a write after the copier (a CPU's last batch): frames
                        # with zstd's checksum too, where libzstd takes the parameter
                        seg.codec = ChecksummedZstd.make() or read_codec()
                        seg.zstd_native = False
                    seg.native = None
                    seg.native_done = False
            self._copier = self._ring = None
            self._shared = []

    def _rotate(self) -> None:
        """(With the lock held, the tail read to its end as last seen) a new tail for
        the copier, in memory if the budget allows, else on disk, handed over with a
        new standby in one step. The copier is never left without a standby: it
        would wait for Python's next look, which a storm of more runnable tasks
        than CPUs delays by seconds (a CI run lost 3.6M of 3.8M records so, with a
        1-MiB budget spent 30 ms after each rotation). Where the copier wrote on
        or went on in the standby since the last look, nothing changes."""
        copier, ring = self._copier, self._ring
        assert copier is not None and ring is not None
        tail, old = self._tail, self._standby
        in_memory = self.memory is not None and self.memory.available()
        seg = self._new_segment(in_memory, zstd_native=not in_memory and copier.compresses)
        seg.native = copier.segment(seg.fd, zstd=seg.zstd_native, memory=in_memory)
        standby = self._standby_segment()
        expect = (old.native if old is not None else None, tail.written)
        if not copier.rotate(ring, seg.native, standby.native, expect):
            self._discard(seg)  # (its json's rows_before assumed the tail read to its end)
            self._discard(standby)
            self._sync()  # a standby the copier went on in is live now
            return
        self._standby = standby
        if old is not None:
            self._discard(old)  # still the standby at the rotation: never written
        self._live.append(seg)
        self._sync()
