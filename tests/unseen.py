"""Switches a program never sees, for the tests of the sched_switch programs that keep a
per-CPU "who came in" record (quanta_runtime's ``oncpu``, the exporter's
``exp_oncpu_cur``).

Some kernels never show some switches to tracepoints: on the VMs this project runs on,
no switch out of the VM's guest agent's threads reaches sched_switch (perf sees none
either), so the task that comes in then comes in unseen. :class:`Unseen` leaves the
record as such a switch leaves it, for a task burning on another CPU (:data:`BURN`).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

#: burn MS: a C workload (tests.hooks.conftest.build_c) that waits for a byte on stdin,
#: then runs until it has used MS ms more of CPU time, renicing itself halfway (the
#: kernel re-sets the running task there, as it does at exit in an autogroup), and
#: exits. More than its CPU time when the byte came: that counts its start too (the
#: shell and chrt exec'd in the same thread), which on a slow machine (the kernel lab)
#: took all of MS, so the burn ended as it began
BURN = r"""
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static long cpu_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void burn_until(long ms)
{
	while (cpu_ms() < ms)
		;
}

int main(int argc, char **argv)
{
	long ms = atol(argv[1]), start;
	char c;

	if (read(0, &c, 1) != 1)
		return 1;
	start = cpu_ms();
	burn_until(start + ms / 2);
	if (setpriority(PRIO_PROCESS, 0, 1))
		return 2;
	burn_until(start + ms);
	return 0;
}
"""


def wait_asleep(pid: int, comm: str, timeout_s: float = 10) -> None:
    """Until process ``pid`` runs ``comm`` and sleeps (BURN: on its stdin, switched out
    once since it started)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.index("(") + 1 : stat.rindex(")")] == comm and stat.split()[2] == "S":
            return
        assert time.monotonic() < deadline, f"{comm} ({pid}) never went to sleep: {stat}"
        time.sleep(0.01)


class Unseen:
    """While entered, a thread on CPU ``cpu`` keeps blanking the pid in every CPU's
    slot of the loaded object's per-CPU ``struct oncpu`` map ``name``: every task
    switched in meanwhile is one whose switch in the program did not see. The thread
    runs beside the task it blanks for (pinned elsewhere), never in turn with it."""

    def __init__(self, obj: Any, name: str, cpu: int) -> None:
        from kernmlops.ebpf import libbpf
        from kernmlops.ebpf.btf import Kind
        from kernmlops.ebpf.spec import object_spec

        self.map = obj.map(name)
        oncpu = object_spec(obj.path).btf.find(Kind.STRUCT, "oncpu")
        self.pid_at = next(bits // 8 for m, _, bits, _ in oncpu.members if m == "pid")
        self.stride = len(self.map.lookup(0)) // libbpf.num_possible_cpus()
        self.cpu = cpu
        self.blanked = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        os.sched_setaffinity(threading.get_native_id(), {self.cpu})
        while not self._stop.is_set():
            raw = bytearray(self.map.lookup(0))
            for at in range(self.pid_at, len(raw), self.stride):
                raw[at : at + 4] = bytes(4)
            self.map.update(0, bytes(raw))
            self.blanked += 1
            time.sleep(0.0002)

    def __enter__(self) -> Unseen:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
