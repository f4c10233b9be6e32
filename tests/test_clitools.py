"""The one way every command fails, and the one BPF privilege check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kernmlops.clitools import require_bpf_privileges
from kernmlops.errors import ConfigError, KernmlopsError


def test_fail_prints_one_literal_line_on_stderr_and_exits_with_the_code() -> None:
    long = "x" * 150  # longer than a terminal line: must not wrap
    code = (
        "from kernmlops.clitools import fail\n"
        "from kernmlops.errors import ConfigError\n"
        f"fail(ConfigError('bad [bold]key[/] in [hooks.perf] {long}'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == ConfigError("x").exit_code != 0
    assert out.stdout == ""
    assert out.stderr == f"error: bad [bold]key[/] in [hooks.perf] {long}\n"


def test_require_bpf_privileges(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernmlops.ebpf import probe

    monkeypatch.setattr("os.geteuid", lambda: 0)
    require_bpf_privileges("collect")  # root: fine
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr(probe, "has_bpf_capabilities", lambda: True)
    require_bpf_privileges("collect")  # CAP_BPF + CAP_PERFMON: fine
    monkeypatch.setattr(probe, "has_bpf_capabilities", lambda: False)
    with pytest.raises(KernmlopsError, match=r"^export needs root \(or CAP_BPF \+ CAP_PERFMON\)"):
        require_bpf_privileges("export")
