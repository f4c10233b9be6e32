"""cpu_profile: symbolization on recorded text and on a compiled program (against
nm), and a program spinning in a known function, sampled for real: the function
tops its user stacks, and the sample count matches its CPU time (wait4)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.hooks.base import HookContext
from kernmlops.hooks.cpu_profile import (
    CpuProfileHook,
    ElfSymbols,
    KernelSymbols,
    ProcMaps,
    UserSymbols,
    folded,
)
from tests.rows import polled

SPIN_C = r"""
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

void spin_here_kmo(double seconds)
{
	double end = now() + seconds;
	while (now() < end)
		for (int i = 0; i < 100000; i++)
			sink += i;
}

int main(int argc, char **argv)
{
	spin_here_kmo(argc > 1 ? atof(argv[1]) : 1.0);
	return 0;
}
"""

KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81000100 t helper
ffffffff81000200 D some_data
ffffffff81000300 T do_work
ffffffffc0000000 t mod_fn\t[kvm]
0000000000000000 A fixed_percpu_data
"""


def _compile(tmp: Path, pie: bool) -> Path:
    cc = shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler (gcc) is needed to build the workload"
    exe = tmp / ("spin_pie" if pie else "spin_nopie")
    src = tmp / "spin.c"
    src.write_text(SPIN_C)
    flags = ["-fPIE", "-pie"] if pie else ["-fno-pie", "-no-pie"]
    subprocess.run([cc, "-O0", "-g", *flags, "-o", str(exe), str(src)], check=True)
    return exe


def _nm(exe: Path, symbol: str) -> tuple[int, int]:
    """(address, size) of a symbol, as binutils' nm reads it."""
    out = subprocess.run(["nm", "-S", str(exe)], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == symbol:
            return int(parts[0], 16), int(parts[1], 16)
    raise AssertionError(f"nm does not list {symbol} in {exe}")


# --- pure ----------------------------------------------------------------------------
def test_kernel_symbols_from_kallsyms_text() -> None:
    ks = KernelSymbols(KALLSYMS)
    ips = np.array([0xFFFFFFFF81000105, 0xFFFFFFFF81000301, 0xFFFFFFFFC0000010, 0x1000], np.uint64)
    # frames after the first are return addresses: looked up one byte earlier
    assert ks.frames(ips) == ["helper+0x5", "do_work+0x1", "mod_fn+0x10 [kvm]", "0x1000"]
    # data symbols are not functions: an address past some_data is still helper's
    assert ks.frames(np.array([0xFFFFFFFF81000250], np.uint64)) == ["helper+0x150"]
    # a return address just past a function's end belongs to the caller
    assert ks.frames(np.array([0, 0xFFFFFFFF81000300], np.uint64))[1] == "helper+0x200"


def test_proc_maps_parse_and_locate() -> None:
    maps = ProcMaps.parse(
        "7f0000001000-7f0000003000 r-xp 00001000 08:01 42 /usr/lib/libx.so\n"
        "55550000-55551000 r-xp 00000000 08:01 7 /opt/app\n"
        "7ffd0000-7ffd2000 r-xp 00000000 00:00 0 [vdso]\n"
    )
    assert maps.paths == ["/opt/app", "[vdso]", "/usr/lib/libx.so"]
    idx, off = maps.locate(np.array([0x55550010, 0x7F0000002000, 0x9, 0x7F0000003000], np.uint64))
    assert idx.tolist() == [0, 2, -1, -1]
    assert off[:2].tolist() == [0x10, 0x2000]


def test_elf_symbols_agree_with_nm(tmp_path: Path) -> None:
    for pie in (True, False):
        exe = _compile(tmp_path, pie)
        addr, size = _nm(exe, "spin_here_kmo")
        elf = ElfSymbols(exe)
        # file offset of the function's 5th byte, through the PT_LOAD that maps it
        p_offset, p_vaddr, _ = next(s for s in elf.segments if s[1] <= addr < s[1] + s[2])
        names, offs = elf.lookup(np.array([addr - p_vaddr + p_offset + 4], np.uint64))
        assert (names[0], int(offs[0])) == ("spin_here_kmo", 4)
        after = elf.lookup(np.array([addr - p_vaddr + p_offset + size], np.uint64))[0][0]
        assert after != "spin_here_kmo"


def test_folded_stacks() -> None:
    frame = pl.DataFrame(
        {
            "comm": ["app", "app", "app"],
            "user_stack": [
                ["leaf+0x3 (/opt/app)", "main+0x40 (/opt/app)"],
                ["leaf+0x9 (/opt/app)", "main+0x40 (/opt/app)"],
                ["/usr/lib/libc.so.6+0x29d90", "0x7ffc0000"],
            ],
            "kernel_stack": [[], [], ["do_sys+0x5 [kvm]", "entry_SYSCALL_64+0x1f"]],
        }
    )
    assert folded(frame) == (
        "app;main;leaf 2\napp;[unknown];[libc.so.6];entry_SYSCALL_64;do_sys 1\n"
    )
    assert folded(frame, kernel=False, user=True).splitlines()[1] == "app;[unknown];[libc.so.6] 1"
    assert "entry_SYSCALL_64_[k];do_sys_[k] 1" in folded(frame, annotate_kernel=True)


def test_user_symbols_of_this_process() -> None:
    """A libc function's address in this process symbolizes to its name (ctypes
    gives the address; libc exports it, so .dynsym has it)."""
    import ctypes

    libc = ctypes.CDLL(None)
    addr = ctypes.cast(libc.getpid, ctypes.c_void_p).value
    assert addr
    us = UserSymbols()
    us.refresh([os.getpid()])
    frame = us.frames(os.getpid(), np.array([addr + 1], np.uint64))[0]
    assert frame.startswith("getpid+0x1 (") or frame.startswith("__getpid+0x1 ("), frame
    assert "libc" in frame


# --- against the kernel -----------------------------------------------------------------
@pytest.mark.bpf
@pytest.mark.parametrize("pie", [True, False], ids=["pie", "no-pie"])
def test_spinning_function_tops_its_user_stacks(tmp_path: Path, pie: bool) -> None:
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf.build import build

    build()
    exe = _compile(tmp_path, pie)
    hz = 199
    flt = ProcessFilter(follow_children=True)
    ctx = HookContext(collection_id="t", process_filter=flt, self_tgid=os.getpid(), bpf_dir=None)
    hook = CpuProfileHook(CpuProfileHook.Options(frequency_hz=hz))
    frames: list[pl.DataFrame] = []
    try:
        hook.start(ctx)
        # A shell that stops itself, is added to the filter, then execs the
        # program when continued: the program is tracked from its first instruction.
        proc = subprocess.Popen(["sh", "-c", f'kill -STOP $$; exec "{exe}" 1.0'])
        os.waitid(os.P_PID, proc.pid, os.WSTOPPED)
        flt.add(proc.pid)
        os.kill(proc.pid, signal.SIGCONT)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            frames += [f for _, f in polled(hook.poll())]  # maps read while it lives
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        frames += [f for _, f in polled(hook.stop())]
    finally:
        hook.close()
        flt.close()
    assert proc.returncode == 0
    df = pl.concat(frames).filter(pl.col("tgid") == proc.pid)
    cpu_s = usage.ru_utime + usage.ru_stime
    top = df["user_stack"].list.first().str.extract(r"^([^+]+)\+")
    share = (top == "spin_here_kmo").mean()
    print(
        f"\n{exe.name}: {df.height} samples at {hz} Hz for {cpu_s:.3f} s CPU "
        f"(wait4), spin_here_kmo on top of {share:.1%}; drops={hook.status.drops}"
    )
    print(folded(df).splitlines()[:3])
    # The sample count follows the CPU time the kernel accounted (wait4).
    assert abs(df.height - hz * cpu_s) <= 0.2 * hz * cpu_s + 3
    assert share >= 0.9
    assert (df["comm"] == exe.name).mean() >= 0.9
    spin = df.filter(top == "spin_here_kmo")
    assert spin["user_stack"].list.get(0).str.ends_with(f"({exe})").all()
    assert spin["user_stack"].list.get(1, null_on_oob=True).str.starts_with("main+").all()
    # The offset in the function is within it (nm's size, an independent reader).
    _, size = _nm(exe, "spin_here_kmo")
    offs = spin["user_stack"].list.first().str.extract(r"\+0x([0-9a-f]+) ").str.to_integer(base=16)
    assert (offs < size).all()
    assert f"{exe.name};__libc_start_call_main;main;spin_here_kmo " in folded(df)
    assert hook.status.drops == 0
