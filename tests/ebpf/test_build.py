"""build(): a build folder that cannot be created is a clear BuildError, not an
OSError traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernmlops.ebpf.build import BuildError, build


def test_a_build_folder_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    folder = blocker / "bpf"
    with pytest.raises(BuildError) as info:
        build(folder)
    assert str(info.value) == (
        f"cannot create the BPF build folder {folder}: Not a directory "
        "(set KERNMLOPS_BPF_DIR, or run `kernmlops build-bpf` as its owner)"
    )
