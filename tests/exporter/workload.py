"""A job with known kernel activity, for the exporter's end-to-end test.

It renames itself (the exporter filters on the name in the kernel), prepares
its file, prints "ready", waits for a line on stdin, then makes: direct
(O_DIRECT) 4 KiB writes, 1 ms sleeps, getppid calls, failing opens (ENOENT),
page faults on fresh anonymous pages, CPU changes, and a CPU burn. It prints
what it did as JSON and exits.

usage: workload.py NAME FILE WRITES SLEEPS GETPPIDS ENOENTS PAGES MOVES BURN_MS
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import sys
import time
from pathlib import Path

PAGE = 4096


def main() -> int:
    name, path = sys.argv[1], sys.argv[2]
    writes, sleeps, getppids, enoents, pages, moves, burn_ms = map(int, sys.argv[3:10])
    Path("/proc/self/comm").write_text(name)
    with open(path, "wb") as fh:  # allocate the blocks now: the writes then touch data only
        fh.write(b"\xa5" * PAGE * writes)
        fh.flush()
        os.fsync(fh.fileno())
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, PAGE)  # page-aligned, as O_DIRECT wants
    buf.write(b"\x5a" * PAGE)
    cpus = sorted(os.sched_getaffinity(0))
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 2
    for i in range(writes):
        os.pwrite(fd, buf, i * PAGE)
    os.close(fd)
    for _ in range(sleeps):
        time.sleep(0.001)
    for _ in range(getppids):
        os.getppid()
    for _ in range(enoents):
        with contextlib.suppress(FileNotFoundError):
            os.open("/nonexistent-kmo-exporter-test/x", os.O_RDONLY)
    area = mmap.mmap(-1, pages * PAGE)
    for i in range(pages):
        area[i * PAGE] = 1  # the first touch of each page faults
    moved = 0
    if len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[0]})  # from here on each call changes the CPU
        for i in range(moves):
            os.sched_setaffinity(0, {cpus[(i + 1) % 2]})
            moved += 1
        os.sched_setaffinity(0, cpus)
    end = time.thread_time() + burn_ms / 1000
    while time.thread_time() < end:
        pass
    print(json.dumps({"writes": writes, "moved": moved, "cpus": len(cpus)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
