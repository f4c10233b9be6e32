"""Helpers for end-to-end tests: run the real CLI, read what it wrote."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest

from kernmlops.data import Collection, read_collection
from kernmlops.ebpf.build import build
from kernmlops.ebpf.objects import BpfObject

WORKLOADS = Path(__file__).resolve().parent / "workloads"
KERNMLOPS = [sys.executable, "-m", "kernmlops"]


def _bpftool(kind: str) -> list[dict]:
    tool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    out = subprocess.run([tool, "-j", kind, "show"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout or "[]")


@cache
def our_program_names() -> frozenset[str]:
    """Names of every program in kernmlops' objects (libbpf keeps 15 characters)."""
    names = set()
    for path in build():
        with BpfObject(path) as obj:
            names |= {name[:15] for name in obj.programs}
    return frozenset(names)


def kernel_objects() -> dict[str, set[int]]:
    """IDs of kernmlops' programs and their links in the kernel, as bpftool lists
    them (programs of other tools running at the same time are left out)."""
    ours = our_program_names()
    progs = {p["id"] for p in _bpftool("prog") if p.get("name", "")[:15] in ours}
    links = {ln["id"] for ln in _bpftool("link") if ln.get("prog_id") in progs}
    return {"prog": progs, "link": links}


def wait_released(before: dict[str, set[int]], timeout: float = 5.0) -> dict[str, set[int]]:
    """What is still loaded that was not before (the kernel frees asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        now = kernel_objects()
        extra = {k: now[k] - before[k] for k in now}
        if not any(extra.values()) or time.monotonic() > deadline:
            return extra
        time.sleep(0.1)


def run_collect(
    out: Path, *args: str, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], Collection | None]:
    """Run `kernmlops collect -o OUT ARGS`; return the process and its collection."""
    proc = subprocess.run(
        [*KERNMLOPS, "collect", "--no-progress", "-o", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, only_collection(out)


def only_collection(out: Path) -> Collection | None:
    found = sorted((out / "curated").glob("benchmark=*/collection_id=*"))
    assert len(found) <= 1, found
    return read_collection(found[0]) if found else None


@pytest.fixture
def forkburn() -> list[str]:
    return [sys.executable, str(WORKLOADS / "forkburn.py")]
