"""What a collection can do with the privileges it was given, said before it starts.

Loading the programs takes CAP_BPF and CAP_PERFMON (or root). The rest of what root
has buys a better collection, never the data itself: with less, each step either has
a lesser way, said once at start and kept in the manifest's ``privileges``, or is
refused in one line before any folder is made. The lesser ways: no cgroup of the
benchmark's own (a process group instead), the collector's OOM score left as it was,
the ring copier at normal priority (that one is said by ``priority_notes``).
"""

from __future__ import annotations

import os
from typing import Any

from kernmlops.errors import CollectionError, OutputError
from kernmlops.host.capabilities import (
    CAP_CHOWN,
    CAP_DAC_OVERRIDE,
    CAP_SETGID,
    CAP_SETUID,
    held,
    holds,
)
from kernmlops.host.cgroup import Containment
from kernmlops.host.invoker import Invoker

__all__ = [
    "lesser_ways",
    "privileges_record",
    "refuse_what_cannot_work",
    "without_dac_override",
]


def refuse_what_cannot_work(
    gives_to: Invoker | None, runs_as: Invoker | None, mask: int | None = None
) -> None:
    """Raise CollectionError (one line) where a step the collection must take lacks its
    capability (``mask``: the effective set, default this process's): under sudo,
    giving the collection to the user (``gives_to``: CAP_CHOWN), and running the
    benchmark as that user (``runs_as``: CAP_SETUID and CAP_SETGID)."""
    if gives_to is not None and not holds(CAP_CHOWN, mask):
        raise CollectionError(
            f"under sudo the collection is given to {gives_to.name} (SUDO_UID "
            f"{gives_to.uid}), which needs CAP_CHOWN and this process lacks it: add "
            "CAP_CHOWN, or unset SUDO_UID to keep the collection root's"
        )
    if runs_as is not None and not (holds(CAP_SETUID, mask) and holds(CAP_SETGID, mask)):
        raise CollectionError(
            f"--as-user (benchmark.as_user) runs the benchmark as {runs_as.name}, which "
            "needs CAP_SETUID and CAP_SETGID and this process lacks them"
        )


def lesser_ways(containment: Containment | None, oom_refused: str | None) -> list[str]:
    """One line per step that took a lesser way (``note: `` first where it is only a
    note): the benchmark (``containment``, None without one) has no cgroup of its own;
    the collector's OOM score was not lowered."""
    lines = []
    if containment is not None and containment.cgroup is None and containment.why_not:
        lines.append(
            f"the benchmark runs in a process group, not a cgroup of its own "
            f"({containment.why_not}): a process it starts in a new session may outlive "
            "the collection"
        )
    if oom_refused:
        lines.append(
            # a note, not a warning: the rows are the same (and root in some VMs and
            # containers lacks CAP_SYS_RESOURCE too)
            f"note: the collector's OOM score is not lowered ({oom_refused}): the OOM killer "
            "may take the collector before the benchmark (`kernmlops recover` then)"
        )
    return lines


def privileges_record(lesser: list[str], mask: int | None = None) -> dict[str, Any]:
    """The manifest's ``privileges``: the effective uid, the capabilities held that a
    collection's steps use, and each lesser way taken (as said at start)."""
    lines = [line.removeprefix("note: ") for line in lesser]
    return {"euid": os.geteuid(), "capabilities": held(mask), "lesser": lines}


def without_dac_override(err: OutputError, mask: int | None = None) -> OutputError:
    """``err`` (the output folder refused), saying why where uid 0 was refused for want
    of CAP_DAC_OVERRIDE: such a root writes only where a folder's mode lets uid 0."""
    if "permission denied" not in str(err) or os.geteuid() != 0 or holds(CAP_DAC_OVERRIDE, mask):
        return err
    said = OutputError(f"{err} (uid 0 without CAP_DAC_OVERRIDE writes only where the "
                       "folder's mode lets root write)")  # fmt: skip
    said.__dict__.update(err.__dict__)  # its reason (kernmlops.host.pinned)
    return said
