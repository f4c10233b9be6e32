"""Helpers for the hook tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.switches import NAPS


def build_c(tmp_path_factory: pytest.TempPathFactory, name: str, source: str) -> Path:
    """Compile a C workload (gcc -O1) into a fresh folder; the binary is called
    ``name`` (its comm in the kernel's rows)."""
    folder = tmp_path_factory.mktemp(name)
    (folder / f"{name}.c").write_text(source)
    subprocess.run(["gcc", "-O1", "-o", str(folder / name), str(folder / f"{name}.c")], check=True)
    return folder / name


@pytest.fixture(scope="module")
def naps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The naps workload (:data:`tests.switches.NAPS`), built."""
    return build_c(tmp_path_factory, "naps", NAPS)
