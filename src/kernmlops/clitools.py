"""What every command does the same way: fail with one clear line, and check
for the privileges that loading BPF programs needs."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from kernmlops.errors import KernmlopsError

#: every command's help: -h as well as --help, lines up to 100 columns (the option
#: help texts are written for that width)
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def fail(err: KernmlopsError) -> NoReturn:
    """Print ``error: <message>`` on stderr, one line, and exit with the error's code."""
    from rich.console import Console  # rich only when there is something to print
    from rich.markup import escape

    # escape: a message may hold [brackets]; soft_wrap: it stays one line (no wrap at 80)
    console = Console(stderr=True, highlight=False)
    console.print(f"[bold red]error:[/] {escape(str(err))}", markup=True, soft_wrap=True)
    sys.exit(err.exit_code)


def require_bpf_privileges(command: str, error: type[KernmlopsError] = KernmlopsError) -> None:
    """Raise ``error`` unless this process may load BPF programs (root, or CAP_BPF +
    CAP_PERFMON); ``command`` names what the user ran, for the message."""
    # imported here, not at the top: importing kernmlops.cli stays light
    from kernmlops.ebpf.probe import has_bpf_capabilities

    if os.geteuid() != 0 and not has_bpf_capabilities():
        raise error(
            f"{command} needs root (or CAP_BPF + CAP_PERFMON) to load BPF programs: "
            "run it with sudo"
        )
