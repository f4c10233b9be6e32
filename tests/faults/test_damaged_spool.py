"""A killed collection's spool, damaged the ways a disk, a hand or a bad memory cell
does: `recover` recovers every intact frame (zstd's on disk, the CRC32C frames of the
raw segments in memory), names what it could not read, keeps the spool and exits
non-zero, and never shows a traceback; two recovers never run at once."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.spool.frames import FRAME, RAW_FRAME, VERSION, ZSTD_MAGIC, Frame, iter_raw_frames
from tests.faults.conftest import (
    EVENT_WAIT_S,
    Run,
    kill_collector,
    read_everything,
    start_collect,
    wait_for_flushes,
    wait_until,
)

pytestmark = pytest.mark.bpf

STORM = ["--", "stress-ng", "--switch", "1", "--switch-freq", "50000", "-t", "60", "--quiet"]


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A collection killed in a storm with every record still in its spool: on disk,
    in zstd frames (no memory spool, rows never made during the run)."""
    out = tmp_path_factory.mktemp("killed")
    config = "  spool_spare_cpus: 1000\n  spool_memory_mib: 0\n"
    run = start_collect(out, *STORM, more_config=config)
    run.wait_for("probes attached")
    # two flushes, however long the first takes (it waits for the decoding libraries'
    # import, slow on a loaded machine): the segment's json then notes the size of a
    # second of storm at least, which the cut tests compare with
    _storm_past_two_flushes(run, run.collection() / ".spool")
    kill_collector(run)
    subprocess.run(["pkill", "-f", "stress-ng --switch 1 --switch-freq 50000"], check=False)
    return run.collection()


def _past_its_last_flush(folder: Path) -> bool:
    """A quanta segment in ``folder`` holds bytes that its json, written at the last
    flush, does not count yet."""
    for seg in folder.glob("quanta_switch.*.ring"):
        try:
            noted = json.loads(seg.with_suffix(".json").read_text())["bytes"]
            if seg.stat().st_size > noted:
                return True
        except (OSError, ValueError, KeyError):  # not written yet, or being replaced
            continue
    return False


def _storm_past_two_flushes(run: Run, folder: Path) -> None:
    """Until the collector counted two flushes and then spooled more than the last one
    noted: a kill then leaves what a kill between two flushes does, a tail no flush
    counted (its last frame maybe cut)."""
    flushes = wait_for_flushes(run, 2)
    assert flushes >= 2, (flushes, run.stderr_lines)
    assert wait_until(lambda: _past_its_last_flush(folder), EVENT_WAIT_S), (
        f"nothing spooled in {folder} past the last flush in {EVENT_WAIT_S} s"
    )


def _copy(killed: Path, tmp_path: Path) -> Path:
    col = tmp_path / "curated" / "benchmark=command" / killed.name
    shutil.copytree(killed, col, symlinks=True)
    return col


def _recover(col: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", "recover", str(col)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _quanta_segment(col: Path) -> Path:
    (seg,) = [p for p in (col / ".spool").glob("quanta_switch.*.ring") if p.stat().st_size]
    return seg


def _frame_starts(data: bytes) -> list[int]:
    starts, at = [], 0
    while at + FRAME.size <= len(data):
        size, _ = FRAME.unpack_from(data, at)
        assert data[at + FRAME.size : at + FRAME.size + 4] == ZSTD_MAGIC
        starts.append(at)
        at += FRAME.size + size
    return starts


def _quanta(col: Path) -> pl.DataFrame:
    return pl.read_parquet(sorted((col / "quanta_runtime").glob("part-*.parquet")))


@pytest.fixture(scope="module")
def whole(killed: Path, tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    """What an undamaged copy recovers (and that the spool then goes)."""
    col = _copy(killed, tmp_path_factory.mktemp("whole"))
    done = _recover(col)
    assert done.returncode == 0, done.stderr
    assert not (col / ".spool").exists()
    assert read_everything(col)["quanta_runtime"] > 50_000
    return _quanta(col)


def test_a_flipped_data_byte_costs_its_frame_and_is_named(
    killed: Path, whole: pl.DataFrame, tmp_path: Path
) -> None:
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    data = bytearray(seg.read_bytes())
    starts = _frame_starts(bytes(data))
    assert len(starts) >= 2, "the storm made one frame: too little to damage one of several"
    data[starts[0] + FRAME.size + 200] ^= 0x40  # inside the first frame's zstd data
    seg.write_bytes(bytes(data))
    done = _recover(col)
    assert done.returncode == 2
    assert f"lost: {seg}" in done.stderr and "doesn't match checksum) at byte 0" in done.stderr
    assert (col / ".spool").exists()  # kept for another try
    got = _quanta(col)
    assert 0 < got.height < whole.height
    assert got.join(whole, on=got.columns, how="anti").height == 0  # no wrong value


def test_a_damaged_frame_header_loses_that_frame_and_reading_goes_on(
    killed: Path, whole: pl.DataFrame, tmp_path: Path
) -> None:
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    data = bytearray(seg.read_bytes())
    starts = _frame_starts(bytes(data))
    data[starts[0] + 3] ^= 0x7F  # the first frame's size: it now runs past the file
    seg.write_bytes(bytes(data))
    done = _recover(col)
    assert done.returncode == 2
    assert "a damaged frame header at byte 0; reading went on" in done.stderr
    got = _quanta(col)
    assert 0 < got.height < whole.height  # the frames after the damaged one
    assert got.join(whole, on=got.columns, how="anti").height == 0


def test_a_lost_description_is_named_with_its_bytes_and_the_spool_kept(
    killed: Path, tmp_path: Path
) -> None:
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    (col / ".spool" / "quanta_switch.json").unlink()
    done = _recover(col)
    assert done.returncode == 2
    assert f"lost: {seg}: {seg.stat().st_size:,} bytes not recovered" in done.stderr
    assert "quanta_switch.json is missing" in done.stderr
    assert seg.exists()  # nothing deleted: the rows are still there for a later try


def test_damaged_jsons_are_one_line_each(killed: Path, tmp_path: Path) -> None:
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    seg.with_suffix(".json").write_text("{not json")
    (col / ".spool" / "quanta_switch.json").write_text(json.dumps(["a list"]))
    done = _recover(col)
    assert done.returncode == 2
    assert "quanta_switch.json is damaged" in done.stderr
    assert done.stderr.count("error:") == 1


def test_records_laid_out_otherwise_than_the_objects_are_refused_not_misread(
    killed: Path, whole: pl.DataFrame, tmp_path: Path
) -> None:
    from kernmlops.ebpf.build import object_path
    from kernmlops.ebpf.spec import object_spec

    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    desc = col / ".spool" / "quanta_switch.json"
    info = json.loads(desc.read_text())
    # the spool names the layout of the objects that collected it
    spec = object_spec(object_path("quanta_runtime"))
    assert info["layout"] == spec.btf.ring_fingerprint(info["ring"])
    assert info["itemsize"] == spec.ring_layouts()[info["ring"]].batch.itemsize
    # objects of the same record size laying it out otherwise (a field moved)
    desc.write_text(json.dumps({**info, "layout": "0123456789abcdef"}))
    done = _recover(col)
    assert done.returncode == 2
    assert f"lost: {seg}: {seg.stat().st_size:,} bytes not recovered" in done.stderr
    assert "lays out its records otherwise than the objects that collected them" in done.stderr
    assert seg.exists() and not (col / "quanta_runtime").exists()  # nothing misread
    # a spool of before the fingerprint: its record size alone is checked
    desc.write_text(json.dumps({k: v for k, v in info.items() if k != "layout"}))
    done = _recover(col)
    assert done.returncode == 0, done.stderr
    assert _quanta(col).equals(whole)


def test_two_recovers_never_run_at_once(killed: Path, tmp_path: Path) -> None:
    col = _copy(killed, tmp_path)
    lock = os.open(col / ".spool" / "recover.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.write(lock, b"4242")
        done = _recover(col)
    finally:
        os.close(lock)
    assert done.returncode != 0
    assert "another `kernmlops recover` (pid 4242) is recovering" in done.stderr
    assert _quanta_segment(col).exists()
    assert _recover(col).returncode == 0  # once the first is done


def test_a_segment_cut_short_after_a_flush_is_named_with_what_it_lost(
    killed: Path, whole: pl.DataFrame, tmp_path: Path
) -> None:
    # Each flush notes every segment's size in its json: a file found shorter than
    # that lost bytes the collector had written (a disk's damage, a copy cut short),
    # which a kill's own cut end (after the last flush) cannot explain.
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    noted = json.loads(seg.with_suffix(".json").read_text())["bytes"]
    assert 0 < noted <= seg.stat().st_size
    keep = noted // 3
    os.truncate(seg, keep)
    done = _recover(col)
    assert done.returncode == 2
    assert f"cut short: {noted - keep:,} bytes fewer than it held" in done.stderr
    assert 0 < _quanta(col).height < whole.height


def test_the_active_segment_deleted_after_a_flush_is_named_with_what_it_held(
    killed: Path, tmp_path: Path
) -> None:
    # Its json stays and was never marked retired (the writer marks it before it
    # deletes a segment whose rows are in finished parts): the file went after the
    # collection wrote it, with at least what the last flush noted in it.
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    noted = json.loads(seg.with_suffix(".json").read_text())["bytes"]
    assert noted > 0
    seg.unlink()
    done = _recover(col)
    assert done.returncode == 2
    assert (f"lost: {seg}: {noted:,} bytes not recovered: the file is missing, deleted "
            "after the collection wrote it") in done.stderr, done.stderr  # fmt: skip
    assert done.stderr.count("lost: ") == 1
    assert seg.with_suffix(".json").exists()  # the spool is kept, as for any loss


def test_a_retired_segments_json_left_alone_is_no_loss(killed: Path, tmp_path: Path) -> None:
    # A kill between the writer's two deletions of a retired segment (its rows are in
    # finished parts): its json, marked retired, is left without its file.
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    meta = json.loads(seg.with_suffix(".json").read_text())
    seg.with_suffix(".json").write_text(json.dumps({**meta, "retired": True}))
    seg.unlink()
    done = _recover(col)
    assert done.returncode == 0, done.stderr
    assert "lost: " not in done.stderr
    # a spool of before the mark: a json without its file was never named, nor is it now
    col = _copy(killed, tmp_path / "old")
    seg = _quanta_segment(col)
    assert meta.pop("retired") is False  # the writer marks every json it writes
    seg.with_suffix(".json").write_text(json.dumps(meta))
    seg.unlink()
    done = _recover(col)
    assert done.returncode == 0, done.stderr
    assert "lost: " not in done.stderr


# -- the memory spool: raw segments on the tmpfs, in CRC32C frames ---------------------


@pytest.fixture(scope="module")
def killed_in_memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A collection killed in a storm with every record in its memory spool (raw
    frames on the tmpfs), and a copy of that tmpfs folder: a recovery deletes it, and
    each test lays it anew for its own copy of the collection (one collection id, so
    one folder, as the link ``mem`` requires)."""
    out = tmp_path_factory.mktemp("killed-in-memory")
    config = "  spool_spare_cpus: 1000\n  spool_memory_mib: 256\n"
    run = start_collect(out, *STORM, more_config=config)
    run.wait_for("probes attached")
    # its size noted in the json, as the disk spool's (killed)
    _storm_past_two_flushes(run, run.collection() / ".spool" / "mem")
    kill_collector(run)
    subprocess.run(["pkill", "-f", "stress-ng --switch 1 --switch-freq 50000"], check=False)
    col = run.collection()
    shm = (col / ".spool" / "mem").resolve()
    saved = tmp_path_factory.mktemp("tmpfs-copy") / "mem"
    shutil.copytree(shm, saved)
    yield col, saved
    shutil.rmtree(shm, ignore_errors=True)


def _copy_in_memory(
    killed: tuple[Path, Path], tmp_path: Path, *, moved: bool = True
) -> tuple[Path, Path]:
    """A copy of the collection, its tmpfs folder laid anew; (collection, segment).
    ``moved``: the folder names the copy's spool as its own, as if the collection had
    been moved there (else the original's, which is still there: a copy's)."""
    col, saved = killed
    shm = Path(os.readlink(col / ".spool" / "mem"))
    shutil.rmtree(shm, ignore_errors=True)
    shutil.copytree(saved, shm)  # its mode (0700) and owner: ours, as recover requires
    copy = _copy(col, tmp_path)
    if moved:
        (shm / "owner").write_text(str((copy / ".spool").resolve()))
    (seg,) = [p for p in (copy / ".spool" / "mem").glob("quanta_switch.*.ring") if p.stat().st_size]
    return copy, seg


def test_a_copys_recover_leaves_the_spool_in_memory_to_the_original(
    killed_in_memory: tuple[Path, Path], tmp_path: Path
) -> None:
    # cp -a keeps the link to the tmpfs folder, which the original still links to: the
    # copy's recover would take the original's rows (and delete them), and the original's
    # then say they were lost to a reboot
    col, _ = killed_in_memory
    copy, seg = _copy_in_memory(killed_in_memory, tmp_path, moved=False)
    before = {p.name: p.read_bytes() for p in seg.parent.iterdir()}
    done = _recover(copy)
    assert done.returncode == 2
    assert (f"{copy} is a copy: its spool's rows in memory belong to {col}, which is still "
            "there; recover that collection") in done.stderr  # fmt: skip
    assert {p.name: p.read_bytes() for p in seg.parent.iterdir()} == before
    assert not (copy / "quanta_runtime").exists()


def _raw_frames(seg: Path) -> list[Frame]:
    found = list(iter_raw_frames(seg.read_bytes()))
    assert all(f.reason is None for f in found[:-1])  # the last one a kill may have cut
    assert len(found) >= 4, "the storm made too few frames to damage one of several"
    return found


@pytest.fixture(scope="module")
def whole_in_memory(
    killed_in_memory: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> pl.DataFrame:
    """What an undamaged copy of the memory spool recovers (and that the spool goes)."""
    col, seg = _copy_in_memory(killed_in_memory, tmp_path_factory.mktemp("whole-in-memory"))
    shm = seg.parent.resolve()
    done = _recover(col)
    assert done.returncode == 0, done.stderr
    assert not (col / ".spool").exists() and not shm.exists()
    assert read_everything(col)["quanta_runtime"] > 50_000
    return _quanta(col)


def _rows_of(col: Path, raw: bytes) -> int:
    """The quanta_runtime rows the records ``raw`` make, as recover makes them."""
    from kernmlops.ebpf.btf import unbatch
    from kernmlops.ebpf.ringbuf import decode
    from kernmlops.ebpf.spec import object_spec
    from kernmlops.hooks import get_hook

    info = json.loads((col / ".spool" / "quanta_switch.json").read_text())
    cls = get_hook(info["hook"])
    hook = cls(cls.Options.model_validate(info["options"]))
    layout = object_spec(Path(info["object"])).ring_layouts()[info["ring"]]
    records = decode(np.frombuffer(raw, np.uint8), 1, 0, len(raw), layout.batch).records
    records = unbatch(records, layout)
    return sum(t.num_rows for name, t in hook.rows_from("quanta_switch", records, layout)
               if name == "quanta_runtime")  # fmt: skip


def test_flipped_bytes_in_a_memory_segment_cost_their_frame_which_is_named(
    killed_in_memory: tuple[Path, Path], whole_in_memory: pl.DataFrame, tmp_path: Path
) -> None:
    # A memory cell that flips: without a checksum these bytes became wrong values.
    col, seg = _copy_in_memory(killed_in_memory, tmp_path)
    data = bytearray(seg.read_bytes())
    found = _raw_frames(seg)
    bad = found[1]
    assert bad.raw is not None
    for at in (RAW_FRAME.size + 40, RAW_FRAME.size + 41, (bad.end - bad.start) // 2):
        data[bad.start + at] ^= 0x5A  # inside its records (a timestamp, a pid...)
    seg.write_bytes(bytes(data))
    done = _recover(col)
    assert done.returncode == 2
    stride = _stride(col)
    records = len(bad.raw) // stride
    assert (
        f"lost: {seg}: {bad.end - bad.start:,} bytes ({records:,} records) not recovered: "
        f"a frame that fails its CRC32C at byte {bad.start:,}; reading went on at the next "
        "intact frame"
    ) in done.stderr, done.stderr
    assert done.stderr.count("lost: ") == 1
    assert seg.exists()  # the spool is kept, memory segment included
    got = _quanta(col)
    # Every other frame's rows, each right: none has a value the damage made, and what
    # is missing is exactly what the damaged frame held.
    assert got.join(whole_in_memory, on=got.columns, how="anti").height == 0
    lost = _rows_of(col, bad.raw)
    assert lost > 0 and got.height == whole_in_memory.height - lost
    assert whole_in_memory.join(got, on=got.columns, how="anti").height == lost


def test_a_damaged_raw_frame_header_loses_that_frame_and_reading_goes_on(
    killed_in_memory: tuple[Path, Path], whole_in_memory: pl.DataFrame, tmp_path: Path
) -> None:
    col, seg = _copy_in_memory(killed_in_memory, tmp_path)
    data = bytearray(seg.read_bytes())
    bad = _raw_frames(seg)[2]
    data[bad.start + 6] ^= 0x01  # its length: the header's own CRC no longer matches
    seg.write_bytes(bytes(data))
    done = _recover(col)
    assert done.returncode == 2
    assert (
        f"lost: {seg}: {bad.end - bad.start:,} bytes not recovered: a damaged frame header "
        f"at byte {bad.start:,}; reading went on at the next intact frame"
    ) in done.stderr, done.stderr
    got = _quanta(col)
    assert got.join(whole_in_memory, on=got.columns, how="anti").height == 0
    assert bad.raw is not None
    assert got.height == whole_in_memory.height - _rows_of(col, bad.raw)


def test_a_memory_segment_cut_at_a_frame_below_its_last_flush_is_named(
    killed_in_memory: tuple[Path, Path], whole_in_memory: pl.DataFrame, tmp_path: Path
) -> None:
    # The active segment, on the tmpfs, cut where a frame ends: what is left reads as
    # whole frames, as a kill leaves them; only the size its json noted at the last
    # flush tells the cut from the run's end.
    col, seg = _copy_in_memory(killed_in_memory, tmp_path)
    noted = json.loads(seg.with_suffix(".json").read_text())["bytes"]
    keep = _raw_frames(seg)[1].start
    assert 0 < keep < noted <= seg.stat().st_size
    os.truncate(seg, keep)
    done = _recover(col)
    assert done.returncode == 2
    assert (f"lost: {seg}: {noted - keep:,} bytes not recovered: cut short: "
            f"{noted - keep:,} bytes fewer than it held at the collector's last flush"
            ) in done.stderr, done.stderr  # fmt: skip
    assert done.stderr.count("lost: ") == 1
    assert 0 < _quanta(col).height < whole_in_memory.height


def test_a_raw_segment_of_before_the_frames_is_still_read(
    killed_in_memory: tuple[Path, Path], whole_in_memory: pl.DataFrame, tmp_path: Path
) -> None:
    # A collection killed by a kernmlops of before: its memory segment is the records
    # back to back, and its json has no version. Recover reads it as it was written.
    col, seg = _copy_in_memory(killed_in_memory, tmp_path)
    seg.write_bytes(b"".join(f.raw or b"" for f in _raw_frames(seg) if f.reason is None))
    meta = json.loads(seg.with_suffix(".json").read_text())
    assert meta.pop("version") == VERSION
    meta.pop("bytes", None)
    seg.with_suffix(".json").write_text(json.dumps(meta))
    done = _recover(col)
    assert done.returncode == 0, done.stderr
    got = _quanta(col)
    assert got.height == whole_in_memory.height
    assert got.join(whole_in_memory, on=got.columns, how="anti").height == 0


def _stride(col: Path) -> int:
    from kernmlops.ebpf.ringbuf import record_stride

    info = json.loads((col / ".spool" / "quanta_switch.json").read_text())
    return record_stride(info["itemsize"])
