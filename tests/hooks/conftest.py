"""Helpers for the hook tests."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from kernmlops.collect.filter import ProcessFilter
from tests.rows import polled
from tests.switches import NAPS


def build_c(tmp_path_factory: pytest.TempPathFactory, name: str, source: str) -> Path:
    """Compile a C workload (gcc -O1) into a fresh folder; the binary is called
    ``name`` (its comm in the kernel's rows)."""
    folder = tmp_path_factory.mktemp(name)
    (folder / f"{name}.c").write_text(source)
    subprocess.run(["gcc", "-O1", "-o", str(folder / name), str(folder / f"{name}.c")], check=True)
    return folder / name


def run_gated(
    hook: Any, flt: ProcessFilter, argv: Sequence[str]
) -> tuple[list[pl.DataFrame], str, int]:
    """Run a workload that waits for a line on stdin: its pid joins ``flt`` first, so
    the started ``hook`` sees all it does; polled until it exits (status 0). The frames
    polled, what it printed and its pid; the caller stops the hook."""
    frames: list[pl.DataFrame] = []
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    flt.add(proc.pid)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    while proc.poll() is None:
        frames += [f for _, f in polled(hook.poll())]
        time.sleep(0.01)
    assert proc.wait() == 0
    return frames, proc.stdout.read(), proc.pid


@pytest.fixture(scope="module")
def naps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The naps workload (:data:`tests.switches.NAPS`), built."""
    return build_c(tmp_path_factory, "naps", NAPS)
