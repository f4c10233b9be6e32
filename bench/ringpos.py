"""Does storing the ring's consumer position with ``struct.pack_into`` make the kernel
refuse records? (It zeroes the 8 bytes before it writes them.)

``ringpos.bpf.c`` sends quanta_runtime-sized batches on every 32nd switch into a ring
shared by the CPUs and into each CPU's own ring, during ``stress-ng --switch 2``.
Threads empty the rings every 10 ms by moving the consumer position to the producer's,
either with ``struct.pack_into`` (what ``RingBuffer`` did) or with one 8-byte store
through a memoryview (what it does now); the two ways alternate over the rounds. The
program counts refused outputs, how long each took and how much the ring reported
unread right after (a ring full of unread records reports close to its size).

Run (root, clang and bpftool as for ``make bpf``):

    sudo python -m bench ringpos --rounds 4 --seconds 30
"""

from __future__ import annotations

import mmap
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

from bench import harness
from bench.harness import save

BENCH = Path(__file__).resolve().parent

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "none; 0 batches refused with either way of storing the consumer position"

SOURCE = BENCH / "ringpos.bpf.c"
RINGS = ("shared", "own0", "own1")
FIELDS = ("sent", "refused", "refused_ns_max", "unread_after_max")


def empty(obj, name: str, way: str, stop: threading.Event) -> None:
    fd, page = obj.map(name).fd, mmap.PAGESIZE
    cons = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
    prod = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
    tail, head = memoryview(cons)[:8].cast("Q"), memoryview(prod)[:8].cast("Q")
    while not stop.wait(0.01):
        if way == "pack_into":
            struct.pack_into("<Q", cons, 0, head[0])
        else:
            tail[0] = head[0]
    tail.release()
    head.release()
    cons.close()
    prod.close()


def one_round(obj_path: Path, way: str, seconds: int) -> dict:
    from kernmlops.ebpf.objects import open_and_load

    with open_and_load(obj_path) as obj:
        stop = threading.Event()
        threads = [
            threading.Thread(target=empty, args=(obj, n, way, stop), daemon=True) for n in RINGS
        ]
        for t in threads:
            t.start()
        obj.attach_all()
        storm = subprocess.run(
            ["stress-ng", "--switch", "2", "--timeout", f"{seconds}s"], capture_output=True
        )
        obj.detach()
        stop.set()
        for t in threads:
            t.join()
        if storm.returncode != 0:
            sys.exit(f"stress-ng failed: {storm.stderr.decode().strip()[-300:]}")
        out = {}
        for key, ring in ((0, "shared"), (1, "own")):
            raw = obj.map("outputs").lookup(key)
            per = len(raw) // os.cpu_count()
            cpus = [struct.unpack_from("<4Q", raw, c * per) for c in range(os.cpu_count())]
            out[ring] = {
                "sent": sum(c[0] for c in cpus),
                "refused": sum(c[1] for c in cpus),
                "refused_ns_max": max(c[2] for c in cpus),
                "unread_after_max": max(c[3] for c in cpus),
            }
        return out


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__name__, __doc__)
    parser.add_argument("--rounds", type=int, default=4, help="rounds (the ways alternate)")
    parser.add_argument("--seconds", type=int, default=30, help="storm per round")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "ringpos.json")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("needs root (BPF)")
    from kernmlops.ebpf.build import compile_object

    obj_path = BENCH / "build" / "ringpos.bpf.o"
    obj_path.parent.mkdir(exist_ok=True)
    if not obj_path.exists() or obj_path.stat().st_mtime < SOURCE.stat().st_mtime:
        compile_object(SOURCE, obj_path)
    rounds = []
    for r in range(args.rounds):
        way = ("pack_into", "one store")[r % 2]
        got = one_round(obj_path, way, args.seconds)
        rounds.append({"way": way, **got})
        print(
            f"round {r + 1}/{args.rounds} ({way}): "
            + "  ".join(
                f"{ring}: {v['refused']} of {v['sent'] + v['refused']:,} refused "
                f"(slowest {v['refused_ns_max']} ns, unread after {v['unread_after_max']:,} B)"
                for ring, v in got.items()
                if ring != "way"
            ),
            flush=True,
        )
    for way in ("pack_into", "one store"):
        mine = [r for r in rounds if r["way"] == way]
        refused = sum(r[ring]["refused"] for r in mine for ring in ("shared", "own"))
        sent = sum(r[ring]["sent"] for r in mine for ring in ("shared", "own"))
        print(f"{way:10s}: {refused} of {sent + refused:,} batches refused")
    save(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds})
    print(f"-> {args.out}")
    return 0
