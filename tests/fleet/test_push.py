"""kernmlops push and collect --publish: to a folder (file://) and to an S3 server (moto),
read back with DuckDB, pyarrow and boto3 and compared with the source parts and the
manifests; interrupted pushes resume; what may not be published is refused, one line."""

from __future__ import annotations

import errno
import http.server
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from kernmlops.cli import cli
from kernmlops.clitools import WAIT_SAY_AFTER_S
from kernmlops.collect.manifest import read_manifest
from tests.conftest import REQUIRE_BPF, skip_here
from tests.fleet.conftest import SECRET, make_collection

duckdb = pytest.importorskip("duckdb")


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def one_error_line(result: Result) -> str:
    """The run failed with exactly one line on stderr and no traceback."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit), result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def source_rows(folder: Path) -> dict[str, int]:
    """Rows per table, from the source's part footers."""
    rows: dict[str, int] = {}
    for part in folder.glob("*/part-*.parquet"):
        rows[part.parent.name] = rows.get(part.parent.name, 0) + pq.read_metadata(part).num_rows
    return rows


def duckdb_rows(root: Path) -> dict[tuple[str, str], int]:
    """(collection_id, table) -> rows, as DuckDB reads the published folder."""
    found: dict[tuple[str, str], int] = {}
    for table in {p.name for p in root.glob("*/*/*") if p.is_dir()}:
        query = (
            f"select collection_id, count(*) from read_parquet('{root}/*/*/{table}/*.parquet', "
            "hive_partitioning=true) group by all"
        )
        for cid, n in duckdb.sql(query).fetchall():
            found[(cid, table)] = n
    return found


def snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_push_to_a_folder_reads_back_whole_and_a_second_push_copies_nothing(
    fleet: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    first = run("push", str(fleet.parent), dest.as_uri())
    assert first.exit_code == 0, first.output
    assert "3 published, 0 already there" in first.stderr
    sources = sorted(fleet.glob("*/collection_id=*"))
    expected = {}
    for folder in sources:
        cid = folder.name.split("=", 1)[1]
        manifest = read_manifest(folder)
        rows = source_rows(folder)
        assert rows == {t: r.rows for t, r in manifest.tables.items()}
        expected.update({(cid, t): n for t, n in rows.items()})
        copy = dest / folder.parent.name / folder.name
        assert (copy / "manifest.json").read_bytes() == (folder / "manifest.json").read_bytes()
    assert duckdb_rows(dest) == expected
    # the index: one row per collection, rows per table counted at the source
    index = duckdb.sql(
        f"select collection_id, benchmark, host, kernel, state, e.key, e.value from "
        f"(select *, unnest(map_entries(rows)) as e from read_parquet('{dest}/_index/*.parquet'))"
    ).fetchall()
    assert {(r[0], r[5]): r[6] for r in index} == expected
    assert {r[:5] for r in index} == {
        ("c1", "faux", "node-a", "6.1.0-node-a", "completed"),
        ("c2", "faux", "node-b", "6.1.0-node-b", "completed"),
        ("c3", "stress-ng", "node-a", "6.1.0-node-a", "completed"),
    }
    assert not [p for p in dest.rglob(".*")], "a temporary file was left"
    before = snapshot(dest)
    again = run("push", str(fleet), dest.as_uri())
    assert again.exit_code == 0, again.output
    assert "0 published, 3 already there" in again.stderr
    assert snapshot(dest) == before


def test_push_to_s3_reads_back_whole_and_says_no_secret(fleet: Path, s3) -> None:
    bucket, client = s3
    uri = f"s3://{bucket}/lab/fleet"
    result = run("push", str(fleet), uri)
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    listed = client.list_objects_v2(Bucket=bucket)
    keys = {o["Key"]: o["Size"] for o in listed["Contents"]}
    expected = {}
    for folder in fleet.glob("*/collection_id=*"):
        for f in folder.rglob("*"):
            if f.is_file():
                key = f"lab/fleet/{folder.parent.name}/{folder.name}/{f.relative_to(folder)}"
                expected[key] = f.stat().st_size
    index = {k for k in keys if k.startswith("lab/fleet/_index/")}
    assert index == {f"lab/fleet/_index/{c}.parquet" for c in ("c1", "c2", "c3")}
    assert {k: v for k, v in keys.items() if k not in index} == expected
    # every part reads back through pyarrow's S3 client with the manifest's row counts
    fs, root = pafs.FileSystem.from_uri(uri)
    for folder in fleet.glob("*/collection_id=*"):
        manifest = read_manifest(folder)
        for table, record in manifest.tables.items():
            got = sum(
                pq.read_metadata(
                    f"{root}/{folder.parent.name}/{folder.name}/{f}", filesystem=fs
                ).num_rows
                for f in record.files
            )
            assert got == record.rows, (folder.name, table)
    # the index read back over S3 (its files read side by side)
    ls = run("fleet", "ls", "--json", uri)
    assert ls.exit_code == 0, ls.output
    rows = [json.loads(line) for line in ls.stdout.splitlines()]
    assert sorted((r["collection_id"], r["host"]) for r in rows) == [
        ("c1", "node-a"), ("c2", "node-b"), ("c3", "node-a"),
    ]  # fmt: skip
    assert {r["collection_id"]: r["total_rows"] for r in rows} == {
        c.name.split("=")[1]: sum(t.rows for t in read_manifest(c).tables.values())
        for c in fleet.glob("*/collection_id=*")
    }
    again = run("push", str(fleet), uri)
    assert "0 published, 3 already there" in again.stderr
    listed_again = client.list_objects_v2(Bucket=bucket)["Contents"]
    modified = [o["LastModified"] for o in listed["Contents"]]
    assert [o["LastModified"] for o in listed_again] == modified


@pytest.mark.parametrize("where", ["file", "s3"])
def test_an_interrupted_push_resumes(
    fleet: Path, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:  # fmt: skip
    """The destination fills up after three files: the push stops with one line, the
    collection is not published (no manifest, no index row), and a second push copies
    only what is missing."""
    import kernmlops.fleet.push as push_module

    if where == "s3":
        bucket, _ = request.getfixturevalue("s3")
        uri = f"s3://{bucket}/fleet"
    else:
        uri = (tmp_path / "dest").as_uri()
    folder = fleet / "benchmark=faux" / "collection_id=c1"
    real_put = push_module.put
    calls: list[str] = []

    def full_after_three(dataset, source, rel):
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        calls.append(rel.removeprefix("benchmark=faux/collection_id=c1/"))
        real_put(dataset, source, rel)

    monkeypatch.setattr(push_module, "put", full_after_three)
    line = one_error_line(run("push", str(folder), uri))
    assert "the destination is full" in line and "resume" in line
    fs, root = pafs.FileSystem.from_uri(uri)
    base = f"{root}/benchmark=faux/collection_id=c1"
    there = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    names = sorted(i.path[len(base) + 1 :] for i in there if i.type == pafs.FileType.File)
    assert names == sorted(calls) and "manifest.json" not in names
    assert fs.get_file_info(f"{root}/_index/c1.parquet").type == pafs.FileType.NotFound
    monkeypatch.setattr(push_module, "put", real_put)
    resumed = run("push", str(folder), uri)
    assert resumed.exit_code == 0, resumed.output
    assert "(3 already there)" in resumed.stderr
    total = sum(1 for p in folder.rglob("*") if p.is_file())
    assert f"c1: {total - 3} files" in resumed.stderr
    rows = {
        t: sum(pq.read_metadata(f"{base}/{f}", filesystem=fs).num_rows for f in r.files)
        for t, r in read_manifest(folder).tables.items()
    }
    assert rows == source_rows(folder)


def test_what_may_not_be_published_is_refused_with_the_reason(tmp_path: Path, fleet: Path) -> None:
    root = tmp_path / "other"
    # a collector still running (its process has kernmlops in its command line, and
    # began before the collection did)
    alive = subprocess.Popen(["sh", "-c", "sleep 60", "kernmlops"])
    try:
        now = datetime.now(UTC).isoformat()
        make_collection(root, "live", state="running", collector_pid=alive.pid, started_at=now)
        spooled = make_collection(root, "spooled", state="running", collector_pid=None)
        (spooled / ".spool").mkdir()
        (spooled / ".spool" / "quanta_switch.00000.ring").write_bytes(b"\0" * 64)
        make_collection(root, "died", state="running", last_flush_at="2026-11-01T10:00:01Z")
        make_collection(root, "fine", seed=4)
        dest = tmp_path / "dest"
        result = run("push", str(root), str(dest))
    finally:
        alive.kill()
        alive.wait()
    assert result.exit_code == 1, result.output
    refused = [line for line in result.stderr.splitlines() if line.startswith("refused:")]
    assert len(refused) == 3
    text = "\n".join(refused)
    assert f"still being collected (collector pid {alive.pid})" in text
    assert "kernmlops recover" in text and "collection_id=spooled" in text
    assert "stopped without finishing (state running, last flush 2026-11-01T10:00:01Z)" in text
    published = {p.name for p in (dest / "benchmark=faux").iterdir()}
    assert published == {"collection_id=fine"}
    assert [p.name for p in (dest / "_index").iterdir()] == ["fine.parquet"]
    # --incomplete publishes the dead collector's collection, marked running
    folder = root / "benchmark=faux" / "collection_id=died"
    assert run("push", "--incomplete", str(folder), str(dest)).exit_code == 0
    state = duckdb.sql(f"select state from read_parquet('{dest}/_index/died.parquet')").fetchall()
    assert state == [("running",)]


def test_a_part_damaged_inside_a_page_is_never_published(tmp_path: Path, fleet: Path) -> None:
    """A byte flipped inside a data page leaves the footer whole and the size the
    source's: push reads every page against its checksum and refuses the collection,
    naming the part, in one line; the others are published."""
    from tests.parquet_damage import flip_page_byte

    c2 = fleet / "benchmark=faux" / "collection_id=c2"
    part = c2 / "quanta_runtime" / "part-00001.parquet"
    flip_page_byte(part, "quanta_run_length_us", row_group=2)
    dest = tmp_path / "dest"
    result = run("push", str(fleet), str(dest))
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    refused = [line for line in result.stderr.splitlines() if line.startswith("refused:")]
    assert refused == [
        f"refused: {part}: damaged, not published: a page fails its checksum (row group 2, "
        "column 'quanta_run_length_us')"
    ]
    assert not (dest / "benchmark=faux" / "collection_id=c2").exists()
    assert sorted(p.name for p in (dest / "_index").iterdir()) == ["c1.parquet", "c3.parquet"]
    # alone: the refusal and the summary, exit 1
    alone = run("push", "--no-progress", str(c2), str(dest))
    assert alone.exit_code == 1 and "Traceback" not in alone.output
    assert alone.stderr.splitlines() == [
        refused[0],
        f"0 published, 0 already there, 1 refused ({dest})",
    ]


def test_a_push_that_publishes_nothing_makes_no_folder(tmp_path: Path, fleet: Path) -> None:
    """Every collection refused (a part damaged inside a page, another not Parquet at
    all): no dataset folder is made, nor the folders above it; a folder that was there
    before is kept as it was."""
    from tests.parquet_damage import flip_page_byte

    c1 = fleet / "benchmark=faux" / "collection_id=c1"
    c2 = fleet / "benchmark=faux" / "collection_id=c2"
    flip_page_byte(c2 / "quanta_runtime" / "part-00001.parquet", "quanta_run_length_us")
    (c1 / "quanta_runtime" / "part-00000.parquet").write_bytes(b"not parquet")
    dest = tmp_path / "new" / "deeper" / "dest"
    for uri in (str(dest), f"file://{dest}"):
        result = run("push", "--no-progress", str(c1), str(c2), uri)
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert result.stderr.splitlines()[-1].startswith("0 published, 0 already there, 2 refused")
        assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    assert run("push", "--no-progress", str(c1), str(c2), str(kept)).exit_code == 1
    assert kept.is_dir() and not list(kept.iterdir())
    # the first collection accepted makes the folder
    c3 = fleet / "benchmark=stress-ng" / "collection_id=c3"
    assert run("push", "--no-progress", str(c1), str(c3), str(dest)).exit_code == 1
    assert sorted(p.name for p in dest.iterdir()) == ["_index", "benchmark=stress-ng"]


@pytest.fixture
def denying_server() -> Iterator[str]:
    """An HTTP server that answers every S3 request with 403 AccessDenied."""

    class Deny(http.server.BaseHTTPRequestHandler):
        def _deny(self) -> None:
            body = (
                b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                b"<Message>Access Denied</Message></Error>"
            )
            self.send_response(403)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _deny

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Deny)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_user_errors_are_one_line(
    fleet: Path, tmp_path: Path, s3, denying_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, _ = s3
    folder = str(fleet / "benchmark=faux" / "collection_id=c1")
    cases = {
        "nope://x/y": "no filesystem for nope://",
        "s3://": "name a bucket",
        "s3://no-such-bucket/x": "the bucket 'no-such-bucket' does not exist",
    }
    for uri, expected in cases.items():
        assert expected in one_error_line(run("push", folder, uri)), uri
    assert "not a collection" in one_error_line(run("push", str(tmp_path), f"s3://{bucket}/x"))
    with socket_closed_port() as port:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        started = time.monotonic()
        refused = run("push", folder, f"s3://{bucket}/x")
        took = time.monotonic() - started
    # the client retries for seconds: the wait is said (off a terminal, once it has
    # lasted WAIT_SAY_AFTER_S), then the error
    said, *rest = [line for line in refused.stderr.splitlines() if line.strip()]
    assert took > WAIT_SAY_AFTER_S and said == f"reaching s3://{bucket}/x ..."
    assert "cannot reach" in rest[-1] and "no answer from the endpoint" in rest[-1]
    assert len(rest) == 1 and refused.exit_code != 0 and "Traceback" not in refused.output
    monkeypatch.setenv("AWS_ENDPOINT_URL", denying_server)
    line = one_error_line(run("push", folder, f"s3://{bucket}/x"))
    assert "access denied" in line and SECRET not in line
    # the source is untouched by every failure
    assert source_rows(Path(folder)) == {
        t: r.rows for t, r in read_manifest(Path(folder)).tables.items()
    }


class socket_closed_port:
    """A local port nothing listens on."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_a_full_disk_stops_the_push_and_keeps_the_source(tmp_path: Path) -> None:
    """A real small file system (tmpfs, needs root) fills during the push."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], capture_output=True
    )
    if mounted.returncode != 0:
        skip_here(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        folder = make_collection(tmp_path / "src", "big", quanta=60_000)
        before = snapshot(folder)
        line = one_error_line(run("push", str(folder), str(small / "fleet")))
        assert "the destination is full" in line
        assert snapshot(folder) == before
        copy = small / "fleet" / "benchmark=faux" / "collection_id=big"
        assert not (copy / "manifest.json").exists()
        assert not list(small.rglob(".*")), "a temporary file was left"
    finally:
        subprocess.run(["umount", str(small)], check=False)


if REQUIRE_BPF:  # CI installs moto with the dev extras: the S3 tests must run there
    pytest.importorskip("moto")


def test_a_uri_that_is_empty_or_a_file_is_refused(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty URI would publish into the current directory; a URI naming a file said only
    "[Errno 17] File exists"."""
    folder = str(fleet / "benchmark=faux" / "collection_id=c1")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for empty in ("", "  "):
        line = one_error_line(run("push", folder, empty))
        assert "the URI is empty" in line, line
    assert not list(here.iterdir())
    afile = tmp_path / "afile"
    afile.write_text("x")
    line = one_error_line(run("push", folder, str(afile)))
    assert f"{afile} is a file, not a dataset" in line and "Errno" not in line
    line = one_error_line(run("push", folder, str(afile / "fleet")))
    assert "a part of the path is a file" in line and "Errno" not in line
    assert afile.read_text() == "x"
    assert run("push", folder, str(tmp_path / "ok")).exit_code == 0  # a folder beside it


def test_a_dataset_folder_that_cannot_be_made_is_said_in_words(fleet: Path) -> None:
    """A folder under /proc (the kernel's: nothing can be made there) said "[Errno 2] No
    such file or directory: '/proc/kmo-fleet'": Python's repr of the error, the path
    twice and no reason a user can act on."""
    folder = str(fleet / "benchmark=faux" / "collection_id=c1")
    line = one_error_line(run("push", folder, "/proc/kmo-fleet"))
    assert line == "error: cannot reach /proc/kmo-fleet: no file can be made in /proc", line


def test_a_push_line_gives_the_size_in_a_unit_that_shows_it() -> None:
    """A small collection's push said "0.0 MiB": its size is given in the unit that
    shows it, KiB to GiB, as the other sizes kernmlops prints."""
    from kernmlops.fleet.push import PushResult

    def line(size: int) -> str:
        return PushResult("c1", "faux", "/d/c1", copied=["a", "b"], copied_bytes=size).line()

    assert line(37_863) == "c1: 2 files, 37.0 KiB -> /d/c1"
    assert line(3_555_938) == "c1: 2 files, 3.4 MiB -> /d/c1"
    assert line(512) == "c1: 2 files, 512 B -> /d/c1"


def test_a_collection_named_by_its_manifest_is_pushed_and_a_file_is_not_a_folder(
    tmp_path: Path,
) -> None:
    """read_collection and graph take a collection's manifest.json for the collection;
    push said 'no such folder' of it (of any file), which is there."""
    folder = make_collection(tmp_path / "data", "m1", quanta=50)
    dest = tmp_path / "fleet"
    pushed = run("push", str(folder / "manifest.json"), str(dest), "--no-progress")
    assert pushed.exit_code == 0, pushed.output
    copied = dest / "benchmark=faux" / "collection_id=m1"
    assert source_rows(copied) == source_rows(folder) and (copied / "manifest.json").is_file()
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    line = one_error_line(run("push", str(notes), str(dest), "--no-progress"))
    assert line == f"error: {notes}: not a folder (a collection is a folder)"
    line = one_error_line(run("push", str(tmp_path / "gone"), str(dest), "--no-progress"))
    assert line == f"error: {tmp_path / 'gone'}: no such folder"
