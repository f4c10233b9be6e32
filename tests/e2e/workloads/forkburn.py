"""Test workload: fork N children that each burn a given CPU time, then report.

With FORKBURN_WAIT set, it first waits for a line on stdin.
Prints one JSON line: the parent's pid, the children's pids, and the CPU
seconds of the whole tree from getrusage (after the gate, if any) (self + waited-for children), an
account kept by the kernel independently of kernmlops.
"""

import json
import os
import resource
import sys
import time


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += 1


def tree_cpu_s() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    return total


def schedstat() -> list[int]:
    """on-CPU ns, run-queue wait ns, timeslices: the scheduler's own account."""
    with open("/proc/self/schedstat") as fh:
        return [int(x) for x in fh.read().split()]


def main() -> int:
    before = 0.0
    sched0 = schedstat()
    if os.environ.get("FORKBURN_WAIT"):
        sys.stdin.readline()  # held until the test has attached its probes
        before = tree_cpu_s()  # start-up CPU, spent before anything was traced
        sched0 = schedstat()
    children = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
    exit_code = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:
            burn(seconds)
            os._exit(0)
        pids.append(pid)
    burn(seconds / 2)
    for pid in pids:
        os.waitpid(pid, 0)
    cpu = tree_cpu_s() - before
    sched = [b - a for a, b in zip(sched0, schedstat(), strict=True)]
    report = {"pid": os.getpid(), "children": pids, "cpu_s": cpu, "schedstat": sched}
    print(json.dumps(report), flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
