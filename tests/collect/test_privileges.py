"""What a collection needs beyond CAP_BPF and CAP_PERFMON, decided from the effective
capability set (uid 0 alone says nothing), without root."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest

from kernmlops.collect.privileges import lesser_ways, privileges_record, refuse_what_cannot_work
from kernmlops.errors import CollectionError
from kernmlops.host.capabilities import (
    CAP_BPF,
    CAP_CHOWN,
    CAP_PERFMON,
    CAP_SETGID,
    CAP_SETUID,
    effective,
    held,
    holds,
)
from kernmlops.host.invoker import Invoker
from tests.conftest import skip_here

USER = Invoker(1000, 1000, "ann", "/home/ann", (1000,))
BPF_ONLY = 1 << CAP_BPF | 1 << CAP_PERFMON


def test_the_effective_set_is_read_as_the_kernel_writes_it() -> None:
    # the form of /proc/<pid>/status: root without CAP_SYS_RESOURCE (bit 24), as in
    # some VMs and containers
    status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\n"
    mask = effective(status)
    assert mask == 0x1FFFEFFFFFF
    assert not holds(24, mask) and holds(CAP_CHOWN, mask) and holds(CAP_BPF, mask)
    assert held(BPF_ONLY) == ["CAP_PERFMON", "CAP_BPF"]
    assert effective("Name:\tx\n") == 0


def test_the_names_are_libcaps() -> None:
    # capsh (libcap) names the bits of a set: every name held() gives is one of them
    mask = 0x1FFFEFFFFFF
    try:
        out = subprocess.run(["capsh", f"--decode={mask:x}"], capture_output=True,
                             text=True, check=True)  # fmt: skip
    except FileNotFoundError:
        skip_here("capsh (libcap2-bin) is not installed (make test installs it)")
    names = {n.upper() for n in out.stdout.strip().split("=", 1)[1].split(",") if n}
    assert set(held(mask)) == names & set(held(-1 & (1 << 64) - 1))
    assert "CAP_SYS_RESOURCE" not in held(mask)


def test_sudo_hand_over_needs_cap_chown() -> None:
    with pytest.raises(CollectionError) as err:
        refuse_what_cannot_work(USER, None, BPF_ONLY)
    assert str(err.value) == (
        "under sudo the collection is given to ann (SUDO_UID 1000), which needs CAP_CHOWN "
        "and this process lacks it: add CAP_CHOWN, or unset SUDO_UID to keep the "
        "collection root's"
    )
    refuse_what_cannot_work(USER, None, BPF_ONLY | 1 << CAP_CHOWN)
    refuse_what_cannot_work(None, None, BPF_ONLY)  # not under sudo: nothing to give


def test_as_user_needs_setuid_and_setgid() -> None:
    mask = BPF_ONLY | 1 << CAP_CHOWN
    for lacking in (mask, mask | 1 << CAP_SETUID, mask | 1 << CAP_SETGID):
        with pytest.raises(CollectionError, match="needs CAP_SETUID and CAP_SETGID"):
            refuse_what_cannot_work(USER, USER, lacking)
    refuse_what_cannot_work(USER, USER, mask | 1 << CAP_SETUID | 1 << CAP_SETGID)


def test_each_lesser_way_is_one_line() -> None:
    none = SimpleNamespace(cgroup=None, why_not="cannot create a cgroup in /x: Permission denied")
    lines = lesser_ways(none, "lowering it needs CAP_SYS_RESOURCE")  # type: ignore[arg-type]
    assert lines == [
        "the benchmark runs in a process group, not a cgroup of its own (cannot create a "
        "cgroup in /x: Permission denied): a process it starts in a new session may outlive "
        "the collection",
        "note: the collector's OOM score is not lowered (lowering it needs CAP_SYS_RESOURCE): the "
        "OOM killer may take the collector before the benchmark (`kernmlops recover` then)",
    ]
    made = SimpleNamespace(cgroup="/kernmlops-1-bench-0", why_not=None)
    assert lesser_ways(made, None) == []  # type: ignore[arg-type]
    assert lesser_ways(None, None) == []  # no benchmark process (faux)
    record = privileges_record(lines, BPF_ONLY)
    assert record == {"euid": os.geteuid(), "capabilities": ["CAP_PERFMON", "CAP_BPF"],
                      "lesser": [lines[0], lines[1].removeprefix("note: ")]}  # fmt: skip
