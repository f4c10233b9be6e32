"""Session through the library API (what a notebook calls), on the real kernel."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from kernmlops.collect.attach import StrictError
from kernmlops.collect.manifest import Manifest
from kernmlops.collect.participants import Participant
from kernmlops.collect.session import Session
from kernmlops.collect.sinks import MemorySink
from kernmlops.config import load_config
from kernmlops.data import read_collection
from kernmlops.ebpf.build import build
from kernmlops.hooks.base import Hook, HookContext, HookOptions
from kernmlops.hooks.process_trace import ProcessTraceHook

pytestmark = pytest.mark.bpf


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    build()


def _config(tmp_path: Path, **collector: object) -> object:
    return load_config(
        {
            "collector": {"output_dir": str(tmp_path), "progress": False, **collector},
            "benchmark": {"name": "faux", "duration_s": 0.5},
        }
    )


def test_faux_session_into_memory(tmp_path: Path) -> None:
    sink = MemorySink()
    seen: list[float] = []
    session = Session(_config(tmp_path), sink=sink, on_progress=lambda p: seen.append(p.elapsed_s))
    result = session.run()
    assert result.ended_by == "duration" and result.exit_code == 0
    assert 0.5 <= result.duration_s < 5
    assert result.attach_s < 2
    quanta = sink.table("quanta_runtime")
    assert quanta.height > 0
    assert quanta["cpu"].max() < 64
    assert sink.table("system_info").height == 1
    assert result.rows["quanta_runtime"] == quanta.height
    assert seen and seen == sorted(seen)
    assert not session.path.exists()  # memory sink: nothing on disk


def test_a_callers_sink_is_written_by_the_writer_thread(tmp_path: Path) -> None:
    """The loop and the stop hand rows to the writer thread whatever the sink, so a
    caller's sink (these tests') sees the path a collection to disk takes."""
    import threading

    writers: set[str] = set()

    class Watched(MemorySink):
        def write(self, table: str, frame: object) -> None:
            writers.add(threading.current_thread().name)
            super().write(table, frame)  # type: ignore[arg-type]

    sink = Watched()
    result = Session(_config(tmp_path), sink=sink).run()
    assert result.exit_code == 0 and sink.table("quanta_runtime").height > 0
    assert writers == {"kernmlops-sink"}
    assert sink.closed


def test_a_benchmarks_output_is_parsed_into_memory_and_left_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the caller's sink nothing goes on disk: hackbench's output is captured in
    root's folder around the benchmark's (not the collection's), parsed into the
    sink's benchmark_result (its messages: the options' product), and removed."""
    import stat
    import tempfile

    from kernmlops.benchmarks.base import BenchmarkRun
    from kernmlops.benchmarks.hackbench import HackbenchBenchmark

    config = load_config({
        "collector": {"output_dir": str(tmp_path), "progress": False,
                      "hooks": ["process_trace"]},
        "benchmark": {"name": "hackbench",
                      "hackbench": {"groups": 1, "fds": 2, "loops": 50}},
    })  # fmt: skip
    sink = MemorySink()
    session = Session(config, sink=sink)
    modes: dict[str, int] = {}
    folders: list[Path] = []
    printed: list[str] = []
    real_results = HackbenchBenchmark.results

    def results(self: HackbenchBenchmark, run: BenchmarkRun) -> pl.DataFrame | None:
        assert run.stdout_path is not None
        folders.append(run.stdout_path.parent)
        found = run.stdout_path.parent.iterdir()
        modes.update({p.name: stat.S_IMODE(p.stat().st_mode) for p in found})
        printed.append(run.stdout_path.read_text())
        return real_results(self, run)

    monkeypatch.setattr(HackbenchBenchmark, "results", results)
    result = session.run()
    # root's alone: in /tmp, where other users see the folder's name
    assert modes == {"stdout.txt": 0o600, "stderr.txt": 0o600, "work": 0o700}, modes
    assert result.exit_code == 0
    rows = dict(sink.table("benchmark_result").select("metric", "value").iter_rows())
    assert rows["messages"] == 1 * 2 * 2 * 50
    # hackbench's own "Time: S" (0.000 on a fast machine: 200 messages)
    (time_s,) = re.findall(r"^Time: ([0-9.]+)$", printed[0], re.MULTILINE)
    assert rows["time_s"] == float(time_s)
    assert not session.path.exists()
    # the benchmark's own folder in /tmp is gone (other runs' may come and go meanwhile)
    assert [f.parent for f in folders] == [Path(tempfile.gettempdir())]
    assert folders[0].name.startswith("kernmlops-bench-") and not folders[0].exists()


def test_unattachable_hook_is_reported_and_others_run(tmp_path: Path) -> None:
    empty = tmp_path / "no-objects"
    empty.mkdir()
    config = _config(tmp_path, hooks=["quanta_runtime", "memory_usage"])
    result = Session(config, bpf_dir=empty).run()
    hook = result.hooks["quanta_runtime"]
    assert not hook.attached and "not found" in (hook.reason or "")
    assert result.hooks["memory_usage"].attached
    col = read_collection(result.path)
    assert col.manifest["hooks"]["quanta_runtime"]["reason"] == hook.reason
    assert col["memory_usage"].height >= 1


def test_strict_turns_a_missed_attach_into_an_error_and_keeps_data(tmp_path: Path) -> None:
    empty = tmp_path / "no-objects"
    empty.mkdir()
    config = _config(tmp_path, hooks=["memory_usage", "quanta_runtime"], strict=True)
    session = Session(config, bpf_dir=empty)
    with pytest.raises(StrictError, match="quanta_runtime"):
        session.run()
    manifest = read_collection(session.path).manifest if session.path.exists() else None
    # Nothing was collected yet, but the manifest says what happened.
    assert manifest is None or manifest["ended_by"] == "error"


def test_a_hook_failing_at_the_end_loses_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import warnings

    from kernmlops.collect import session as session_mod
    from tests.e2e.conftest import kernel_objects, wait_released

    class Broken(Hook):
        name = "memory_usage"
        tables = ("memory_usage",)

        def start(self, ctx: HookContext) -> None:
            self.status.attached = True

        def poll(self):  # type: ignore[no-untyped-def]
            yield "memory_usage", pl.DataFrame({"x": [1]})

        def stop(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("decoder exploded")

    real = session_mod.get_hook
    monkeypatch.setattr(
        session_mod, "get_hook", lambda n: Broken if n == "memory_usage" else real(n)
    )
    before = kernel_objects()
    said: list[str] = []
    session = Session(_config(tmp_path, hooks=["memory_usage", "quanta_runtime"]),
                      on_message=said.append)  # fmt: skip
    result = session.run()  # a bug in one hook: that hook failed, not the collection
    assert result.ended_by == "duration" and result.exit_code == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no IncompleteCollectionWarning: no row in a spool
        col = read_collection(session.path)
    assert col.manifest["ended_by"] == "duration" and col.manifest["error"] is None
    record = col.manifest.hooks["memory_usage"]
    assert record.failed
    assert record.reason == "at the stop, its final drain raised RuntimeError: decoder exploded"
    assert [m for m in said if "memory_usage" in m] == [
        "hook memory_usage failed at the stop (its final drain raised RuntimeError: decoder "
        "exploded): the other hooks' rows are kept; the collection exits with 1"
    ]
    assert col["quanta_runtime"].height > 0  # drained after the broken hook failed
    assert not col.manifest.hooks["quanta_runtime"].failed
    assert col["memory_usage"]["x"].to_list()[0] == 1
    assert not any(wait_released(before).values())


def test_nice_applies_to_the_collector_not_the_benchmark(tmp_path: Path) -> None:
    import os

    config = load_config(
        {
            "collector": {"output_dir": str(tmp_path), "progress": False, "nice": -5,
                          "hooks": ["process_trace"]},
            "benchmark": {"name": "command", "command": {"argv": [
                "sh", "-c", f"cut -d' ' -f19 /proc/self/stat > {tmp_path}/nice"]}},
        }
    )  # fmt: skip
    from kernmlops.host.cpus import autogroup_nice

    own, own_group = os.getpriority(os.PRIO_PROCESS, 0), autogroup_nice()
    seen: list[tuple[int, int | None]] = []
    session = Session(
        config,
        on_attached=lambda _: seen.append((os.getpriority(os.PRIO_PROCESS, 0), autogroup_nice())),
    )
    assert session.run().exit_code == 0
    # The collector while it runs, and its session where autogroups weigh sessions
    # (the benchmark is a session of its own).
    assert seen == [(-5, -5 if own_group is not None else None)]
    assert int((tmp_path / "nice").read_text()) == own  # the benchmark's child
    assert os.getpriority(os.PRIO_PROCESS, 0) == own  # restored
    assert autogroup_nice() == own_group


def test_gate_works_whatever_the_fd_numbers() -> None:
    """The gate must not depend on the pipe's fd number (dash takes only 0-9)."""
    import os

    from kernmlops.benchmarks.base import Launch
    from kernmlops.collect.gated import GatedProcess

    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(20)]  # push fds past 9
    try:
        proc = GatedProcess(Launch(["sh", "-c", "read x || true; exit 4"]))
        proc.release()
        assert proc.proc.wait(timeout=10) == 4  # and its stdin was /dev/null (EOF)
        proc.reap_group()
    finally:
        for fd in held:
            os.close(fd)


def test_probes_attach_before_heavy_libraries_load_and_polars_never_does(tmp_path: Path) -> None:
    # A fresh interpreter runs the default hooks; when every probe is attached
    # (on_attached), none of the libraries that only decode and write rows is
    # loaded yet. The collection then has its rows all the same.
    code = f"""
import json, sys
from kernmlops.collect.session import Session
from kernmlops.config import load_config
HEAVY = ("numpy", "polars", "pyarrow", "elftools", "yaml", "rich")
seen = {{}}
def on_attached(statuses):
    seen["loaded"] = [m for m in HEAVY if m in sys.modules]
    seen["attached"] = sorted(n for n, s in statuses.items() if s.attached)
cfg = load_config(flags={{"benchmark.name": "faux", "benchmark.duration_s": 0.5,
                          "collector.output_dir": {str(tmp_path)!r}}})
result = Session(cfg, on_attached=on_attached).run()
seen["after_run"] = [m for m in ("polars", "pyarrow") if m in sys.modules]
from kernmlops.data import read_collection
seen["rows"] = read_collection(result.path)["quanta_runtime"].height
print(json.dumps(seen))
"""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["attached"] == ["memory_usage", "process_trace", "quanta_runtime", "system_info"]
    assert seen["loaded"] == []
    # The default hooks hand over Arrow tables: the whole collection ran without
    # polars (the analysis side's library), which read_collection then loads.
    assert seen["after_run"] == ["pyarrow"]
    assert seen["rows"] > 0


#: the longest the writer of :func:`_stalled_writer_run` stalls (it waits for less).
#: Where the loop spills, a stall this long once lost records: a round whose rows
#: passed the sink queue's room waited for the writer (the loop spills only from its
#: next round on) for the whole stall, which its 64 MiB ring outlasted for 3 s of
#: storm, not for 10 (2 runs of 3). Such rows are now queued past the bound.
STALL_MAX_S = 10.0


def _stalled_writer_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spill: bool, spool: bool = False
) -> dict:
    """A system-wide quanta_runtime collection under a switch storm whose writer
    stalls in its first fsync, with a 64 MiB ring when the loop spills (a 4 MiB one
    overflowed on a loaded 2-vCPU runner while the loop waited for CPU, not for the
    writer), a 1 MiB one when it blocks; a 4 MiB sink queue, 256 KiB when it blocks.
    The stall lasts until what each test checks has come about (at most STALL_MAX_S;
    a fixed 3 s before): when it blocks, the ring
    dropped records; else the hook took over 100,000 records and, with the sink's
    queue full, kept more than the blocked run's 1 MiB ring in memory (spill) or in
    its spool (spool) instead of waiting. The collection ends with the stall."""
    import shutil
    import subprocess
    import time

    import kernmlops.collect.loop as loop
    import kernmlops.collect.partfiles as partfiles
    import kernmlops.collect.sinks as sinks
    from kernmlops.hooks.quanta_runtime import QuantaRuntimeHook

    assert shutil.which("stress-ng"), "stress-ng missing: apt-get install stress-ng"
    hooks: list[QuantaRuntimeHook] = []
    real_start = QuantaRuntimeHook.start

    def start(self: QuantaRuntimeHook, ctx: HookContext) -> None:
        hooks.append(self)
        real_start(self, ctx)

    monkeypatch.setattr(QuantaRuntimeHook, "start", start)

    def stalled_enough() -> bool:
        (hook,) = hooks
        if not (spill or spool):
            return hook.drops() > 0
        held = hook.spilled_bytes() if spill else hook.spooled_bytes()
        return hook.status.events > 100_000 and held > 1 << 20

    over = tmp_path.with_name(f"{tmp_path.name}.stall-over")  # the benchmark ends then
    real_fsync, stalled = partfiles.fsync_path, []

    def slow_fsync(path: Path) -> None:
        if not stalled:
            stalled.append(path)
            # a slow disk under load (seen 0.2-1.0 s on this VM), as long as it takes
            deadline = time.monotonic() + STALL_MAX_S
            while not stalled_enough() and time.monotonic() < deadline:
                time.sleep(0.01)
            stalled.append(stalled_enough())  # its event came, not the deadline
            over.touch()
        real_fsync(path)

    monkeypatch.setattr(partfiles, "fsync_path", slow_fsync)
    real_init = sinks.ThreadedSink.__init__
    # blocked: a queue the first rows fill, so the loop waits out the whole stall (a
    # 4 MiB one took in ~1.7 s of a slow storm's rows, and its ring then held the rest)
    queued = 4 << 20 if spill or spool else 256 << 10
    monkeypatch.setattr(
        sinks.ThreadedSink,
        "__init__",
        lambda self, inner, **_: real_init(self, inner, max_queued_bytes=queued),
    )
    if not spill:
        monkeypatch.setattr(loop, "MAX_SPILLED_BYTES", 0)
    flag = shlex.quote(str(over))
    waits = f"i=0; while [ ! -e {flag} ] && [ $i -lt 1500 ]; do sleep 0.01; i=$((i+1)); done"
    cfg = load_config(
        {
            "collector": {"output_dir": str(tmp_path), "progress": False,
                          "hooks": ["quanta_runtime"], "flush_interval_s": 0.5,
                          "spool": spool, "filter": "system",  # the storm runs apart
                          # rows made from the spool during the stall, whatever else
                          # keeps the CPUs busy (on a busy machine they waited for the
                          # stop, and the stall for its deadline)
                          "spool_spare_cpus": 0},
            # spilling: a ring that also rides out the storm's other stalls (the loop
            # waits for CPU under the storm); blocked: one the stall overflows
            # (16 MiB, then 4 MiB held the whole stall on hosts where the storm ran
            # at ~100k switches/s: no drops to see; 1 MiB is ~0.3 s of that)
            "hooks": {"quanta_runtime": {"ring_kib": 65536 if spill else 1024,
                                         "batch_ms": 0}},
            "benchmark": {"name": "command", "command": {"argv": ["sh", "-c", waits]}},
        }
    )  # fmt: skip
    storm = subprocess.Popen(["stress-ng", "--switch", "1", "-t", "30"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        result = Session(cfg).run()
    finally:
        storm.terminate()  # what it was for is over: no waiting out its -t
        storm.wait(timeout=30)
    assert stalled, "the writer never synced a part"
    status = result.hooks["quanta_runtime"]
    return {"drops": status.drops, "events": status.events, "rows": result.rows,
            "event_came": stalled[1]}  # fmt: skip


def test_a_stalled_writer_loses_nothing_the_loop_spills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = _stalled_writer_run(tmp_path / "spill", monkeypatch, spill=True)
    # the loop spilled while the writer stalled: it never waited for it with rows in hand
    assert got["event_came"], got
    assert got["events"] > 100_000
    assert got["drops"] == 0
    rows = got["rows"]
    assert rows["quanta_runtime"] + rows["quanta_queued_time"] >= got["events"]
    # The same stall with spilling off: the loop blocks on the sink, the ring overflows.
    monkeypatch.undo()
    blocked = _stalled_writer_run(tmp_path / "block", monkeypatch, spill=False)
    assert blocked["drops"] > 0, blocked


def test_a_stalled_writer_loses_nothing_when_the_rings_are_spooled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loop never waits for the sink with rows in hand: rings go to the spool (on
    # disk, not in memory), rows are made when the writer takes them again.
    monkeypatch.setattr("kernmlops.collect.loop.MAX_SPILLED_BYTES", 0)
    got = _stalled_writer_run(tmp_path, monkeypatch, spill=False, spool=True)
    assert got["event_came"], got
    assert got["events"] > 100_000
    assert got["drops"] == 0
    rows = got["rows"]
    assert rows["quanta_runtime"] + rows["quanta_queued_time"] >= got["events"]
    assert not (tmp_path / "curated").exists() or not list(tmp_path.rglob(".spool"))


def test_a_collection_is_compacted_at_stop_and_the_manifest_says_so(tmp_path: Path) -> None:
    # rows made during the run whatever the machine's load (spare CPU 0): parts at each
    # flush, for compaction to join (on a busy machine all rows were made at the stop,
    # in one part compact already)
    cfg = _config(tmp_path, hooks=["quanta_runtime"], flush_interval_s=0.2, spool_spare_cpus=0)
    cfg.benchmark.duration_s = 1.5
    result = Session(cfg).run()
    c = read_collection(result.path)
    record = c.manifest.tables["quanta_runtime"]
    assert record.compaction == "compacted"
    assert record.files == ["quanta_runtime/part-00000.parquet"]
    assert sorted(p.name for p in (result.path / "quanta_runtime").iterdir()) == [
        "part-00000.parquet"
    ]
    assert c["quanta_runtime"].height == result.rows["quanta_runtime"] > 0
    # it was flushed into parts first, several (7 flushes due in the 1.5 s; a loaded
    # machine's start takes some of them)
    assert c.manifest.flushes >= 2
    assert not [p for p in result.path.iterdir() if p.name.startswith(".compact")]
    # The run's parts were plain (fast_parts); the compacted file is zstd.
    meta = pq.ParquetFile(result.path / "quanta_runtime" / "part-00000.parquet").metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"


def test_compaction_can_be_turned_off(tmp_path: Path) -> None:
    # spool off: rows reach parts at every flush even when the machine has no CPU to spare
    cfg = _config(
        tmp_path, hooks=["quanta_runtime"], flush_interval_s=0.2, compact=False, spool=False
    )
    cfg.benchmark.duration_s = 1.0
    result = Session(cfg).run()
    record = read_collection(result.path).manifest.tables["quanta_runtime"]
    assert record.compaction is None
    assert len(record.files) >= 3
    # Nothing rewrites them: the run's parts are written compactly themselves.
    meta = pq.ParquetFile(result.path / record.files[0]).metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"


class _CountingHook(Hook[HookOptions]):
    """A hook a caller hands the session: one row per poll, numbered."""

    name = "caller_hook"
    tables = ("caller_rows",)

    def __init__(self) -> None:
        super().__init__()
        self.polls = 0
        self.ctx: HookContext | None = None

    def start(self, ctx: HookContext) -> None:
        self.ctx = ctx
        self.status.attached = True

    def poll(self) -> Iterator[tuple[str, pl.DataFrame]]:
        self.polls += 1
        self.status.events += 1
        yield "caller_rows", pl.DataFrame({"poll": [self.polls]})


class _Recorder(Participant):
    def __init__(self, hook: _CountingHook) -> None:
        self.hook = hook
        self.calls: list[str] = []

    def start(self, ctx: HookContext) -> None:
        # after every hook started, with the same context
        assert self.hook.ctx is ctx
        self.calls.append("start")

    def close(self) -> None:
        self.calls.append("close")

    def contribute(self, manifest: Manifest, path: Path) -> None:
        # the tables are final and on disk when the manifest is finalised
        rows = manifest.tables["caller_rows"].rows
        assert pl.read_parquet(path / "caller_rows").height == rows
        manifest.caller = {"rows": rows}  # type: ignore[attr-defined]
        self.calls.append("contribute")


def test_caller_hooks_and_participants_are_ordinary_participants(tmp_path: Path) -> None:
    hook = _CountingHook()
    recorder = _Recorder(hook)
    config = _config(tmp_path, hooks=["memory_usage"])
    result = Session(config, hooks=[hook], participants=[recorder]).run()
    assert recorder.calls == ["start", "close", "contribute"]
    # drained by the session's loop into its sink, every poll's row kept
    assert result.rows["caller_rows"] == hook.polls > 1
    col = read_collection(result.path)
    assert col["caller_rows"]["poll"].to_list() == list(range(1, hook.polls + 1))
    assert col.manifest.hooks["caller_hook"].events == hook.polls
    assert col.manifest["caller"] == {"rows": hook.polls}
    assert col.manifest.state == "duration"


class _FailingHook(_CountingHook):
    """A hook with a bug: its poll raises once it has given ``after`` rows."""

    name = "failing_hook"
    tables = ("failing_rows",)

    def __init__(self, after: int, other: _CountingHook) -> None:
        super().__init__()
        self.after = after
        self.other = other
        #: the other hook's polls when this one was closed
        self.closed_at: int | None = None

    def poll(self) -> Iterator[tuple[str, pl.DataFrame]]:
        self.polls += 1
        if self.polls > self.after:
            raise RuntimeError("decoder bug")
        self.status.events += 1
        yield "failing_rows", pl.DataFrame({"poll": [self.polls]})

    def close(self) -> None:
        if self.closed_at is None:
            self.closed_at = self.other.polls


def test_a_hook_whose_poll_fails_is_detached_and_the_others_go_on(tmp_path: Path) -> None:
    other = _CountingHook()
    failing = _FailingHook(2, other)
    said: list[str] = []
    config = _config(tmp_path, hooks=["memory_usage"])
    result = Session(config, hooks=[other, failing], on_message=said.append).run()
    # the benchmark ran its course; the collection is not clean
    assert result.ended_by == "duration" and result.exit_code == 1
    assert failing.polls == 3  # never polled again
    assert failing.closed_at is not None and other.polls > failing.closed_at  # closed at once
    col = read_collection(result.path)
    assert col["failing_rows"]["poll"].to_list() == [1, 2]  # its rows before the failure
    assert col["caller_rows"]["poll"].to_list() == list(range(1, other.polls + 1))
    assert col["memory_usage"].height >= 1
    record = col.manifest.hooks["failing_hook"]
    assert record.failed and record.events == 2
    assert record.reason == (
        "its poll raised RuntimeError: decoder bug; detached, the other hooks went on"
    )
    assert not col.manifest.hooks["caller_hook"].failed
    assert col.manifest.state == "duration" and col.manifest.exit_code == 1
    assert [m for m in said if "failing_hook" in m] == [
        "hook failing_hook failed (its poll raised RuntimeError: decoder bug): detached; the "
        "collection goes on without it and exits with 1"
    ]


def test_a_bpf_hook_whose_poll_fails_has_its_programs_detached_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernmlops.collect import session as session_mod
    from kernmlops.hooks.quanta_runtime import QuantaRuntimeHook
    from tests.e2e.conftest import kernel_objects, wait_released

    class Failing(QuantaRuntimeHook):
        polls = 0

        def poll(self):  # type: ignore[no-untyped-def]
            self.polls += 1
            if self.polls > 3:
                raise RuntimeError("decoder bug")
            yield from super().poll()

    real = session_mod.get_hook
    monkeypatch.setattr(
        session_mod, "get_hook", lambda n: Failing if n == "quanta_runtime" else real(n)
    )
    before = kernel_objects()
    left_when_said: list[dict[str, set[int]]] = []

    def said(line: str) -> None:
        if "quanta_runtime failed" in line:  # the collection still runs
            left_when_said.append(wait_released(before))

    config = _config(tmp_path, hooks=["quanta_runtime", "memory_usage"])
    result = Session(config, on_message=said).run()
    assert result.ended_by == "duration" and result.exit_code == 1
    assert left_when_said == [{"prog": set(), "link": set()}]  # its programs gone then
    col = read_collection(result.path)
    assert col.manifest.hooks["quanta_runtime"].failed
    assert col["memory_usage"].height >= 1
    assert not any(wait_released(before).values())


_FAILING_IN_THE_CLI = """
import polars as pl
from kernmlops.collect import session
from kernmlops.hooks.base import Hook

class Failing(Hook):
    name = "memory_usage"
    tables = ("memory_usage",)
    polls = 0

    def start(self, ctx):
        self.status.attached = True

    def poll(self):
        self.polls += 1
        if self.polls > 3:
            raise RuntimeError("decoder bug")
        yield "memory_usage", pl.DataFrame({"poll": [self.polls]})

real = session.get_hook
session.get_hook = lambda name: Failing if name == "memory_usage" else real(name)
from kernmlops.cli import main
main()
"""


def test_collect_says_a_failed_hook_in_one_line_and_exits_1(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", _FAILING_IN_THE_CLI, "collect", "--no-progress", "-o", str(out),
         "-b", "faux", "-d", "1", "--hooks", "memory_usage,quanta_runtime"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    warned = [line for line in done.stderr.splitlines() if line.startswith("warning: hook")]
    assert warned == [
        "warning: hook memory_usage failed (its poll raised RuntimeError: decoder bug): "
        "detached; the collection goes on without it and exits with 1"
    ], done.stderr
    assert done.stderr.splitlines()[-1] == "exit code 1 (duration; hook memory_usage failed)"
    (folder,) = (out / "curated" / "benchmark=faux").iterdir()
    col = read_collection(folder)
    assert col["memory_usage"]["poll"].to_list() == [1, 2, 3]
    assert col["quanta_runtime"].height > 0
    assert col.manifest.hooks["memory_usage"].failed
    assert col.manifest.state == "duration" and col.manifest.exit_code == 1


def test_collect_says_the_last_lines_a_failed_benchmark_wrote_to_stderr(tmp_path: Path) -> None:
    # stress-ng refuses an option it does not know: its own words, kept in the
    # collection's benchmark_output/stderr.txt, are what collect says below the exit code
    import subprocess
    import sys

    out = tmp_path / "out"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("benchmark:\n  stress_ng:\n    extra_args: ['--no-such-option']\n")
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-o", str(out),
         "-c", str(cfg), "-b", "stress-ng", "--hooks", "system_info"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    (folder,) = (out / "curated" / "benchmark=stress-ng").iterdir()
    said = (folder / "benchmark_output" / "stderr.txt").read_text().split("\n")
    said = [line.rstrip() for line in said if line.strip()][-5:]
    assert any("--no-such-option" in line for line in said), said
    lines = done.stderr.splitlines()
    at = lines.index("exit code 1 (failed)")
    assert lines[at + 1].startswith("the benchmark's stderr ended")
    assert [line.removeprefix("  | ") for line in lines[at + 2 :]] == said


@pytest.mark.parametrize("row_workers", [1, 3])
def test_with_no_cpu_to_spare_rows_wait_in_the_spool_until_stop(
    tmp_path: Path, row_workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A machine that never has CPU to spare (spool_spare_cpus past its CPUs): during the
    # run the rings only go to the spool, no row is made; at stop every record becomes
    # a row (in the collector, or in 3 worker processes), the rows equal the records,
    # and the spool is gone.
    import os
    import subprocess
    import time

    from kernmlops.spool import jobs as spool_module

    monkeypatch.setattr(spool_module, "PIECE_RAW", 1 << 20)  # a job per worker
    cfg = _config(
        tmp_path, hooks=["quanta_runtime"], flush_interval_s=0.2,
        spool_spare_cpus=float((os.cpu_count() or 1) + 1), spool_row_workers=row_workers,
    )  # fmt: skip
    cfg.benchmark.duration_s = 2.0
    seen: list[int] = []
    said: list[str] = []
    session = Session(
        cfg, on_progress=lambda p: seen.append(p.events["quanta_runtime"]), on_message=said.append
    )
    storm = subprocess.Popen(["stress-ng", "--switch", "1", "-t", "3"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.2)
        result = session.run()
    finally:
        storm.terminate()  # what it was for is over: no waiting out its -t
        storm.wait(timeout=30)
    assert max(seen[:-1] or [0]) == 0  # no record became a row while the run went on
    status = result.hooks["quanta_runtime"]
    assert status.events > 10_000 and status.drops == 0
    rows = result.rows
    switches = rows["quanta_runtime"] + rows["quanta_queued_time"]
    assert status.events <= switches <= 2 * status.events  # each record gives 1 or 2 rows
    c = read_collection(result.path)
    assert c["quanta_runtime"].height == rows["quanta_runtime"]
    assert c["quanta_queued_time"].height == rows["quanta_queued_time"]
    assert not (result.path / ".spool").exists()
    assert not list(result.path.glob(".rows-*"))
    # the workers say so, once (the collector alone says so only past 64 MiB, which a
    # CI machine's 2-s storm passed: 76.3 MiB)
    made_on = [m for m in said if m.startswith("note: making rows from") and m.endswith(" cores")]
    assert len(made_on) == (row_workers > 1) and all(m.endswith(" on 3 cores") for m in made_on)


def _count_polls(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the time of every poll of the session's loop."""
    import time

    from kernmlops.collect import loop

    polls: list[float] = []
    real = loop._next_wake

    def counted(*args: object) -> float:
        polls.append(time.monotonic())
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "_next_wake", counted)
    return polls


def test_a_quiet_collection_polls_a_few_times_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rings that fill slowly fall due every batch_ms (250), memory_usage hands its
    # samples over every second: the loop sleeps until then, not poll_interval_ms
    # (10) or poll_max_interval_ms (100): its rings would wake it when filling.
    polls = _count_polls(monkeypatch)
    cfg = _config(tmp_path, hooks=["process_trace", "memory_usage", "system_info"])
    cfg.benchmark.duration_s = 2.0
    result = Session(cfg).run()
    assert result.rows["system_info"] == 1 and result.rows["memory_usage"] >= 10
    assert 5 <= len(polls) <= 15  # 200 at a poll every 10 ms, 20 every 100 ms
    # A hook whose programs cannot wake the loop: poll_max_interval_ms caps the sleep.
    polls.clear()
    monkeypatch.setattr(ProcessTraceHook, "wakes_at_fill", False)
    Session(cfg).run()
    assert 18 <= len(polls) <= 40
    # Every poll interval again when a hook asks for it (batch_ms 0: every poll): 50
    # polls within the run's second. The run ends at the 50th (Ctrl+C), not after it.
    import os
    import signal

    from kernmlops.collect import loop

    polls.clear()
    counted = loop._next_wake

    def stop_at_50(*args: object) -> float:
        wake = counted(*args)  # type: ignore[arg-type]
        if len(polls) == 50:
            os.kill(os.getpid(), signal.SIGINT)
        return wake

    monkeypatch.setattr(loop, "_next_wake", stop_at_50)
    cfg = load_config(
        {
            "collector": {"output_dir": str(tmp_path), "progress": False,
                          "hooks": ["process_trace"]},
            "hooks": {"process_trace": {"batch_ms": 0}},
            "benchmark": {"name": "faux", "duration_s": 1.0},
        }
    )  # fmt: skip
    Session(cfg).run()
    assert len(polls) >= 50


def test_the_benchmark_exit_wakes_a_sleeping_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing asks for a poll before the first flush (5 s): the exit itself must end it.
    polls = _count_polls(monkeypatch)
    cfg = load_config(
        {
            "collector": {"output_dir": str(tmp_path), "progress": False,
                          "hooks": ["system_info"], "poll_max_interval_ms": 10000},
            "benchmark": {"name": "command", "command": {"argv": ["sleep", "0.3"]}},
        }
    )  # fmt: skip
    result = Session(cfg).run()
    assert result.ended_by == "completed"
    assert 0.3 <= result.duration_s < 2.0
    assert len(polls) <= 5


def test_sampled_rows_go_into_the_flush_that_follows_them(tmp_path: Path) -> None:
    # memory_usage hands its samples over every 5 s by itself; each flush (every
    # second here) takes them, so none waits longer than flush_interval_s.
    cfg = _config(tmp_path, hooks=["memory_usage"], flush_interval_s=1.0, compact=False)
    cfg.benchmark.duration_s = 3.3
    result = Session(cfg).run()
    parts = sorted((result.path / "memory_usage").glob("*.parquet"))
    rows = [pq.ParquetFile(p).metadata.num_rows for p in parts]
    assert len(rows) >= 4 and sum(rows) == result.rows["memory_usage"]
    assert all(8 <= n <= 12 for n in rows[1:-1])  # a second of 10-Hz samples each


def test_a_stop_signal_wakes_a_sleeping_loop(tmp_path: Path) -> None:
    # Nothing asks for a poll before the first flush (5 s): the signal must end the sleep.
    import os
    import signal
    import threading

    cfg = load_config(
        {
            "collector": {"output_dir": str(tmp_path), "progress": False,
                          "hooks": ["system_info"]},
            "benchmark": {"name": "faux", "duration_s": 30},
        }
    )  # fmt: skip
    # started once the hooks are attached: the stop's handlers are installed by then (a
    # SIGINT before them would be a KeyboardInterrupt in the test run itself)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    try:
        result = Session(cfg, on_attached=lambda _: timer.start()).run()
    finally:
        timer.cancel()
    assert result.ended_by == "interrupted"
    assert 0.5 <= result.duration_s < 2.0


def test_ctrl_c_once_the_folder_is_made_stops_it_before_the_command_runs(
    tmp_path: Path,
) -> None:
    """A Ctrl+C right after "collecting into <folder>" (before the probes are attached)
    is a stop like any other: the collection is kept, interrupted, exit 130, and the
    command never runs. It was a KeyboardInterrupt: click's "Aborted!", exit 1, and a
    folder with no manifest."""
    import os
    import signal

    from kernmlops.collect.manifest import read_manifest

    ran = tmp_path / "ran"
    cfg = load_config(
        {
            "collector": {"output_dir": str(tmp_path / "out"), "progress": False,
                          "hooks": ["system_info"]},
            "benchmark": {"name": "command", "command": {"argv": ["touch", str(ran)]}},
        }
    )  # fmt: skip

    def ctrl_c(_folder: Path) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # handled before kill returns (this thread)

    session = Session(cfg, on_folder=ctrl_c)
    # Python's own handler, as at a terminal: a process started in the background by a
    # shell without job control (a CI runner's) inherits SIGINT ignored instead
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            result = session.run()
        except KeyboardInterrupt:
            pytest.fail("the Ctrl+C escaped the collection")
        given_back = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, outer)
    assert (result.ended_by, result.exit_code) == ("interrupted", 128 + signal.SIGINT)
    manifest = read_manifest(session.path)
    assert manifest.state == "interrupted"
    assert manifest.tables["system_info"].rows == 1
    assert not ran.exists()
    assert given_back is signal.default_int_handler


def test_the_benchmarks_setup_is_not_counted_as_the_probes_attach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """attach_s ("probes attached in") left out the benchmark's setup: linux-build's
    make defconfig (9 s) showed as "probes attached in 9215 ms". Ordering, not a
    threshold: the attach is at most the time from run() to the attach, less the
    setup, which lies between them."""
    import time

    from kernmlops.benchmarks.faux import FauxBenchmark

    spans: list[float] = []

    def slow_setup(self: object, workdir: Path) -> None:
        began = time.monotonic()
        time.sleep(2.0)
        spans.append(time.monotonic() - began)

    monkeypatch.setattr(FauxBenchmark, "setup", slow_setup)
    attached: list[float] = []
    began = time.monotonic()
    session = Session(
        _config(tmp_path, hooks=["system_info"]),
        on_attached=lambda _: attached.append(time.monotonic()),
    )
    result = session.run()
    (setup,) = spans
    assert 0 <= result.attach_s <= (attached[0] - began) - setup


def test_the_end_line_counts_the_run_from_the_benchmarks_start_not_its_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`collect -b linux-build -d 1` said "duration after 8.3 s": the collection's whole
    time, make defconfig included. The line now says the time the limit counts (run_s),
    and the setup beside it. Ordering, not a threshold: the setup lies before the
    attach, the run after it."""
    import time

    from kernmlops.benchmarks.faux import FauxBenchmark

    spans: list[float] = []

    def slow_setup(self: object, workdir: Path) -> None:
        began = time.monotonic()
        time.sleep(1.0)  # the slow setup itself (a build's configure step)
        spans.append(time.monotonic() - began)

    monkeypatch.setattr(FauxBenchmark, "setup", slow_setup)
    attached: list[float] = []
    began = time.monotonic()
    session = Session(
        _config(tmp_path, hooks=["system_info"]),  # faux, duration_s 0.5
        on_attached=lambda _: attached.append(time.monotonic()),
    )
    result = session.run()
    finished = time.monotonic()
    (setup,) = spans
    assert result.ended_by == "duration"
    assert setup <= result.setup_s <= attached[0] - began
    assert result.run_s is not None
    assert result.run_s <= finished - attached[0]  # after the attach: no setup in it
    assert result.run_s + result.setup_s <= result.duration_s
    line = result.end_line("PATH")
    assert line.startswith(f"duration after {result.run_s:.1f} s (benchmark setup "), line
    assert f"benchmark setup {result.setup_s:.1f} s, probes attached in " in line, line
    assert line.endswith(f"; {result.duration_s:.1f} s in all) -> PATH"), line


def test_a_faux_collection_of_one_tgid_ends_when_that_process_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--tgid N -b faux: once N exits nothing is left to trace, and the collection ends
    (it went on until Ctrl+C or -d, tracing nothing)."""
    import select
    import subprocess

    # the loop asks N's pidfd each tick through one poll object, made once
    made, asked = [], []
    real_poll = select.poll

    class CountedPoll:
        def __init__(self) -> None:
            made.append(self)
            self._poll = real_poll()

        def register(self, fd: int, mask: int) -> None:
            self._poll.register(fd, mask)

        def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
            asked.append(timeout)
            return self._poll.poll(timeout)

    monkeypatch.setattr(select, "poll", CountedPoll)
    traced = subprocess.Popen(["sleep", "1"])
    try:
        cfg = load_config(
            {
                "collector": {"output_dir": str(tmp_path), "progress": False,
                              "hooks": ["system_info"], "filter": "tgid", "tgid": traced.pid},
                "benchmark": {"name": "faux", "duration_s": 20},
            }
        )  # fmt: skip
        said: list[str] = []
        result = Session(cfg, on_message=said.append).run()
        assert traced.poll() is not None  # it ended because the process did
    finally:
        traced.kill()
        traced.wait()
    assert (result.ended_by, result.exit_code) == ("completed", 0)
    assert f"note: process {traced.pid} (--tgid) exited: the collection ends" in said
    assert len(made) == 1 and len(asked) > 1, (len(made), len(asked))


def test_a_burst_wakes_the_loop_before_a_small_ring_overflows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 64-KiB ring holds 1,365 process events; 600 processes make ~1,800 in about
    # 0.3 s. The hook asks for no poll before 10 s (its forecast from the fill rate
    # is switched off, so that only the wake-ups are tested): the programs' wake-ups
    # at each quarter of the ring must get it drained in time.
    from kernmlops.collect import loop
    from kernmlops.hooks.bpf import BpfHook

    monkeypatch.setattr(BpfHook, "next_poll", lambda self, now: now + 10.0)
    # The burst comes once the loop has gone to sleep for a second or more (until the
    # first flush, 5 s): before, a poll of its own could drain the ring in the middle
    # of the burst. Not a fixed time: however long the start took.
    asleep: list[Path] = []
    real_sleep = loop._sleep

    def sleep(seconds: float, waker: object) -> None:
        if seconds >= 1.0:
            asleep[-1].touch()
        real_sleep(seconds, waker)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "_sleep", sleep)

    def run(out: Path) -> Session:
        asleep.append(out.with_name(out.name + ".asleep"))
        flag = shlex.quote(str(asleep[-1]))
        burst = (
            f"i=0; while [ ! -e {flag} ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; "
            "for i in $(seq 600); do /bin/true; done"
        )  # at most ~10 s for the loop to fall asleep
        cfg = load_config(
            {
                "collector": {"output_dir": str(out), "progress": False,
                              "hooks": ["process_trace"], "poll_max_interval_ms": 10000},
                "hooks": {"process_trace": {"ring_kib": 64, "batch_ms": 10000}},
                "benchmark": {"name": "command", "command": {"argv": ["sh", "-c", burst]}},
            }
        )  # fmt: skip
        return Session(cfg).run()

    result = run(tmp_path / "woken")
    assert result.hooks["process_trace"].drops == 0
    frame = read_collection(result.path)["process_trace"]
    assert frame.filter(pl.col("comm") == "true").height >= 1200  # exec, exit of each
    # Without the wake-ups the loop sleeps through the burst (until the first flush
    # at 5 s or the benchmark's exit): the ring overflows.
    monkeypatch.setattr(ProcessTraceHook, "wakes_at_fill", False)
    assert run(tmp_path / "polled").hooks["process_trace"].drops > 0


def test_a_filling_ring_falls_due_before_its_batch_ms() -> None:
    from types import SimpleNamespace

    from kernmlops.hooks.quanta_runtime import QuantaRuntimeHook

    hook = QuantaRuntimeHook(QuantaRuntimeHook.Options(batch_ms=250))
    ring = SimpleNamespace(spilled=False, size=16 << 20, pending=0)
    ring.pending_bytes = lambda: ring.pending
    hook._rings = {"quanta_runtime": (ring, 48)}  # type: ignore[assignment]
    hook._last_drain = {"quanta_runtime": 100.0}
    assert hook.next_poll(100.05) == pytest.approx(100.25)  # empty: batch_ms
    # 2 MiB in 50 ms: a quarter (4 MiB) in another 50 ms
    ring.pending = 2 << 20
    assert hook.next_poll(100.05) == pytest.approx(100.10)
    ring.pending = 4 << 20  # a quarter: now
    assert hook.next_poll(100.05) == pytest.approx(100.05)
    ring.spilled = True
    assert hook.next_poll(100.05) is None
    # A ring its native copier moves (woken by the ring at each quarter): the loop only
    # looks at what the copier did, every batch_ms, however full the ring is. It once
    # took the fill since its own look for a ring about to overflow and polled every
    # 10 ms until the copier's next quarter: ~30 polls a second under a storm.
    ring.spilled = False
    hook._copiers = [object()]  # type: ignore[list-item]
    ring.pending = 4 << 20
    assert hook.next_poll(100.05) == pytest.approx(100.25)


class _BadWakeHook(_CountingHook):
    """A hook whose wake fd the loop cannot watch (closed before the loop starts)."""

    name = "bad_wake_hook"

    def wake_fds(self) -> tuple[int, ...]:
        import os

        r, w = os.pipe()
        os.close(r)
        os.close(w)
        return (r,)


def test_a_loop_that_cannot_start_leaves_no_fd_open(tmp_path: Path) -> None:
    # The pidfd, the stop eventfd and the epoll are closed even when watching a
    # hook's wake fd fails (EBADF) before the loop's first poll.
    import contextlib
    import os

    def open_fds() -> dict[str, str]:
        fds = {}
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(FileNotFoundError):  # the listing's own fd, closed
                fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        return fds

    before = open_fds()
    cfg = _config(tmp_path, hooks=["system_info"])
    with pytest.raises(OSError):
        Session(cfg, hooks=[_BadWakeHook()]).run()
    leaked = {fd: target for fd, target in open_fds().items() if fd not in before}
    assert not leaked
