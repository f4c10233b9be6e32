"""A FIFO where lb reads a file (a model, an MLLB dump: a name someone else may put
it at): one line naming it, not a process that waits for a writer for ever."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "args",
    [
        ["lb", "export", "{fifo}", "-o", "{out}"],
        ["lb", "import-mllb", "{fifo}", "-o", "{out}"],
        ["lb", "report", "{data}", "--model", "{fifo}"],
    ],
    ids=["export", "import-mllb", "report"],
)
def test_a_fifo_is_one_line_not_a_hang(tmp_path: Path, args: list[str]) -> None:
    fifo = tmp_path / "raw_model.csv"
    os.mkfifo(fifo)
    (tmp_path / "data").mkdir()
    given = [a.format(fifo=fifo, out=tmp_path / "out", data=tmp_path / "data") for a in args]
    try:
        done = subprocess.run([sys.executable, "-m", "kernmlops", *given],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(args[:2])} hung on a FIFO")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"{fifo} is not a plain file" in line, line
