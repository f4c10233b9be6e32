"""What one wake-up of a 10-Hz Python sampler thread costs in CPU, by what it does.

A thread waits on a fixed 100-ms grid (``Event.wait`` or ``time.sleep``) and then
does nothing, reads /proc/meminfo, or reads and parses it; its run time over 100
wake-ups is read from ``/proc/self/task/<tid>/schedstat``. The anchor for
``memory_usage``'s sampler.

    python -m bench wakecost
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from bench import harness
from kernmlops.host.meminfo import parse_meminfo

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "none; the anchor for a sampler thread's CPU"

MODES = ("wait", "wait+read", "wait+read+parse", "sleep+read+parse")


def ran(stat: str) -> int:
    """ns the thread has run (schedstat's first field)."""
    with open(stat) as f:
        return int(f.read().split()[0])


def cost(mode: str, wakes: int = 100) -> float:
    """µs of CPU per wake-up."""
    fd = os.open("/proc/meminfo", os.O_RDONLY)
    event = threading.Event()
    out: list[float] = []

    def run() -> None:
        stat = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        due = time.monotonic_ns() + 100_000_000
        start = 0
        for i in range(wakes + 5):
            delay = max(0, due - time.monotonic_ns()) / 1e9
            time.sleep(delay) if mode.startswith("sleep") else event.wait(delay)
            if "read" in mode:
                text = os.pread(fd, 8192, 0)
                if "parse" in mode:
                    parse_meminfo(text.decode())
            due += 100_000_000
            if i == 4:  # past the thread's start
                start = ran(stat)
        out.append((ran(stat) - start) / wakes / 1000)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    os.close(fd)
    return out[0]


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__name__, __doc__)
    parser.add_argument("--out", type=Path, default=harness.result_path("wakecost"))
    args = parser.parse_args(argv)
    us = {}
    for mode in MODES:
        us[mode] = cost(mode)
        print(f"{mode:18s} {us[mode]:6.0f} µs of CPU per wake-up")
    harness.save(args.out, {"wakes": 100, "period_ms": 100, "cpu_us_per_wake": us})
    print(f"wrote {args.out}")
    return 0
