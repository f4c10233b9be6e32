"""Every label decoder, against sources other than the decoder itself."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import time
from pathlib import Path

import pytest

from kernmlops.exporter.config import DecoderSpec, LabelSpec
from kernmlops.exporter.decoders import (
    CgroupPaths,
    DecodeError,
    DecoderContext,
    DropLabelSet,
    Kallsyms,
    LabelDecodeError,
    build_decoder,
    cgroup2_mount,
    errno_name,
    label_decoders,
)


def decode(
    chain: list[dict], raw: bytes, ctx: DecoderContext | None = None, *, flavor: str = "kernmlops"
) -> str:
    spec = LabelSpec(name="x", size=len(raw), decoders=[DecoderSpec(**d) for d in chain])
    (label,) = label_decoders([spec], ctx or DecoderContext(), flavor=flavor)
    return label(raw)


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def test_uint_reads_little_endian_of_each_size() -> None:
    assert decode([{"name": "uint"}], b"\x2a") == "42"
    assert decode([{"name": "uint"}], struct.pack("<H", 513)) == "513"
    assert decode([{"name": "uint"}], u32(4_000_000_000)) == "4000000000"
    assert decode([{"name": "uint"}], struct.pack("<Q", 2**63 + 5)) == str(2**63 + 5)
    assert decode([{"name": "uint", "signed": True}], struct.pack("<i", -7)) == "-7"


def test_string_and_comm_stop_at_nul_and_survive_bad_utf8() -> None:
    assert decode([{"name": "string"}], b"bash\0garbage\0\0\0") == "bash"
    assert decode([{"name": "comm"}], b"kworker/0:1H\0\0\0\0") == "kworker/0:1H"
    assert decode([{"name": "string"}], b"ab\xffc\0") == "ab\ufffdc"


def test_static_map_from_raw_bytes_or_uint_text_with_default() -> None:
    table = {"name": "static_map", "static_map": {1: "write", 0: "read"}}
    assert decode([table], u32(1)) == "write"
    assert decode([{"name": "uint"}, table], u32(0)) == "read"
    assert decode([table], u32(7)) == "unknown:7"
    assert decode([{**table, "default": "other"}], u32(7)) == "other"


def test_label_offsets_follow_sizes_and_padding() -> None:
    labels = [
        LabelSpec(name="comm", size=16, decoders=[DecoderSpec(name="comm")]),
        LabelSpec(name="op", size=4, padding=4, decoders=[DecoderSpec(name="uint")]),
        LabelSpec(name="cpu", size=2, decoders=[DecoderSpec(name="uint")]),
    ]
    key = b"dd".ljust(16, b"\0") + b"\xee" * 4 + u32(9) + struct.pack("<H", 3)
    assert [d(key) for d in label_decoders(labels, DecoderContext())] == ["dd", "9", "3"]


def test_ksym_finds_the_containing_symbol(tmp_path: Path) -> None:
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text(
        "ffffffff81000000 T _stext\n"
        "ffffffff81000000 T _text\n"
        "ffffffff81001000 T do_one_thing\n"
        "ffffffff81001080 t helper\t[some_module]\n"
        "0000000000000000 A fixed_percpu_data\n"
        "ffffffff82000000 D some_data\n"
    )
    ctx = DecoderContext(kallsyms=Kallsyms(kallsyms))
    ksym = [{"name": "ksym"}]
    addr = struct.Struct("<Q").pack
    assert decode(ksym, addr(0xFFFFFFFF81001000), ctx) == "do_one_thing"
    assert decode(ksym, addr(0xFFFFFFFF8100107F), ctx) == "do_one_thing"  # an IP inside it
    assert decode(ksym, addr(0xFFFFFFFF81001080), ctx) == "helper"
    assert decode(ksym, addr(0xFFFFFFFF81000010), ctx) == "_stext"  # first name at an address
    with pytest.raises(LabelDecodeError, match="no kernel symbol"):
        decode(ksym, addr(0x1000), ctx)


def test_ksym_says_why_when_addresses_are_hidden(tmp_path: Path) -> None:
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text("0000000000000000 T _stext\n0000000000000000 T do_one_thing\n")
    with pytest.raises(DecodeError, match="kptr_restrict"):
        Kallsyms(kallsyms).name(0xFFFFFFFF81001000)


def test_ksym_of_this_kernel_if_addresses_are_visible() -> None:
    # /proc/kallsyms shows addresses to root only (kptr_restrict); the check
    # runs where they are visible.
    lines = Path("/proc/kallsyms").read_text().splitlines()
    for line in lines:
        addr, kind, name = line.split()[:3]
        if kind in "tT" and int(addr, 16) and name == "schedule":
            got = Kallsyms().name(int(addr, 16) + 1)
            assert got == "schedule"
            return
    assert all(int(line.split()[0], 16) == 0 for line in lines if line.split()[2] == "schedule")


def test_syscall_names_match_what_the_kernel_runs() -> None:
    # The decoder's number for getpid, run through libc's syscall(), is getpid.
    ctx = DecoderContext()
    by_name = {name: nr for nr, name in ctx.syscall_names.items()}
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    assert decode([{"name": "syscall"}], u32(by_name["getpid"]), ctx) == "getpid"
    assert libc.syscall(by_name["getpid"]) == os.getpid()
    assert libc.syscall(by_name["getppid"]) == os.getppid()
    assert decode([{"name": "uint"}, {"name": "syscall"}], u32(by_name["getppid"])) == "getppid"
    if platform.machine() == "x86_64":  # the x86-64 ABI's fixed numbers
        assert [ctx.syscall_names[n] for n in (0, 1, 39, 60)] == ["read", "write", "getpid", "exit"]
    assert decode([{"name": "syscall"}], u32(99999), ctx) == "unknown:99999"


def _block_device() -> tuple[str, int, int]:
    for entry in sorted(Path("/sys/dev/block").iterdir()):
        uevent = dict(
            line.split("=", 1)
            for line in (entry / "uevent").read_text().splitlines()
            if "=" in line
        )
        if "DEVNAME" in uevent:
            return uevent["DEVNAME"], int(uevent["MAJOR"]), int(uevent["MINOR"])
    raise AssertionError("this machine has no block device")


def test_majorminor_kernel_and_user_encodings() -> None:
    name, major, minor = _block_device()
    kernel_dev = u32(major << 20 | minor)
    assert decode([{"name": "majorminor"}], kernel_dev) == name
    numbers = [{"name": "majorminor", "output": "numbers"}]
    assert decode(numbers, kernel_dev) == f"{major}:{minor}"
    user = struct.pack("<Q", os.makedev(major, minor))
    assert decode([{"name": "majorminor", "encoding": "user"}], user) == name
    # the device node, where udev made one, has the same numbers
    node = Path("/dev") / name
    if node.exists():
        st = node.stat()
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor)
    assert decode([{"name": "majorminor"}], u32(4095 << 20 | 77)) == "4095:77"


def test_cgroup_ids_are_directory_inodes(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    (root / "system.slice" / "job.scope").mkdir(parents=True)
    (root / "user.slice").mkdir()
    paths = CgroupPaths(root)
    ctx = DecoderContext(cgroups=paths)
    job = (root / "system.slice" / "job.scope").stat().st_ino
    chain = [{"name": "cgroup"}]
    assert decode(chain, struct.pack("<Q", job), ctx) == "/system.slice/job.scope"
    assert decode(chain, struct.pack("<Q", root.stat().st_ino), ctx) == "/"
    # a cgroup made after the first walk is found by walking again
    (root / "user.slice" / "late").mkdir()
    late = (root / "user.slice" / "late").stat().st_ino
    assert decode([{"name": "uint"}, *chain], struct.pack("<Q", late), ctx) == "/user.slice/late"
    # an id no walk finds: a cgroup removed before any walk saw it (ebpf_exporter's label)
    assert decode(chain, struct.pack("<Q", 1234567), ctx) == "unknown_cgroup_id:1234567"
    assert paths.id_of("/system.slice/job.scope") == (job, 2)
    assert paths.id_of(root / "user.slice") == ((root / "user.slice").stat().st_ino, 1)
    with pytest.raises(DecodeError, match="not found"):
        paths.id_of("/nope")


def test_ebpf_exporter_configs_get_its_full_cgroup_paths(tmp_path: Path) -> None:
    """ebpf_exporter walks /sys/fs/cgroup and labels a cgroup with the path it
    walked: the mount point and below; ours is the path below the mount."""
    root = tmp_path / "cg"
    (root / "system.slice" / "job.scope").mkdir(parents=True)
    ctx = DecoderContext(cgroups=CgroupPaths(root))
    chain = [{"name": "cgroup"}]
    job = struct.pack("<Q", (root / "system.slice" / "job.scope").stat().st_ino)
    top = struct.pack("<Q", root.stat().st_ino)
    assert decode(chain, job, ctx, flavor="ebpf_exporter") == f"{root}/system.slice/job.scope"
    assert decode(chain, top, ctx, flavor="ebpf_exporter") == str(root)
    assert decode(chain, job, ctx) == "/system.slice/job.scope"
    assert decode(chain, top, ctx) == "/"
    # an id no walk finds is labelled the same in both
    unknown = struct.pack("<Q", 1234567)
    assert decode(chain, unknown, ctx, flavor="ebpf_exporter") == "unknown_cgroup_id:1234567"
    # a removed cgroup keeps its full path too
    (root / "system.slice" / "job.scope").rename(tmp_path / "away")
    ctx.cgroups.keys_read(time.monotonic())
    assert decode(chain, job, ctx, flavor="ebpf_exporter") == f"{root}/system.slice/job.scope"


def test_removed_cgroups_keep_their_path_or_are_unknown(tmp_path: Path) -> None:
    """Values outlive their cgroup in the maps: a removed cgroup keeps the path a
    walk saw; one no walk saw is unknown_cgroup_id:N; a walk begun before the
    ids were read is no proof that one is gone. (A cgroup is "removed" here by
    moving it out of the tree: an inode freed by rmdir could be reused by the
    next mkdir, which cgroup ids never are.)"""
    root, away = tmp_path / "cg", tmp_path / "away"
    (root / "seen").mkdir(parents=True)
    away.mkdir()
    paths = CgroupPaths(root)
    seen = (root / "seen").stat().st_ino
    assert paths.label(seen) == "/seen"
    (root / "brief").mkdir()
    brief = (root / "brief").stat().st_ino
    (root / "brief").rename(away / "brief")
    (root / "seen").rename(away / "seen")
    paths.keys_read(time.monotonic())  # a scrape reads both ids from a map
    assert paths.label(brief) == f"unknown_cgroup_id:{brief}"  # walked: not there
    assert paths.label(seen) == "/seen"  # the walk found it gone: its path is kept
    # a cgroup made after that walk, its id read after it too: walked again, found
    (root / "new").mkdir()
    paths.keys_read(time.monotonic())
    assert paths.label((root / "new").stat().st_ino) == "/new"
    # an id known gone costs no walk; a newer cgroup's does
    (root / "later").mkdir()
    paths.keys_read(time.monotonic())
    assert paths.label(brief) == f"unknown_cgroup_id:{brief}"
    assert paths.label((root / "later").stat().st_ino) == "/later"


def test_cgroup_of_this_process_on_the_real_hierarchy() -> None:
    mount = cgroup2_mount()
    assert mount is not None, "no cgroup v2 hierarchy mounted"
    own = next(
        line.split(":", 2)[2]
        for line in Path("/proc/self/cgroup").read_text().splitlines()
        if line.startswith("0::")
    )
    ino = (mount / own.lstrip("/")).stat().st_ino
    assert decode([{"name": "cgroup"}], struct.pack("<Q", ino)) == own
    # ebpf_exporter's: the directory's own path (on a hybrid layout below .../unified)
    full = decode([{"name": "cgroup"}], struct.pack("<Q", ino), flavor="ebpf_exporter")
    assert full == (str(mount / own.lstrip("/")) if own != "/" else str(mount))
    assert Path(full).stat().st_ino == ino


def test_errno_names_from_pythons_table_and_the_kernels() -> None:
    chain = [{"name": "errno"}]
    assert decode(chain, u32(errno.ENOENT)) == "ENOENT"
    assert decode([{"name": "uint", "signed": True}, *chain], struct.pack("<i", -13)) == "EACCES"
    assert decode(chain, u32(512)) == "ERESTARTSYS"
    assert errno_name(errno.EAGAIN) == "EAGAIN"
    assert errno_name(errno.EDEADLK) == "EDEADLK"
    assert errno_name(errno.EOPNOTSUPP) == "EOPNOTSUPP"
    assert os.strerror(errno.ENOENT) == "No such file or directory"  # the same errno
    with pytest.raises(LabelDecodeError, match="no errno"):
        decode(chain, u32(4000))


def test_regexp_keeps_or_drops_label_sets() -> None:
    chain = [{"name": "string"}, {"name": "regexp", "regexps": ["^python", "^dd$"]}]
    assert decode(chain, b"python3\0") == "python3"
    assert decode(chain, b"dd\0\0") == "dd"
    with pytest.raises(DropLabelSet):
        decode(chain, b"ddx\0")
    numbers = [{"name": "uint"}, {"name": "regexp", "regexps": ["^[0-3]$"]}]
    assert decode(numbers, u32(2)) == "2"
    with pytest.raises(DropLabelSet):
        decode(numbers, u32(12))


def test_errors_name_label_and_decoder() -> None:
    spec = LabelSpec(name="dev", size=4, decoders=[DecoderSpec(name="string")])
    (label,) = label_decoders([spec], DecoderContext())
    chained = build_decoder(DecoderSpec(name="syscall"), DecoderContext())
    with pytest.raises(DecodeError, match="'bash' is not a number"):
        chained("bash")
    bad = LabelSpec(
        name="nr", size=4, decoders=[DecoderSpec(name="string"), DecoderSpec(name="syscall")]
    )
    (nr,) = label_decoders([bad], DecoderContext())
    with pytest.raises(LabelDecodeError) as info:
        nr(b"bash")
    assert (info.value.label, info.value.decoder) == ("nr", "syscall")
    assert label(b"sda\0") == "sda"
