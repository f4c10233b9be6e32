"""file_data: the files processes open, as KernMLOps' file_data table.

One row per open of a file that has data or that the open created: ``cpu``,
``pid``, ``tgid``, ``ts_uptime_us``, ``file_inode``, ``file_size_bytes`` (at the
open), ``file_name`` (the last path component, up to 63 bytes) and ``created``.
Opens are seen where openat / openat2 return (bpf/file_data.bpf.c explains what
that leaves out).
"""

from __future__ import annotations

from typing import ClassVar

from kernmlops.hooks.bpf import BpfHook, BpfHookOptions

TABLE = "file_data"


class FileDataHook(BpfHook[BpfHookOptions]):
    """Files opened by the traced processes, with inode, size and name."""

    name: ClassVar[str] = "file_data"
    object_name: ClassVar[str] = "file_data"
    rings: ClassVar[dict[str, str]] = {TABLE: "file_open_rb"}
    needs: ClassVar[tuple[str, ...]] = ("tracepoint", "ringbuf")
