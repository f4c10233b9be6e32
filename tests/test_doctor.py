"""`kernmlops doctor` for a user who is not root: what can be seen without
privileges, then one line that says what the user lacks; no traceback."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from kernmlops.doctor import privilege_notes
from kernmlops.ebpf.probe import TRACEFS, Feature

NOBODY = 65534


def _features(**ok: bool | str) -> dict[str, Feature]:
    """Features as probe_all names them; a str value is a failed feature's detail."""
    base: dict[str, bool | str] = {
        "root": "uid 1000",
        "bpf_capabilities": "missing",
        "tracefs": f"{TRACEFS} not readable (root only)",
        "sw_cpu_clock": "Permission denied",
    }
    base.update(ok)
    return {name: Feature(name, v is True, "" if v is True else str(v)) for name, v in base.items()}


def test_privilege_notes_name_what_is_missing() -> None:
    notes = privilege_notes(_features())
    assert notes[0] == (
        "not root (uid 1000): BPF needs root or CAP_BPF+CAP_PERFMON, so no program type was probed"
    )
    assert notes[1] == f"tracefs {TRACEFS} not readable (root only)"
    assert notes[2].startswith("perf events refused")
    assert len(notes) == 3
    capable = privilege_notes(_features(bpf_capabilities=True, tracefs=True, sw_cpu_clock=True))
    assert capable == ["not root (uid 1000), but has the BPF capabilities"]
    assert privilege_notes(_features(root=True, bpf_capabilities=True, tracefs=True,
                                     sw_cpu_clock=True)) == []  # fmt: skip


def _as_unprivileged(argv: list[str]) -> tuple[list[str], int]:
    """``argv`` run as nobody when we are root (setpriv drops every capability)."""
    if os.geteuid() != 0:
        return argv, os.geteuid()
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run doctor as nobody"
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv], NOBODY


def test_doctor_as_a_user_who_is_not_root_explains_and_prints_what_it_can() -> None:
    argv, uid = _as_unprivileged([sys.executable, "-m", "kernmlops", "doctor"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
    err = proc.stderr
    assert "Traceback" not in err and "Error:" not in err, err[-3000:]
    assert proc.returncode == 1, err[-3000:]  # no BPF hook can run
    # what it can see: the machine, the hooks (system_info needs nothing), the variants
    assert "this machine" in err and "hooks" in err and "program variants" in err
    assert f"uid {uid}" in err
    assert any(line.startswith("│ system_info") and " yes " in line for line in err.splitlines())
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(
        f"not root (uid {uid}): BPF needs root or CAP_BPF+CAP_PERFMON, so no program type "
        "was probed; "
    )
    assert last.endswith("; run `sudo kernmlops doctor` for the full matrix")
    if not os.stat(TRACEFS).st_mode & stat.S_IXOTH:
        assert f"; tracefs {TRACEFS} not readable (root only);" in last
    if int(Path("/proc/sys/kernel/perf_event_paranoid").read_text()) >= 2:
        assert "; perf events refused (kernel.perf_event_paranoid=" in last
