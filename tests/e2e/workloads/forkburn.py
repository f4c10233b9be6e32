"""Test workload: fork N children that each burn a given CPU time, then report.

Prints one JSON line: the parent's pid, the children's pids, and the CPU
seconds of the whole tree from getrusage (self + waited-for children), an
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


def main() -> int:
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
    cpu = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        cpu += ru.ru_utime + ru.ru_stime
    print(json.dumps({"pid": os.getpid(), "children": pids, "cpu_s": cpu}), flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
