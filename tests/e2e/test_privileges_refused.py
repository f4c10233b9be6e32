"""The tests of test_privileges.py refused before any folder is made (no CAP_CHOWN
under sudo, a nice it may not take, no CAP_DAC_OVERRIDE, neither capability): no BPF
is loaded, so these run beside the main lane (tests/lanes.py); the collections with
the two capabilities alone are that module's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.test_privileges import _path_env, collect
from tests.e2e.test_privileges import _setpriv as _setpriv  # autouse: root and setpriv
from tests.nobody import NOBODY, reachable_folder


def test_under_sudo_without_cap_chown_is_refused_before_any_folder(tmp_path: Path) -> None:
    # Issue: the collection ran, then handing it to the sudo user raised
    # PermissionError (a traceback) and left it root's.
    out = tmp_path / "out"
    sudo = {"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY), "SUDO_USER": "nobody"}
    proc = collect("uid0", out, ["-b", "faux", "-d", "1"], env=sudo)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: under sudo the collection is given to nobody (SUDO_UID 65534), which needs "
        "CAP_CHOWN and this process lacks it: add CAP_CHOWN, or unset SUDO_UID to keep the "
        "collection root's"
    ]
    assert not out.exists()


def test_a_collector_nice_it_may_not_take_is_refused_before_any_folder(tmp_path: Path) -> None:
    # Issue: the folder and a manifest saying "running" were made first, and stayed.
    config = tmp_path / "nice.yaml"
    config.write_text("collector:\n  nice: -10\n")
    out = tmp_path / "out"
    proc = collect("uid0", out, ["-c", str(config), "-b", "faux", "-d", "1"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: collector.nice -10 needs root or CAP_SYS_NICE"
    ]
    assert not out.exists()


def test_uid0_without_dac_override_is_told_why_a_folder_is_refused() -> None:
    # uid 0 under the two capabilities alone writes by the mode bits, as any user:
    # a folder of another user's is refused, and the line says why root was.
    with reachable_folder("kernmlops-privileges-") as base:
        theirs = base / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, NOBODY, NOBODY)
        proc = collect("uid0", theirs / "out", ["-b", "faux", "-d", "1"])
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"error: cannot create the output folder {theirs / 'out'}/")
        assert line.endswith(": permission denied (uid 0 without CAP_DAC_OVERRIDE writes only "
                             "where the folder's mode lets root write)")  # fmt: skip
        assert list(theirs.iterdir()) == []


def test_uid0_without_the_two_capabilities_is_refused_in_one_line(tmp_path: Path) -> None:
    # Issue: uid 0 passed the check whatever its capabilities; each hook then failed
    # to load and a collection of nothing was written.
    out = tmp_path / "out"
    proc = subprocess.run(
        ["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-m", "kernmlops",
         "collect", "--no-progress", "-o", str(out), "-b", "faux", "-d", "1"],
        capture_output=True, text=True, timeout=120, cwd="/", env=_path_env(),
    )  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "error: collect needs CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN) to load BPF programs, "
        "and this uid 0 lacks them (its capability bounding set)"
    ]
    assert not out.exists()
