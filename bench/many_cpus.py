"""`kernmlops collect` on machines with more CPUs than this one, emulated: a check
of what the defaults scale (rings, copiers, zstd workers, per-CPU drops), not of
speed.

For each CPU count the kernel lab (`kernmlops vm`: QEMU without KVM, the guest
20-28x slower than the host) boots that many virtual CPUs over NUMA nodes and
runs `kernmlops collect -- stress-ng --switch N -t 10` (the storm's own tree,
default config) with this checkout's code and objects. The results file keeps,
for each count, the manifest's rings, copier threads and zstd workers against
the defaults kernmlops computes for that count, the events, drops and drops per
CPU, the CPUs the rows came from, and the boot and collection times. The guest's
CPUs share this machine's two, so the storm's rate says nothing about a real
machine of that size: 64 CPUs boot in about 8 minutes here.

    sudo python -m bench many-cpus --cpus 24,64
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import harness

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "the defaults' rings, copiers and zstd workers at each CPU count; 0 drops"


def guest_script(out: Path, pairs: int, seconds: int) -> str:
    """What the guest runs: this interpreter's kernmlops, the storm's own tree, from the
    folder it may write (the host's files are read-only there; stress-ng writes in its cwd)."""
    collect = [sys.executable, "-m", "kernmlops", "collect", "-o", str(out / "c"), "--no-progress"]
    storm = ["stress-ng", "--switch", str(pairs), "-t", str(seconds)]
    return f"cd {out} && date +%s.%N > start; {' '.join(collect)} -- {' '.join(storm)}"


def expected(cpus: int) -> dict[str, int]:
    """The rings, copiers and zstd workers kernmlops' defaults give ``cpus`` CPUs."""
    from kernmlops.ebpf.copier import default_workers
    from kernmlops.hooks.bpf import default_ring_groups

    rings = default_ring_groups(cpus)
    # the machine's workers are shared by the copiers, each getting its share rounded up
    return {
        "rings": rings,
        "copiers": rings,
        "zstd_workers": rings * -(-default_workers(cpus) // rings),
    }


def one(cpus: int, numa: int, pairs: int, seconds: int, timeout: float) -> dict[str, Any]:
    """Boot ``cpus`` CPUs, collect the storm, read its manifest and rows."""
    import polars as pl

    from kernmlops.data import read_collection

    out = Path(tempfile.mkdtemp(prefix="kmo-many-cpus-", dir="/var/tmp"))
    try:
        began = time.time()
        proc = subprocess.run(
            [sys.executable, "-m", "kernmlops", "vm", "--cpus", str(cpus), "--numa", str(numa),
             "--memory", "12G", "-o", str(out), "--timeout", str(timeout), "--",
             "sh", "-c", guest_script(out, pairs, seconds)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout + 60,
        )  # fmt: skip
        ended = time.time()
        result: dict[str, Any] = {"cpus": cpus, "numa": numa, "pairs": pairs, "rc": proc.returncode}
        folders = sorted((out / "c" / "curated").glob("*/*"))
        if proc.returncode != 0 or not folders:
            result["error"] = (proc.stderr or proc.stdout)[-2000:]
            return result
        start = float((out / "start").read_text())
        manifest = json.loads((folders[0] / "manifest.json").read_text())
        hook = manifest["hooks"]["quanta_runtime"]
        copier = hook.get("copier") or {}
        quanta = read_collection(folders[0])["quanta_runtime"]
        result.update(
            boot_s=round(start - began, 1),
            collect_s=round(ended - start, 1),
            online=len(manifest["system"]["online_cpus"]),
            got={
                "rings": hook.get("rings"),
                # one copier is not counted in the manifest: its one cpu_s is
                "copiers": copier.get("copiers") or len(copier.get("cpu_s") or []),
                "zstd_workers": copier.get("zstd_workers"),
            },
            want=expected(cpus),
            events=hook["events"],
            drops=hook["drops"],
            drops_by_cpu=hook["drops_by_cpu"],
            rows=hook["rows"],
            cpus_with_rows=quanta.select(pl.col("cpu").n_unique()).item(),
            copier_cpu_s=copier.get("cpu_s"),
            state=manifest["state"],
        )
        return result
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__name__, __doc__)
    parser.add_argument("--cpus", default="24,64", help="CPU counts, comma-separated")
    parser.add_argument("--seconds", type=int, default=10, help="the storm's length")
    parser.add_argument("--timeout", type=float, default=2400, help="seconds a count may take")
    parser.add_argument("--out", type=Path, default=harness.result_path("many-cpus"))
    args = parser.parse_args(argv)
    harness.begin("many-cpus", argv or sys.argv[1:])
    runs = []
    for cpus in (int(c) for c in args.cpus.split(",")):
        numa = 4 if cpus >= 32 else 2
        print(f"{cpus} CPUs over {numa} nodes: booting (minutes)...", flush=True)
        r = one(cpus, numa, max(cpus // 2, 1), args.seconds, args.timeout)
        runs.append(r)
        if "error" in r:
            print(f"  failed (rc {r['rc']}): {r['error'].splitlines()[-1:]}")
            continue
        ok = r["got"] == r["want"] and r["drops"] == 0
        print(
            f"  booted in {r['boot_s']} s, collected in {r['collect_s']} s: rings/copiers/zstd "
            f"{r['got']['rings']}/{r['got']['copiers']}/{r['got']['zstd_workers']} "
            f"(defaults {r['want']['rings']}/{r['want']['copiers']}/{r['want']['zstd_workers']}), "
            f"{r['events']:,} events, {r['drops']} drops, rows from {r['cpus_with_rows']} of "
            f"{r['online']} CPUs{'' if ok else '  <-- not as the defaults say'}"
        )
    harness.save(args.out, {**harness.record("many-cpus"), "runs": runs})
    print(f"wrote {args.out}")
    return 0 if all("error" not in r and r["got"] == r["want"] for r in runs) else 1
