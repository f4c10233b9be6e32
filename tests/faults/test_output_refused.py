"""The output folder refused before anything starts (read-only, a file, a pseudo
filesystem, no permission): no BPF is loaded, so these run beside the main lane
(tests/lanes.py); the collections that do load it are test_output.py's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.faults.conftest import start_collect
from tests.faults.test_output import assert_refused, tmpfs


def test_read_only_output(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with tmpfs(tmp_path / "ro", "1m", "ro") as ro:
        run = start_collect(ro / "out", "--", "touch", str(marker))
        assert_refused(run, marker, "read-only")


def test_output_is_a_file(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "afile").write_text("not a folder")
    run = start_collect(tmp_path / "afile" / "out", "--", "touch", str(marker))
    assert_refused(run, marker, "is a file, not a folder")


@pytest.mark.parametrize("out", ["/proc/kmo-test", "/sys/kmo-test", "/sys/kernel/kmo-test/a"])
def test_a_pseudo_filesystem_is_refused_for_what_it_is(tmp_path: Path, out: str) -> None:
    """/proc and /sys hold the kernel's files, not ours: said so, not "only 0 B free"."""
    marker = tmp_path / "ran"
    run = start_collect(Path(out), "--", "touch", str(marker))
    kind = "proc" if out.startswith("/proc") else "sysfs"
    code, err = run.finish()
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: cannot create the output folder {out}: "), err
    assert f"({kind}) is a pseudo filesystem" in lines[0] and "free" not in lines[0], err
    assert not marker.exists() and not Path(out).exists()


def test_no_permission(tmp_path: Path) -> None:
    """A user who may not write the folder gets the reason in one line."""
    import os
    import sys

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)  # root's; others may not write
    os.chmod(tmp_path, 0o755)
    code = (
        "from pathlib import Path\n"
        "from kernmlops.collect.output import prepare_output\n"
        "from kernmlops.errors import OutputError\n"
        "try:\n"
        f"    prepare_output(Path({str(locked / 'c')!r}), min_free_mb=0, warn_free_mb=0)\n"
        "except OutputError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert "permission denied" in out.stdout, out
    assert not (locked / "c").exists()
