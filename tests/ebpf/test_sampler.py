"""The native file sampler (native/sampler.c): files read whole at each tick of a
fixed grid on a thread without the GIL; what it could not take is counted, never
silently left out."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf import sampler

#: a sampler at normal priority keeps a 50-Hz grid
pytestmark = pytest.mark.quiet


@pytest.fixture(autouse=True)
def _built(bpf_build_dir: Path) -> None:
    """The sampler is in the ring copier's library, built beside the objects."""
    assert sampler.available(), f"no sampler in the library in {bpf_build_dir}"


def _open(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def test_every_file_is_read_whole_at_each_tick_of_the_grid(tmp_path: Path) -> None:
    # Two files, one larger than the first read (8 KiB), the other changed while the
    # sampler runs: each sample holds both, whole, as they were at its time. The
    # change is one byte written in place (write_bytes truncates first: a sample in
    # between, which a busy machine makes likely, read the file empty).
    big, small = tmp_path / "big", tmp_path / "small"
    big.write_bytes(b"A" * 20_000)
    small.write_bytes(b"0")
    fds = [_open(big), _open(small)]
    s = sampler.NativeSampler(fds, PERIOD_NS, 1 << 20, "test")  # 50 Hz
    t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    try:
        s.start(priority=0)
        # A busy machine may leave the thread off its CPU for a while: the change
        # comes after its first sample, and the stop after a sample of the change.
        samples = _until(s, lambda got: len(got) > 0)
        time.sleep(0.25)
        with small.open("r+b", buffering=0) as f:
            f.write(b"1")
        written = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        time.sleep(0.25)
        samples += _until(s, lambda got: any(t > written for t, _ in got))
        s.stop()
        samples += s.take()
        assert s.take() == []  # taken once
        missed = s.missed
        assert s.error == 0 and s.result == 0
    finally:
        s.close()
        for fd in fds:
            os.close(fd)
    t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    times = np.array([ns for ns, _ in samples])
    assert t0 <= times[0] and times[-1] <= t1 and np.all(np.diff(times) > 0)
    # On the grid whatever the load: the ticks fall every 20 ms from the first
    # sample, a sample is taken in its tick's period (late by less than one) or the
    # tick is counted missed, and no period holds two. So a wrong rate, a burst that
    # makes up late ticks, or a tick skipped without a count fails here.
    ticks = (times - times[0]) // PERIOD_NS
    assert np.all(np.diff(ticks) > 0), np.diff(times)
    assert len(samples) + missed == ticks[-1] + 1, (len(samples), missed, ticks[-1])
    assert all(data[0] == b"A" * 20_000 for _, data in samples)
    seen = [data[1] for _, data in samples]
    assert seen[0] == b"0" and seen[-1] == b"1" and set(seen) == {b"0", b"1"}


#: the grid's period in the test above (50 Hz)
PERIOD_NS = 20_000_000


def _until(
    s: sampler.NativeSampler, done: Callable[[list[tuple[int, list[bytes]]]], bool]
) -> list[tuple[int, list[bytes]]]:
    """Samples taken until ``done`` says they are enough (10 s at most)."""
    got: list[tuple[int, list[bytes]]] = []
    deadline = time.monotonic() + 10
    while not done(got) and time.monotonic() < deadline:
        time.sleep(0.005)
        got += s.take()
    return got


def test_a_sampler_stopped_before_its_thread_ran_still_takes_the_first_sample(
    tmp_path: Path,
) -> None:
    # the stop can come before the new thread is first scheduled (a hook started and
    # stopped at once, on a busy machine): its start's sample is still taken
    (tmp_path / "f").write_bytes(b"x")
    fd = _open(tmp_path / "f")
    s = sampler.NativeSampler([fd], 1_000_000_000, 1 << 20, "test")
    try:
        s._c.stop = 1  # as stop() sets it, before the thread runs
        s.start(priority=0)
        s.stop()
        assert [data for _, data in s.take()] == [[b"x"]]
    finally:
        s.close()
        os.close(fd)


def test_a_buffer_python_leaves_full_counts_each_tick_as_missed(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)  # a sample: 16 bytes of head and 104 of bytes
    fd = _open(f)
    s = sampler.NativeSampler([fd], 10_000_000, 5 * 120, "test")  # room for 5 samples
    try:
        s.start(priority=0)
        # nothing taken until the buffer is full and ticks go missed (waited for, not
        # slept: a busy machine may leave the thread off its CPU a while)
        deadline = time.monotonic() + 10
        while (s._c.taken < 5 or s._c.missed < 3) and time.monotonic() < deadline:
            time.sleep(0.01)
        first = s.take()
        # room again: sampling goes on
        second = _until(s, lambda got: len(got) >= 2)
        s.stop()
        second += s.take()
        missed = s.missed
    finally:
        s.close()
        os.close(fd)
    # five held (a sixth may land while take empties the buffer)
    assert 5 <= len(first) <= 6 and all(data == [b"x" * 100] for _, data in first)
    assert len(second) >= 2 and missed >= 3
    # every tick past the held ones counted missed, none lost silently: from the
    # first sample to the last, each 10-ms tick is a sample or a miss
    times = np.array([ns for ns, _ in first + second])
    ticks = (times - times[0]) // 10_000_000
    assert np.all(np.diff(ticks) > 0)
    assert len(times) + missed == ticks[-1] + 1, (len(first), len(second), missed, ticks)


def test_a_file_that_cannot_be_read_ends_the_sampler_with_its_error(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)  # read(2) of a folder: EISDIR
    s = sampler.NativeSampler([fd], 10_000_000, 1 << 16, "test")
    try:
        s.start(priority=0)
        deadline = time.monotonic() + 2
        while s.error == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.error == errno.EISDIR and s.take() == []
    finally:
        s.close()
        os.close(fd)
    assert s.result == errno.EISDIR


def test_takes_while_a_1_khz_sampler_runs_end_and_lose_nothing(tmp_path: Path) -> None:
    # At 1 kHz a sample came in during each pass of take() (it copied the whole 4-MiB
    # buffer per pass): the loop never ended, and a collection with poll_hz 1000 hung at
    # its stop. Here each pass is made to last 2 ms, so a sample always comes in during
    # it: every take must still end, and the samples add up to the ticks.
    import threading

    path = tmp_path / "meminfo-like"
    path.write_bytes(Path("/proc/meminfo").read_bytes())
    fd = _open(path)
    s = sampler.NativeSampler([fd], 1_000_000, 64 << 20, "test")  # 1 kHz

    class Slow:
        def __init__(self, lib: object) -> None:
            self._lib = lib

        def __getattr__(self, name: str) -> object:
            return getattr(self._lib, name)

        def kmo_sampler_take(self, *args: object) -> int:
            time.sleep(0.002)  # a busy machine's pass: a sample comes in meanwhile
            return self._lib.kmo_sampler_take(*args)

    s._lib = Slow(s._lib)
    got: list = []

    def take() -> None:
        got.extend(s.take())

    try:
        s.start(priority=0)
        for _ in range(5):
            time.sleep(0.05)
            taker = threading.Thread(target=take, daemon=True)
            taker.start()
            taker.join(timeout=5)
            assert not taker.is_alive(), "a take did not end while samples came in"
        s.stop()
        take()
        missed = s.missed
    finally:
        s.close()
        os.close(fd)
    times = np.array([ns for ns, _ in got])
    assert np.all(np.diff(times) > 0)  # each sample once, in order
    ticks = round((times[-1] - times[0]) / 1_000_000) + 1
    assert len(got) + missed >= ticks - 1  # every tick a sample or counted missed
    assert len(got) >= 100  # ~250 ticks, the machine's load allowing


def test_the_first_sample_is_in_when_start_returns(tmp_path: Path) -> None:
    """start() returns once the thread took its first sample, however late the thread
    runs (here 0.2 s late): a hook's first poll has the start's sample."""
    f = tmp_path / "f"
    f.write_bytes(b"x")
    fd = _open(f)
    s = sampler.NativeSampler([fd], 10 * PERIOD_NS, 1 << 20, "test")
    real = s._lib

    class Late:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def kmo_sampler_run(self, c: object) -> int:
            time.sleep(0.2)  # the thread kept off its CPU
            return real.kmo_sampler_run(c)

    s._lib = Late()  # type: ignore[assignment]
    try:
        s.start(priority=0)
        assert [body for _, body in s.take()] == [[b"x"]]
    finally:
        s.stop()
        s.close()
        os.close(fd)


def test_the_buffer_is_all_there_from_the_start_and_never_grows(tmp_path: Path) -> None:
    # Growing it later would take the process's mmap lock, which a collector thread a
    # storm keeps off the CPU may hold: the sampler stops for as long (sampler.c)
    f = tmp_path / "f"
    f.write_bytes(b"y" * 3000)
    fd = _open(f)
    s = sampler.NativeSampler([fd], 1_000_000, 8 << 20, "test")
    try:
        s.start(priority=0)
        buf = s._c.buf
        assert s._c.mapped == 1 and s._c.cap == 8 << 20 and buf
        # samples pile up (nothing taken) well past the 64 KiB a grown buffer began at
        _until_taken = time.monotonic() + 10
        while s._c.used < 256 << 10 and time.monotonic() < _until_taken:
            time.sleep(0.01)
        assert s._c.used >= 256 << 10 and s._c.buf == buf and s._c.cap == 8 << 20
        got = s.take()
        assert got and all(data == [b"y" * 3000] for _, data in got)
    finally:
        s.close()
        os.close(fd)
