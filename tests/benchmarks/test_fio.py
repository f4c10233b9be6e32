"""FioBenchmark: options, argv, target checks (tmpfs, devices), parsing of
fio's real JSON and a real run (through the CLI and Ctrl+C: test_fio_bpf.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from kernmlops.benchmarks import _tools, fio
from kernmlops.benchmarks.base import BenchmarkRun
from kernmlops.benchmarks.fio import FioBenchmark, fio_rows, load_fio_json
from kernmlops.errors import BenchmarkError
from tests.conftest import needs_tools

MiB = 1 << 20
needs_fio = needs_tools("fio")


def _bench(**options: object) -> FioBenchmark:
    return FioBenchmark(FioBenchmark.Options(**options))


def _argv(**options: object) -> list[str]:
    launch = _bench(**options).launch()
    assert launch is not None
    return launch.argv


def _value(argv: list[str], option: str) -> str:
    found = [a.split("=", 1)[1] for a in argv if a.startswith(f"{option}=")]
    assert len(found) == 1, (option, argv)
    return found[0]


def test_class_facts() -> None:
    assert FioBenchmark.name == "fio"
    assert FioBenchmark.default_filter == "tree"
    o = FioBenchmark.Options()
    assert (o.profiles, o.target, o.allow_write_device, o.size, o.bs) == (
        ["randread"], None, False, "64M", "4k",
    )  # fmt: skip
    assert (o.iodepth, o.ioengine, o.direct, o.runtime_s, o.time_based) == (
        16, "libaio", True, None, False,
    )  # fmt: skip
    for name, field in FioBenchmark.Options.model_fields.items():
        assert field.description, name


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"profiles": ["seqread", "bogus"]}, "seqread"),
        ({"profiles": []}, "at least 1"),
        ({"profiles": ["seqread", "seqread"]}, "named twice"),
        ({"size": "1k", "bs": "4k"}, "smaller than bs"),
        ({"bs": "1000"}, "multiple of 512"),
        ({"size": "lots"}, "expected a size"),
        ({"size": 0}, "more than 0"),
        ({"iodepth": 0}, "greater than or equal to 1"),
        ({"time_based": True}, "time_based needs runtime_s"),
        ({"rwmixread": 101}, "less than or equal to 100"),
        ({"filename": "/x"}, "Extra inputs"),
    ],
)
def test_bad_options(bad: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        FioBenchmark.Options(**bad)


def test_buffered_io_allows_any_block_size() -> None:
    FioBenchmark.Options(bs="1000", direct=False)


def test_argv_globals_then_profiles(tmp_path: Path) -> None:
    argv = _argv(
        profiles=["seqwrite", "randrw", "randread"],
        target=str(tmp_path / "f.dat"),
        size="8M",
        bs="16k",
        iodepth=4,
        numjobs=2,
        rwmixread=70,
        runtime_s=2.5,
        time_based=True,
        extra_args=["--fsync=1"],
    )
    assert argv[0] == "fio"
    assert "--output-format=json" in argv and "--eta=never" in argv
    assert _value(argv, "--filename") == str(tmp_path / "f.dat")
    assert _value(argv, "--size") == str(8 * MiB)
    assert _value(argv, "--bs") == "16384"
    assert _value(argv, "--iodepth") == "4"
    assert _value(argv, "--numjobs") == "2"
    assert _value(argv, "--ioengine") == "libaio"
    assert _value(argv, "--direct") == "1"
    assert _value(argv, "--runtime") == "2.5s"
    assert "--time_based" in argv and "--lat_percentiles=1" in argv
    first = argv.index("--name=seqwrite")
    assert argv.index("--fsync=1") < first  # extra options are global
    assert argv[first:] == [
        "--name=seqwrite", "--rw=write",
        "--name=randrw", "--rw=randrw", "--rwmixread=70", "--stonewall",
        "--name=randread", "--rw=randread", "--stonewall",
    ]  # fmt: skip
    launch = _bench().launch()
    assert launch is not None and launch.capture_output


def test_colon_in_filename_is_escaped(tmp_path: Path) -> None:
    argv = _argv(target=str(tmp_path / "a:b"))
    assert _value(argv, "--filename") == str(tmp_path / "a\\:b")


def test_default_target_is_a_private_file_on_disk() -> None:
    a, b = _bench(), _bench()
    path = a.target_path()
    assert path.name.startswith("kernmlops-fio-") and path.suffix == ".dat"
    assert path != b.target_path()
    assert path == a.target_path()  # stable across launch() and describe()
    assert _tools.filesystem_type(path.parent) not in _tools.MEMORY_FILESYSTEMS
    assert a.owns_target()


def test_folder_target_gets_a_file_inside(tmp_path: Path) -> None:
    bench = _bench(target=str(tmp_path))
    assert bench.target_path().parent == tmp_path
    assert bench.owns_target()
    named = _bench(target=str(tmp_path / "mine.dat"))
    assert named.target_path() == tmp_path / "mine.dat"
    assert not named.owns_target()


def test_check_missing_fio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tools.shutil, "which", lambda name: None)
    with pytest.raises(BenchmarkError, match="apt-get install fio"):
        _bench().check()


@needs_fio
def test_check_refuses_tmpfs_for_direct_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(f"30 27 0:26 / {tmp_path} rw - tmpfs tmpfs rw\n")
    monkeypatch.setattr(_tools, "MOUNTINFO", info)
    with pytest.raises(BenchmarkError, match=r"is on tmpfs, which lives in memory.*target"):
        _bench(target=str(tmp_path / "f.dat")).check()
    _bench(target=str(tmp_path / "f.dat"), direct=False).check()  # buffered I/O: allowed


@needs_fio
def test_check_refuses_real_tmpfs_if_present() -> None:
    # /dev/shm is tmpfs on Linux systems with glibc.
    assert _tools.filesystem_type("/dev/shm") == "tmpfs"
    with pytest.raises(BenchmarkError, match="tmpfs"):
        _bench(target="/dev/shm").check()


@needs_fio
def test_a_named_file_with_data_is_not_overwritten_unasked(tmp_path: Path) -> None:
    """target: a file of the user's, with a write profile, or smaller than size: fio
    replaced its content (an /etc/passwd named by mistake passed check() as well)."""
    mine = tmp_path / "results.csv"
    mine.write_text("a,b\n1,2\n")
    for profile in ("seqwrite", "randwrite", "randrw"):
        with pytest.raises(BenchmarkError, match=rf"file of 8 bytes and profile\(s\) {profile}"):
            _bench(target=str(mine), profiles=["seqread", profile]).check()
    big = tmp_path / "big.dat"
    big.write_bytes(b"x" * 8192)
    _bench(target=str(big), profiles=["seqread", "randread"], size="8k").check()  # reads only
    # smaller than size: fio lays it out first, from its start (a read profile as well)
    with pytest.raises(BenchmarkError, match=r"8 bytes, less than size \(4k\): fio would lay"):
        _bench(target=str(mine), profiles=["randread"], size="4k", bs="4k").check()
    laid = _bench(target=str(mine), profiles=["randread"], size="4k", bs="4k", direct=False,
                  ioengine="psync", allow_write_file=True)  # fmt: skip
    laid.check()
    done = subprocess.run(laid.launch().argv, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert mine.stat().st_size == 4096 and not mine.read_bytes().startswith(b"a,b\n1,2\n")
    mine.write_text("a,b\n1,2\n")
    (tmp_path / "empty.dat").write_bytes(b"")
    _bench(target=str(tmp_path / "empty.dat"), profiles=["seqwrite"]).check()  # nothing to lose
    asked = _bench(target=str(mine), profiles=["seqwrite"], allow_write_file=True, direct=False,
                   ioengine="psync", size="4k", bs="4k")  # fmt: skip
    asked.check()
    done = subprocess.run(asked.launch().argv, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert mine.read_bytes()[:8] != b"a,b\n1,2\n"[:8]  # what the guard is for: fio wrote over it


@needs_fio
def test_check_target_errors(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError, match="does not exist"):
        _bench(target=str(tmp_path / "no" / "f.dat")).check()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(BenchmarkError, match="neither a regular file, a folder nor a block device"):
        _bench(target=str(fifo)).check()
    _bench(target=str(tmp_path)).check()
    _bench(target=str(tmp_path / "new.dat")).check()


@pytest.fixture
def fake_device(monkeypatch: pytest.MonkeyPatch) -> str:
    """/dev/kml-fake looks like block device 7:42 to fio.py."""
    path = "/dev/kml-fake"
    real_stat = os.stat

    def fake_stat(p: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(p) == path:
            return os.stat_result((stat.S_IFBLK | 0o660, 0, 0, 1, 0, 0, 0, 0, 0, 0))
        return real_stat(p, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fio.os, "stat", fake_stat)
    monkeypatch.setattr(fio.os, "access", lambda p, mode: True)
    monkeypatch.setattr(fio, "device_in_use", lambda p, rdev: None)
    return path


@needs_fio
def test_device_reads_are_allowed(fake_device: str) -> None:
    bench = _bench(target=fake_device, profiles=["seqread", "randread"])
    bench.check()
    assert bench.is_device() and not bench.owns_target()
    assert _value(bench.launch().argv, "--filename") == fake_device


@needs_fio
@pytest.mark.parametrize("profile", ["seqwrite", "randwrite", "randrw"])
def test_device_writes_need_permission(fake_device: str, profile: str) -> None:
    with pytest.raises(BenchmarkError, match=r"allow_write_device: true.*read profiles only") as e:
        _bench(target=fake_device, profiles=["seqread", profile]).check()
    assert profile in str(e.value)
    _bench(target=fake_device, profiles=[profile], allow_write_device=True).check()


@needs_fio
def test_device_in_use_is_never_written(fake_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fio, "device_in_use", lambda p, rdev: "mounted on /data")
    with pytest.raises(BenchmarkError, match="is mounted on /data; write profiles would corrupt"):
        _bench(target=fake_device, profiles=["seqwrite"], allow_write_device=True).check()
    _bench(target=fake_device, profiles=["seqread"]).check()  # reading is harmless


def test_load_fio_json_skips_fio_messages() -> None:
    doc = {"fio version": "fio-3.33", "jobs": [{"jobname": "a"}]}
    text = "\nfio: terminating on signal 15\n" + json.dumps(doc, indent=2) + "\n"
    assert load_fio_json(text) == doc
    assert load_fio_json(json.dumps(doc)) == doc
    assert load_fio_json("fio: some error\n") is None
    assert load_fio_json("{not json\n") is None


def test_fio_rows_shape() -> None:
    op = {
        "io_bytes": 4096, "total_ios": 1, "iops": 10.0, "bw_bytes": 40960,
        "lat_ns": {"mean": 1500.0, "percentile": {"50.000000": 1000, "99.000000": 9000}},
    }  # fmt: skip
    empty = {"io_bytes": 0, "total_ios": 0, "iops": 0.0, "bw_bytes": 0, "lat_ns": {}}
    report = {
        "jobs": [{"jobname": "j", "error": 5, "job_runtime": 250, "read": op, "write": empty}]
    }
    rows = {(k, m): (v, u) for k, m, v, u in fio_rows(report)}
    assert rows[("j.read", "lat_p50_us")] == (1.0, "us")
    assert rows[("j.read", "lat_p99_us")] == (9.0, "us")
    assert rows[("j.read", "lat_mean_us")] == (1.5, "us")
    assert rows[("j.read", "runtime_s")] == (0.25, "s")
    assert rows[("j", "error")] == (5.0, "errno")
    assert not any(k == "j.write" for k, _ in rows)


@needs_fio
def test_real_fio_run_and_results(tmp_path: Path) -> None:
    """fio's own JSON, parsed: every byte asked for is read or written once."""
    bench = _bench(target=str(tmp_path), profiles=["seqwrite", "seqread", "randrw"], size="1M")
    bench.check()
    launch = bench.launch()
    assert launch is not None
    out = tmp_path / "stdout.txt"
    try:
        with out.open("wb") as f:
            done = subprocess.run(launch.argv, stdout=f, stderr=subprocess.PIPE, timeout=60)
        assert done.returncode == 0, done.stderr
        assert bench.target_path().stat().st_size == MiB
        frame = bench.results(BenchmarkRun(tmp_path, 0, stdout_path=out))
    finally:
        bench.teardown()
    assert not bench.target_path().exists()  # ours, so removed
    assert frame is not None
    got = {(k, m): v for k, m, v in frame.select("key", "metric", "value").iter_rows()}
    assert set(frame["key"]) == {"seqwrite.write", "seqread.read", "randrw.read", "randrw.write"}
    assert got[("seqwrite.write", "io_bytes")] == MiB
    assert got[("seqread.read", "io_bytes")] == MiB
    assert got[("seqread.read", "total_ios")] == MiB // 4096
    assert got[("randrw.read", "io_bytes")] + got[("randrw.write", "io_bytes")] == MiB
    for key in set(frame["key"]):
        assert got[(key, "iops")] > 0
        assert 0 < got[(key, "lat_p50_us")] <= got[(key, "lat_p99_us")]
        assert got[(key, "lat_mean_us")] > 0


def _disk_sectors(folder: Path) -> tuple[int, int]:
    """Sectors read and written so far by the block device holding ``folder``."""
    dev = os.stat(folder).st_dev
    fields = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat").read_text().split()
    return int(fields[2]), int(fields[6])
