"""``kernmlops recover`` compacts what it leaves as the collector's stop does: the
killed collector's flushed parts and the recovered ones become few compactly encoded
files, with the same rows in the same order; a kill at any step of it loses and
repeats nothing (a second recover reads the same rows)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kernmlops.collect.manifest import Manifest, read_manifest, write_manifest
from kernmlops.collect.parquet import ParquetSink
from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.spec import object_spec
from kernmlops.hooks.process_trace import ProcessTraceHook
from kernmlops.spool.copy import RingSpool
from tests.conftest import skip_here

OBJECT = object_path("process_trace")
FLUSHES, FLUSH_ROWS, SPOOLED = 5, 500, 4000


def _layout():
    return object_spec(OBJECT).ring_layouts()["process_trace_rb"]


def _records(lo: int, hi: int) -> np.ndarray:
    records = np.zeros(hi - lo, _layout().dtype)
    records["pid"] = np.arange(lo, hi)
    return records


def killed_collection(folder: Path, *, compact: bool = True) -> Path:
    """What a collector killed mid-run leaves: the parts of FLUSHES flushes (written
    cheaply where collector.compact is on, as a run's are), and a spool holding every
    record of the run (the first FLUSHES * FLUSH_ROWS of them are in those parts)."""
    if not OBJECT.exists():
        skip_here("the BPF objects are not built (make bpf)")
    config = {"collector": {"compact": compact, "row_group_rows": 1024}}
    write_manifest(folder, Manifest(collection_id="c0", state="running", config=config))
    sink = ParquetSink(folder, "c0", row_group_rows=1024, fast_parts=compact)
    for i in range(FLUSHES):
        rows = _records(i * FLUSH_ROWS, (i + 1) * FLUSH_ROWS)
        sink.write("process_trace", ProcessTraceHook().to_frame("t", rows, _layout()))
        sink.flush(durable=True)
    sink.close()
    info = {"hook": "process_trace", "options": ProcessTraceHook.Options().model_dump(),
            "ring": "process_trace_rb", "object": str(OBJECT)}  # fmt: skip
    records = _records(0, SPOOLED)
    spool = RingSpool(folder / ".spool", "process_trace", records.itemsize, info)
    spool.append(records)
    spool.drained()
    spool.close()  # its files stay, as a killed collector's
    return folder


def _parts(folder: Path) -> list[Path]:
    return sorted((folder / "process_trace").glob("part-*.parquet"))


def _pids(folder: Path) -> list[int]:
    return [pid for p in _parts(folder) for pid in pq.read_table(p)["pid"].to_pylist()]


def test_recover_compacts_the_parts_as_the_stop_does(tmp_path: Path) -> None:
    from kernmlops.collect.recovery import recover

    # the same killed collection, recovered where the collector compacts and where not
    plain = killed_collection(tmp_path / "plain", compact=False)
    col = killed_collection(tmp_path / "col")
    assert len(_parts(col)) == FLUSHES
    assert recover(plain).added == recover(col).added == {"process_trace": SPOOLED - 2500}
    assert _pids(plain) == _pids(col) == list(range(SPOOLED))  # each row once, in order
    assert len(_parts(plain)) == FLUSHES + 1  # not compacted: as the collector left it
    assert len(_parts(col)) == 1
    (part,) = _parts(col)
    assert pq.ParquetFile(part).metadata.row_group(0).column(1).compression == "ZSTD"
    manifest = read_manifest(col)
    assert manifest.state == "recovered"
    table = manifest.tables["process_trace"]
    assert (table.rows, table.files) == (SPOOLED, ["process_trace/part-00000.parquet"])
    assert table.compaction == "compacted"
    # nothing is left beside the table but the manifest (the spool went)
    assert sorted(p.name for p in col.iterdir()) == ["manifest.json", "process_trace"]


def test_a_stop_killed_while_removing_its_spool_is_compacted_by_recover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row in parts, the spool marked done, its files not yet deleted (the stop
    was killed there, before its compaction): recover finishes the removal and
    compacts the parts, the rows as they were."""
    import os

    from kernmlops.collect.recovery import recover
    from kernmlops.spool import recovery as spool_recovery
    from kernmlops.spool.collection import spool_done

    col = killed_collection(tmp_path / "col")
    before = _pids(col)

    def killed(*args: object, **kwargs: object) -> None:
        raise OSError("killed")  # the mark is made; no file goes

    with monkeypatch.context() as m:
        m.setattr(spool_recovery.os, "unlink", killed)
        spool_recovery.remove_spool(col / ".spool")
    assert spool_done(col / ".spool") and len(_parts(col)) == FLUSHES
    assert recover(col).compaction == {"process_trace": "compacted"}
    assert _pids(col) == before and len(_parts(col)) == 1
    manifest = read_manifest(col)
    assert manifest.state == "recovered"
    assert manifest.tables["process_trace"].files == ["process_trace/part-00000.parquet"]
    assert sorted(os.listdir(col)) == ["manifest.json", "process_trace"]  # the spool went


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from kernmlops.collect import compaction, parts
    from kernmlops.collect.recovery import recover

    folder, point = Path(sys.argv[1]), sys.argv[2]

    def die(*args):
        os.kill(os.getpid(), signal.SIGKILL)

    real_exchange = compaction.exchange
    if point == "rewriting":  # in the first row group compaction writes
        class Dying(parts.pq.ParquetWriter):
            def write_table(self, *a, **k):
                super().write_table(*a, **k)
                die()
        real_rewrite = compaction.rewrite
        def dying_rewrite(*a, **k):
            parts.pq.ParquetWriter = Dying
            return real_rewrite(*a, **k)
        compaction.rewrite = dying_rewrite
    elif point == "before-swap":
        compaction.exchange = die
    elif point == "after-swap":
        def swap_then_die(a, b):
            real_exchange(a, b)
            die()
        compaction.exchange = swap_then_die
    recover(folder)
    """
)


@pytest.mark.parametrize("point", ["rewriting", "before-swap", "after-swap"])
def test_a_kill_while_recover_compacts_loses_and_repeats_nothing(
    tmp_path: Path, point: str
) -> None:
    from kernmlops.collect.recovery import recover

    col = killed_collection(tmp_path / "col")
    child = subprocess.run([sys.executable, "-c", CHILD, str(col), point], timeout=120)
    assert child.returncode == -signal.SIGKILL
    # the parts of before the swap, or the new one after it: every row once, in order
    assert _pids(col) == list(range(SPOOLED))
    assert (col / ".spool").exists()  # removed only after the compaction
    recover(col)  # a second recover: what the kill left is finished, nothing repeated
    assert _pids(col) == list(range(SPOOLED))
    assert len(_parts(col)) == 1
    assert read_manifest(col).tables["process_trace"].rows == SPOOLED
    assert sorted(p.name for p in col.iterdir()) == ["manifest.json", "process_trace"]


NOBODY = 65534


def test_recover_as_root_never_compacts_a_hard_link_to_roots_file(tmp_path: Path) -> None:
    """fs.protected_hardlinks off: the owner of a collection that root recovers puts a
    second name of root's own part (rows they may not read) among its parts. The
    compaction root runs leaves the table as it is rather than copy those rows into a
    new file of the collection, and says why in the manifest."""
    import os

    from kernmlops.collect.recovery import recover

    if os.geteuid() != 0:
        skip_here("needs root (a collection of another user's)")
    col = killed_collection(tmp_path / "alice" / "col")
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    secret = pq.read_table(_parts(col)[0])  # a part as the collection's, of root's rows
    at = secret.schema.get_field_index("pid")
    pids = np.full(secret.num_rows, 999_999, secret.schema.field(at).type.to_pandas_dtype())
    secret = secret.set_column(at, "pid", [pids])
    pq.write_table(secret, victim / "secret.parquet")
    (victim / "secret.parquet").chmod(0o600)
    before = (victim / "secret.parquet").read_bytes()
    os.link(victim / "secret.parquet", col / "process_trace" / f"part-{FLUSHES:05d}.parquet")
    for path in [tmp_path / "alice", *(tmp_path / "alice").rglob("*")]:
        if path.stat().st_nlink == 1 or path.is_dir():  # root's file stays root's
            os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    recover(col)
    outcome = read_manifest(col).tables["process_trace"].compaction
    assert outcome is not None and outcome.startswith("skipped: "), outcome
    linked = (victim / "secret.parquet").stat().st_ino
    others = [p for p in _parts(col) if p.stat().st_ino != linked]
    assert others and all(999_999 not in pq.read_table(p)["pid"].to_pylist() for p in others)
    assert not [p for p in col.iterdir() if p.name.startswith(".compact")]
    assert (victim / "secret.parquet").read_bytes() == before
