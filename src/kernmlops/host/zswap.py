"""zswap, the compressed swap cache: is it in the kernel, is it on, its counters."""

from __future__ import annotations

from pathlib import Path

ZSWAP_MODULE = Path("/sys/module/zswap")
ZSWAP_DEBUGFS = Path("/sys/kernel/debug/zswap")
#: /proc/vmstat counters of zswap (pages): swapped in from / out to zswap,
#: written back from zswap to the swap device
VMSTAT_KEYS = ("zswpin", "zswpout", "zswpwb")


def zswap_state(module: Path = ZSWAP_MODULE) -> tuple[bool, str]:
    """(present, a line saying so): whether this kernel has zswap, and whether it is on."""
    if not module.is_dir():
        return False, f"this kernel has no zswap (no {module}: CONFIG_ZSWAP is off)"
    try:
        enabled = (module / "parameters" / "enabled").read_text().strip()
        compressor = (module / "parameters" / "compressor").read_text().strip()
    except OSError as err:
        return True, f"zswap present, state unreadable ({err.strerror})"
    if enabled in ("Y", "1"):
        return True, f"zswap enabled ({compressor})"
    return True, f"zswap present but disabled ({module}/parameters/enabled = {enabled})"


def zswap_enabled(module: Path = ZSWAP_MODULE) -> int:
    """1 if zswap is on now, 0 if off or absent."""
    try:
        return int((module / "parameters" / "enabled").read_text().strip() in ("Y", "1"))
    except OSError:
        return 0


def read_vmstat(text: str, keys: tuple[str, ...] = VMSTAT_KEYS) -> dict[str, int]:
    """The wanted counters of /proc/vmstat text (absent ones are left out)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in keys:
            out[name] = int(value)
    return out
