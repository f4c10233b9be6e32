"""Fault injection: run ``kernmlops collect`` as users do, and break it.

Every test checks the same promises: no process of the benchmark is left, no BPF program
or link of the collector is left, every table that was flushed is readable (by
read_collection, polars and DuckDB), and what a kill lost is at most one flush interval.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: the flush interval of every fault test (s): the bound on what a kill may lose
FLUSH_S = 1.0
#: rows also wait in the rings up to a batch (hooks' batch_ms, 250 ms) before a flush
#: takes them, and the writer needs a moment to finish the parts
SLACK_S = 0.5


def bpf_ids() -> tuple[set[int], set[int]]:
    """Ids of every BPF program and link on the machine."""
    ids = []
    for kind in ("prog", "link"):
        for attempt in range(5):
            # bpftool fails (255) when a link it listed is freed before it opens it: a
            # killed collector's links go asynchronously
            run = subprocess.run(["bpftool", "-j", kind, "show"], capture_output=True, text=True)
            if run.returncode == 0 or attempt == 4:
                run.check_returncode()
                break
            time.sleep(0.2)
        ids.append({entry["id"] for entry in json.loads(run.stdout or "[]")})
    return ids[0], ids[1]


def pids_matching(marker: str) -> list[int]:
    """Processes whose environment holds ``marker`` (the benchmark's, whatever they
    exec or however they detach; this test's own excluded)."""
    needle = f"KMO_FAULT_MARKER={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def wait_until(check, timeout_s: float = 5.0, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step_s)
    return bool(check())


def now_us() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


@dataclass
class Run:
    """One ``kernmlops collect`` started by a test."""

    proc: subprocess.Popen[str]
    out: Path
    marker: str
    stderr_lines: list[str] = field(default_factory=list)

    def wait_for(self, text: str, timeout_s: float = 60) -> None:
        """Read stderr until a line holds ``text``."""
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise AssertionError(f"collect ended before {text!r}: {self.stderr_lines}")
            self.stderr_lines.append(line)
            if text in line:
                return
        raise AssertionError(f"no {text!r} in {timeout_s} s: {self.stderr_lines}")

    def finish(self, timeout_s: float = 60) -> tuple[int, str]:
        _, rest = self.proc.communicate(timeout=timeout_s)
        return self.proc.returncode, "".join(self.stderr_lines) + (rest or "")

    def collection(self) -> Path:
        found = list(self.out.glob("curated/benchmark=*/collection_id=*"))
        assert len(found) == 1, found
        return found[0]


def start_collect(out: Path, *args: str, env: dict[str, str] | None = None,
                  preexec: list[str] | None = None, more_config: str = "") -> Run:  # fmt: skip
    """``kernmlops collect -o OUT ARGS`` with a 1 s flush interval (and ``more_config``,
    YAML). Every process it starts has KMO_FAULT_MARKER=<a unique word> in its
    environment (see pids_matching); the benchmark's command line may use $MARKER."""
    marker = f"kmofault{uuid.uuid4().hex[:10]}"
    _MARKERS.add(marker)
    config = Path(tempfile.gettempdir()) / f"{marker}.yaml"
    _CONFIGS.append(config)
    config.write_text(
        f"collector:\n  flush_interval_s: {FLUSH_S}\n  min_free_mb: 1\n  warn_free_mb: 0\n"
        + more_config
    )
    argv = [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-c", str(config),
            "-o", str(out), *(a.replace("$MARKER", marker) for a in args)]  # fmt: skip
    proc = subprocess.Popen(
        [*(preexec or []), *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "400", "KMO_FAULT_MARKER": marker, **(env or {})},
    )
    return Run(proc, out, marker)


#: the markers of every collect this test process started (see start_collect)
_MARKERS: set[str] = set()
#: their configuration files, removed once the run's tests are done
_CONFIGS: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _remove_configs() -> Iterator[None]:
    """The configs start_collect wrote: a collect may read its own until it ends (a
    test may leave one running to its teardown), so they go at the session's end."""
    yield
    for config in _CONFIGS:
        config.unlink(missing_ok=True)


def _held_by_others() -> tuple[set[int], set[int]]:
    """Ids of BPF programs and links that a live process other than this test's
    (neither its descendant nor carrying a marker it gave) holds open: another
    user's tools, or another test run on the same machine. Read from each open
    descriptor's fdinfo (prog_id:, link_id:)."""
    mine = {f"KMO_FAULT_MARKER={m}".encode() for m in _MARKERS}
    progs: set[int] = set()
    links: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or _ours(int(entry.name), mine):
            continue
        try:
            infos = list((entry / "fdinfo").iterdir())
        except OSError:
            continue
        for info in infos:
            try:
                text = info.read_text()
            except OSError:
                continue
            for line in text.splitlines():  # a link's fdinfo names its program too
                key, _, value = line.partition(":")
                if key in ("prog_id", "link_id"):
                    (progs if key == "prog_id" else links).add(int(value))
    return progs, links


def _ours(pid: int, markers: set[bytes]) -> bool:
    """pid is this test process, a descendant of it, or a process of a collect it
    started (however it detached)."""
    try:
        if markers and markers & set(
            (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        ):
            return True
        while pid > 1:
            if pid == os.getpid():
                return True
            stat = (Path("/proc") / str(pid) / "stat").read_text()
            pid = int(stat.rpartition(")")[2].split()[1])  # the parent's pid
    except (OSError, ValueError, IndexError):
        return False
    return False


@pytest.fixture
def bpf_baseline() -> Iterator[tuple[set[int], set[int]]]:
    """The BPF programs and links before the test; none of the collector's may remain
    (ids that only another user's live process holds are not the collector's)."""
    if shutil.which("bpftool") is None:
        pytest.fail("bpftool is needed to check that no BPF program is left")
    before = bpf_ids()
    yield before
    progs, links = before

    def left() -> tuple[set[int], set[int]]:
        now_progs, now_links = bpf_ids()
        new_progs, new_links = now_progs - progs, now_links - links
        if new_progs or new_links:
            other_progs, other_links = _held_by_others()
            new_progs, new_links = new_progs - other_progs, new_links - other_links
        return new_progs, new_links

    # Programs are freed after their last fd closes (RCU): give it a moment.
    assert wait_until(lambda: left() == (set(), set()), 10), f"BPF left behind: {left()}"


def assert_no_benchmark_left(marker: str) -> None:
    assert wait_until(lambda: not pids_matching(marker), 10), (
        f"benchmark processes left: {pids_matching(marker)}"
    )


def read_everything(collection: Path) -> dict[str, int]:
    """Read every table three ways; rows per table (the same for each reader)."""
    import duckdb
    import polars as pl

    from kernmlops.data import read_collection

    with warnings.catch_warnings():  # an incomplete collection is read with a warning
        warnings.simplefilter("ignore")
        col = read_collection(collection)
    rows = {name: frame.height for name, frame in col.tables.items()}
    root = collection.parent.parent
    for table, n in rows.items():
        parts = sorted((collection / table).glob("part-*.parquet"))
        assert pl.scan_parquet(parts).select(pl.len()).collect().item() == n
        glob = f"{root}/benchmark=*/collection_id=*/{table}/*.parquet"
        got = duckdb.sql(
            f"select count(*) from read_parquet('{glob}', hive_partitioning=true) "
            f"where collection_id = '{col.collection_id}'"
        ).fetchall()[0][0]
        assert got == n, (table, got, n)
    return rows


def parquet_rows(collection: Path) -> dict[str, int]:
    """Rows per table of the part files on disk, from their footers (pyarrow alone:
    nothing of kernmlops), for tables with at least one part."""
    import pyarrow.parquet as pq

    rows: dict[str, int] = {}
    for part in sorted(collection.glob("*/part-*.parquet")):
        table = part.parent.name
        rows[table] = rows.get(table, 0) + pq.ParquetFile(part).metadata.num_rows
    return rows


def assert_recovered_manifest(collection: Path, recovered_from: str) -> dict[str, int]:
    """After ``recover``: the manifest counts, per table and per hook, the rows the
    parts hold; its state is ``recovered``, from ``recovered_from``, with nothing
    telling the user to recover; every reader takes it as complete. The rows."""
    from kernmlops.collect.manifest import read_manifest
    from kernmlops.data import list_collections, read_collection
    from kernmlops.fleet.push import check_publishable

    on_disk = parquet_rows(collection)
    manifest = read_manifest(collection)
    assert manifest.state == "recovered" and manifest.complete, manifest.state
    assert manifest.recovery is not None
    assert manifest.recovery.recovered_from == recovered_from
    assert manifest.recovery.recovered_at and manifest.recovery.kernmlops
    assert not manifest.error  # the original one is kept in recovery.error
    tables = {t: r.rows for t, r in manifest.tables.items() if r.rows or t in on_disk}
    assert tables == on_disk
    for name, hook in manifest.hooks.items():
        for table, n in hook.rows.items():
            assert n == on_disk.get(table, 0), (name, table, n, on_disk.get(table, 0))
    assert all(n <= on_disk[t] for t, n in manifest.recovery.rows_added.items())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no IncompleteCollectionWarning
        read_collection(collection)
    listed = list_collections(collection)
    assert listed["state"].to_list() == ["recovered"]
    check_publishable(collection)  # push takes it as it is
    return on_disk


def recover(collection: Path) -> str:
    """``kernmlops recover COLLECTION`` (what a user runs after a kill); its output."""
    out = subprocess.run(
        [sys.executable, "-m", "kernmlops", "recover", str(collection)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    return out.stdout + out.stderr  # its messages go to stderr, as every command's


#: how long a test waits for what it checks once the probes are attached (flushes
#: counted, records spooled), less than a storm's 60 s: the first flush waits for the
#: decoding libraries' import, and a loaded machine makes that and the storm slow
EVENT_WAIT_S = 45.0


def wait_for_flushes(run: Run, count: int, timeout_s: float = EVENT_WAIT_S) -> int:
    """Wait until the running manifest counts ``count`` flushes (or the collector
    ended, or ``timeout_s`` passed); the flushes it counts then. A flush's count is
    written once its parts are finished; the loop notes the spool's sizes just after
    asking for a flush, so every flush before the last counted one has noted them."""
    manifest = run.collection() / "manifest.json"  # written before the probes attach

    def counted() -> int:
        return json.loads(manifest.read_text()).get("flushes", 0)  # replaced whole

    wait_until(lambda: run.proc.poll() is not None or counted() >= count, timeout_s, 0.05)
    return counted()


def kill_collector(run: Run) -> int:
    """SIGKILL the collector; the kill time on CLOCK_MONOTONIC (µs)."""
    at = now_us()
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait(timeout=30)
    return at
