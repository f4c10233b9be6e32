"""`kernmlops vm`: a command inside another kernel."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kernmlops.clitools import reachable_path
from kernmlops.errors import KernmlopsError


@click.command(
    "vm", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.option(
    "--kernel",
    type=reachable_path(dir_okay=False, path_type=Path),
    help="kernel image (default: the newest non-running /boot/vmlinuz-*)",
)
@click.option("--cpus", default=4, show_default=True, help="virtual CPUs")
@click.option("--numa", default=2, show_default=True, help="NUMA nodes (CPUs, memory split evenly)")
@click.option("--memory", default="4G", show_default=True, help="guest memory")
@click.option(
    "-o",
    "--out",
    "outdir",
    default="vm-out",
    show_default=True,
    type=reachable_path(file_okay=False, path_type=Path),
    help="folder the guest can write (same path inside); comes back with the results",
)
@click.option("--timeout", "timeout_s", type=float, help="give up after this many seconds")
@click.option(
    "--idle",
    is_flag=True,
    help="run QEMU only on CPU time nothing else wants (SCHED_IDLE, its session at nice 19): "
    "beside benchmarks the VM must not disturb",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def vm_command(
    kernel: Path | None,
    cpus: int,
    numa: int,
    memory: str,
    outdir: Path,
    timeout_s: float | None,
    idle: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND inside another kernel under QEMU (virtme-ng, no KVM).

    \b
    The guest sees the host's files read-only, so the same kernmlops runs
    there; write results under --out. The exit code is COMMAND's.
    Examples:
      kernmlops vm -- uname -r
      kernmlops vm --cpus 4 --numa 2 -- kernmlops doctor
      kernmlops vm -o lab -- kernmlops collect -o lab -b stress-ng
      kernmlops vm --idle -- make check      beside a benchmark, on idle CPU only
    Booting takes about 20-40 s; the guest CPU is 20-28x slower than the host.
    """
    from kernmlops.vm.qemu import run_in_vm

    try:
        result = run_in_vm(
            list(command), kernel=kernel, cpus=cpus, numa=numa, memory=memory,
            outdir=outdir, timeout_s=timeout_s, idle=idle,
        )  # fmt: skip
    except KernmlopsError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    click.echo(f"vm: exit {result.exit_code} after {result.seconds:.0f} s", err=True)
    sys.exit(result.exit_code)
