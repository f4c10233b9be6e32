"""The tests of test_yamlfile.py that time a refusal or a read (``quiet``: the main
lane, tests/lanes.py), apart from the others so that those run beside it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kernmlops.errors import ConfigError
from kernmlops.yamlfile import MAX_NODES, safe_yaml
from tests.test_yamlfile import _refused, _write, bomb

#: a refusal within 0.5 s, a read within 5 s
pytestmark = pytest.mark.quiet


def test_an_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    path = _write(tmp_path, bomb(9))  # 9**9 = 387 million values once expanded
    started = time.perf_counter()
    msg = _refused(path)
    assert time.perf_counter() - started < 0.5
    assert msg == (
        f"{path}: refused: line 5: more than {MAX_NODES:,} values once its aliases are "
        "expanded (an alias bomb?)"
    )


def test_a_fifo_without_a_writer_is_read_as_empty_not_waited_on(tmp_path: Path) -> None:
    # open() of a FIFO blocks until a writer comes; `-c <(...)` has one, a stray FIFO none
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    began = time.monotonic()
    assert safe_yaml(fifo) is None
    assert time.monotonic() - began < 5
    r, w = os.pipe()
    os.write(w, b"collector: {hooks: [system_info]}\n")
    os.close(w)
    try:
        assert safe_yaml(f"/proc/self/fd/{r}") == {"collector": {"hooks": ["system_info"]}}
    finally:
        os.close(r)


def test_a_fifo_whose_writer_sends_nothing_is_refused_in_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO planted at a config's name, whose writer stays and never writes: the
    reader waited for ever; now for PIPE_WAIT_S, then one line. A pipe that does send
    its end (`-c <(...)`) is still read."""
    import kernmlops.yamlfile as yamlfile
    from tests.swap import within

    monkeypatch.setattr(yamlfile, "PIPE_WAIT_S", 1.0, raising=False)
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # a writer that stays and sends nothing
    try:
        os.write(writer, b"collector:\n")  # a start, and never the end
        began = time.monotonic()
        with pytest.raises(ConfigError) as info:
            within(lambda: safe_yaml(fifo), fifo)
        assert 1.0 <= time.monotonic() - began < 5
    finally:
        os.close(writer)
    assert str(info.value) == f"cannot read config {fifo}: a FIFO that sent no end in 1 s"
    r, w = os.pipe()
    os.write(w, b"collector: {hooks: [system_info]}\n")
    os.close(w)
    try:
        assert safe_yaml(f"/proc/self/fd/{r}") == {"collector": {"hooks": ["system_info"]}}
    finally:
        os.close(r)
