"""Helpers for the duet tests: a CPU-bound C loop and a config writer."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

LOOP_C = r"""
#include <stdlib.h>
/* CPU-bound: argv[1] iterations of a multiply-add the compiler cannot drop. */
int main(int argc, char **argv) {
	unsigned long n = argc > 1 ? strtoul(argv[1], 0, 10) : 1000000;
	volatile unsigned long x = 0;
	for (unsigned long i = 0; i < n; i++)
		x += i * i;
	return 0;
}
"""


@pytest.fixture(scope="session")
def loop_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A compiled CPU-bound loop: ``loop N`` does N multiply-adds."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler (cc, gcc or clang) is needed to build the test workload"
    folder = tmp_path_factory.mktemp("loop")
    (folder / "loop.c").write_text(LOOP_C)
    subprocess.run([cc, "-O2", "-o", str(folder / "loop"), str(folder / "loop.c")], check=True)
    return folder / "loop"


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
