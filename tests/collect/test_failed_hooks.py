"""A hook with a bug, in its poll or in its stop: named, the other hooks' rows kept,
its own spooled records made into rows (or kept for ``kernmlops recover``), exit 1."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kernmlops.collect.session import Session
from kernmlops.collect.tuning import DECODING_LIBRARIES
from kernmlops.config import load_config
from kernmlops.data import IncompleteCollectionWarning, read_collection
from kernmlops.ebpf.build import build
from kernmlops.hooks.bpf import BpfHook
from kernmlops.hooks.quanta_runtime import QuantaRuntimeHook
from tests.switches import spooled_switches

pytestmark = pytest.mark.bpf


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    build()


#: how long quanta_runtime's failing poll waits for its MiB of spooled records
SPOOL_WAIT_S = 60.0


def _failing_poll(again: bool) -> tuple[object, list[int]]:
    """quanta_runtime's poll with a bug: its first call polls as usual until a MiB of
    records waits in the spool (no row made of them yet; at most SPOOL_WAIT_S), then
    raises, and with ``again`` at every poll after that. The first call waits for that
    MiB within the run's poll loop: a storm slowed by a loaded machine may spool it
    only after the run's second had passed, and the loop's last poll would then find
    less (the bug came at the stop, or never)."""
    real = BpfHook.poll
    raised: list[int] = []

    def poll(self: BpfHook) -> Iterator[object]:
        if raised and not again:
            yield from real(self)
            return
        deadline = time.monotonic() + SPOOL_WAIT_S
        while not raised and self.spooled_bytes() < 1 << 20 and time.monotonic() < deadline:
            yield from real(self)  # copies the rings into the spool; no CPU spare: no rows
            time.sleep(0.01)
        raised.append(self.spooled_bytes())
        raise RuntimeError("decoder bug")

    return poll, raised


@pytest.mark.parametrize("again", [False, True], ids=["made-at-stop", "kept-for-recover"])
def test_a_failed_ring_hooks_spooled_records_are_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, again: bool
) -> None:
    # No CPU to spare (spool_spare_cpus past the machine's): the storm's switches only
    # go to the spool. The poll that raises is a bug in the hook's Python, not in the
    # spool: what was spooled when it failed becomes rows at the stop, or, where the
    # bug is there again then, stays in the spool and `kernmlops recover` makes them.
    poll, raised = _failing_poll(again)
    monkeypatch.setattr(QuantaRuntimeHook, "poll", poll)
    cfg = load_config({
        "collector": {"output_dir": str(tmp_path), "progress": False,
                      "hooks": ["quanta_runtime", "memory_usage"], "flush_interval_s": 0.5,
                      "spool_spare_cpus": float((os.cpu_count() or 1) + 1)},
        "benchmark": {"name": "faux", "duration_s": 1.0},
    })  # fmt: skip
    snapshot = tmp_path / "snapshot"
    said: list[str] = []

    def on_message(line: str) -> None:
        said.append(line)
        if "hook quanta_runtime failed" in line and not snapshot.exists():
            # the hook is detached now: its spool holds every record it will ever have
            shutil.copytree(session.path / ".spool", snapshot)  # follows `mem` (the tmpfs)

    session = Session(cfg, on_message=on_message)
    # The decoding libraries in before the run (as an earlier collection in this process
    # leaves them): while they load, the loop only spills the rings, and on a loaded
    # machine that may take the whole run, with no poll to fail in.
    for name in DECODING_LIBRARIES:
        importlib.import_module(name)
    # The storm lasts as long as the run may (it is stopped below): its MiB may come late.
    storm = subprocess.Popen(["stress-ng", "--switch", "1", "-t", "120"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        result = session.run()
    finally:
        storm.terminate()  # its switches are no longer traced
        storm.wait(timeout=30)
    assert raised and raised[0] >= 1 << 20
    spooled = spooled_switches(snapshot)
    records, expected = spooled.records, spooled.rows
    assert expected["quanta_runtime"] > 10_000  # the storm's switches, in the spool
    assert result.ended_by == "duration" and result.exit_code == 1
    status = result.hooks["quanta_runtime"]
    assert status.failed and status.reason is not None
    failed = [line for line in said if "quanta_runtime" in line]
    if not again:
        assert failed == [
            "hook quanta_runtime failed (its poll raised RuntimeError: decoder bug): detached; "
            "the collection goes on without it and exits with 1"
        ]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no IncompleteCollectionWarning: no spool left
            col = read_collection(result.path)
        rows = {t: col[t].height for t in expected}
        assert rows == expected
        assert status.rows == expected
        assert status.events == records  # its own count: every record made into rows
        assert not (result.path / ".spool").exists()
        assert col["memory_usage"].height >= 1
        return
    # the bug again at the stop: the records stay, and one line says how to get them
    assert len(failed) == 2, said
    assert failed[1].startswith(
        "hook quanta_runtime failed again at the stop (its final drain "
        "raised RuntimeError: decoder bug): its "
    )
    assert failed[1].endswith(
        f"of spooled records are kept: `kernmlops recover {result.path}` makes their rows"
    )
    assert status.reason.startswith(
        "its poll raised RuntimeError: decoder bug; detached, the other hooks went on; at "
        "the stop, its final drain raised RuntimeError: decoder bug; its "
    )
    assert status.reason.endswith("of spooled records are kept for `kernmlops recover`")
    assert (result.path / ".spool").is_dir()
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert manifest["hooks"]["quanta_runtime"]["reason"] == status.reason
    done = subprocess.run([sys.executable, "-m", "kernmlops", "recover", str(result.path)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    col = read_collection(result.path)
    assert {t: col[t].height for t in expected} == expected
    assert col.manifest.hooks["quanta_runtime"].events == records
    assert col["memory_usage"].height >= 1
    assert not (result.path / ".spool").exists()


_FAILING_AT_THE_STOP = """
import sys
import polars as pl
from kernmlops.collect import session
from kernmlops.hooks.base import Hook

WHERE = sys.argv.pop(1)  # drain or close: where the bug is

class Failing(Hook):
    name = "memory_usage"
    tables = ("memory_usage",)

    def start(self, ctx):
        self.status.attached = True

    def poll(self):
        yield "memory_usage", pl.DataFrame({"x": [1]})

    def stop(self):
        if WHERE == "drain":
            yield "memory_usage", pl.DataFrame({"x": [2]})
            raise RuntimeError("decoder exploded")
        yield from ()

    def close(self):
        if WHERE == "close":
            raise ValueError("close exploded")

real = session.get_hook
session.get_hook = lambda name: Failing if name == "memory_usage" else real(name)
from kernmlops.cli import main
main()
"""


@pytest.mark.parametrize(
    ("where", "why"),
    [("drain", "its final drain raised RuntimeError: decoder exploded"),
     ("close", "its close raised ValueError: close exploded")],
)  # fmt: skip
def test_collect_says_a_hook_failing_at_the_stop_in_one_line_and_exits_1(
    tmp_path: Path, where: str, why: str
) -> None:
    out = tmp_path / "out"
    # a few tenths of a second of the whole system: switches enough for the rows checked
    done = subprocess.run(
        [sys.executable, "-c", _FAILING_AT_THE_STOP, where, "collect", "--no-progress",
         "-o", str(out), "-b", "faux", "-d", "0.3", "--hooks", "memory_usage,quanta_runtime"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    _exits_1(
        done,
        f"warning: hook memory_usage failed at the stop ({why}): the other hooks' rows are "
        "kept; the collection exits with 1",
        "exit code 1 (duration; hook memory_usage failed)",
        pick=lambda line: line.startswith(("warning: hook", "exit code")),
    )
    (folder,) = (out / "curated" / "benchmark=faux").iterdir()
    col = read_collection(folder)
    assert col["quanta_runtime"].height > 0 and col["quanta_queued_time"].height > 0
    assert col.manifest.hooks["quanta_runtime"].events > 0
    assert not col.manifest.hooks["quanta_runtime"].failed
    record = col.manifest.hooks["memory_usage"]
    assert record.failed and record.reason == f"at the stop, {why}"
    # its rows until then are kept: the final drain's too, up to its bug
    assert col["memory_usage"]["x"].to_list()[-1] == (2 if where == "drain" else 1)
    assert col.manifest.state == "duration" and col.manifest.exit_code == 1
    assert col.manifest.error is None
    # the collection was compacted as any (a table whose parts are compact already: kept)
    outcomes = {t: r.compaction for t, r in col.manifest.tables.items()}
    assert set(outcomes) == {"memory_usage", "quanta_runtime", "quanta_queued_time"}
    assert set(outcomes.values()) <= {"compacted", "skipped: compact already"}, outcomes


_FAULT = """
import shutil
import subprocess
import sys
import time
from pathlib import Path
from kernmlops.collect import parquet
from kernmlops.hooks.bpf import BpfHook
from kernmlops.hooks.quanta_runtime import QuantaRuntimeHook

WHERE = sys.argv.pop(1)  # which call has the bug
#: the benchmark's storm goes on until this file is there (_collect_with_a_bug)
ENOUGH = Path("enough")

def bug(*args, **kwargs):
    ENOUGH.touch()  # what the test checks happened: the storm may end
    raise RuntimeError(f"{WHERE} bug")

def wait_for(done):
    deadline = time.monotonic() + 20
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)

spooled = QuantaRuntimeHook.spooled_bytes
if WHERE in ("adopt", "spool_work", "spool_made"):  # bugs at the stop
    def spooled_enough(self):
        # 256 KiB of the storm's switches wait in its spool (~8000, for the 1000 rows
        # checked): the storm may end
        held = spooled(self)
        if held >= 256 << 10:
            ENOUGH.touch()
        return held

    QuantaRuntimeHook.spooled_bytes = spooled_enough
if WHERE == "adopt":  # the collector's own bug, in no hook
    parquet.ParquetSink.adopt = lambda *a, **k: (_ for _ in ()).throw(TypeError("adopt bug"))
else:
    real = getattr(QuantaRuntimeHook, WHERE)
    IN_START = ("start", "attach")  # attach: BpfHook.start's last step

    def start(self, arg):
        # its programs attached and copiers started (attach: inside its start, before
        # the start is done); (the whole system traced) a storm's switches spooled:
        # then the bug
        real(self, arg)
        storm = subprocess.Popen(["stress-ng", "--switch", "1", "-t", "20", "--quiet"])
        wait_for(lambda: spooled(self) >= 64 << 10)
        storm.terminate()
        storm.wait()
        self.spool_from = next(iter(self._spools.values())).folder
        bug()

    settle = QuantaRuntimeHook.spool_work

    def spool_work(self):
        # once detached, every record it will ever have in its spool: copied then
        work = settle(self)
        if not Path("snapshot").exists():
            shutil.copytree(self.spool_from, "snapshot")  # follows `mem` (the tmpfs)
        return work

    if WHERE in IN_START:
        QuantaRuntimeHook.spool_work = spool_work

    def while_running(self, *args):
        # once 64 KiB wait in its spool (wake_fds: asked once, at the start); once
        # detached (its close reads its drops) as it was
        if not self._detached and (WHERE == "wake_fds" or spooled(self) >= 64 << 10):
            bug()
        return real(self, *args)

    WHILE_RUNNING = ("drops", "spooled_bytes", "spilled_bytes", "next_poll", "wake_fds")
    fault = start if WHERE in IN_START else while_running if WHERE in WHILE_RUNNING else bug
    setattr(QuantaRuntimeHook, WHERE, fault)
from kernmlops.cli import main
main()
"""


#: the longest the storm of :func:`_collect_with_a_bug` runs (it ends sooner, once the
#: test has what it checks)
STORM_S = 30


def _collect_with_a_bug(
    tmp_path: Path, where: str, *more: str
) -> tuple[subprocess.CompletedProcess, Path]:
    """``collect`` (with ``more`` options) of a switch storm with quanta_runtime's
    ``where`` raising a bug, every record spooled and the rows made at the stop in two
    worker processes. The storm runs until the bug came (or, for a bug at the stop,
    until 256 KiB of its switches are spooled), at most STORM_S."""
    config = tmp_path / "overrides.yaml"
    config.write_text("collector:\n  spool_spare_cpus: 1000\n  spool_row_workers: 2\n"
                      "  flush_interval_s: 0.5\n")  # fmt: skip
    out = tmp_path / "out"
    enough = shlex.quote(str(tmp_path / "enough"))  # the collector's cwd: see _FAULT
    storm = (
        f"stress-ng --switch 1 -t {STORM_S} --quiet & s=$!; "
        f"while [ ! -e {enough} ] && kill -0 $s 2>/dev/null; do sleep 0.02; done; "
        "kill $s 2>/dev/null; wait $s; exit 0"
    )
    done = subprocess.run(
        [sys.executable, "-c", _FAULT, where, "collect", "--no-progress", "-c", str(config),
         "-o", str(out), "--hooks", "quanta_runtime,process_trace,memory_usage", *more,
         "--", "sh", "-c", storm],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    (folder,) = (out / "curated").glob("benchmark=*/*")
    return done, folder


def _named(line: str) -> bool:
    """A line that names quanta_runtime, but for the summary's table."""
    return "quanta_runtime" in line and not line.startswith("│")


def _exits_1(
    done: subprocess.CompletedProcess, *expected: str, pick: Callable[[str], bool] = _named
) -> list[str]:
    """No traceback, exit 1, and the lines of its stderr that ``pick`` takes: returned,
    and where ``expected`` is given, those lines."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if pick(line)]
    if expected:
        assert lines == list(expected), done.stderr
    return lines


def _others_collected(folder: Path, *, incomplete: bool = False) -> None:
    """memory_usage's and process_trace's rows readable (``incomplete``: with the
    warning that rows wait in a spool)."""
    if incomplete:
        with pytest.warns(IncompleteCollectionWarning, match="kernmlops recover"):
            col = read_collection(folder)
    else:
        col = read_collection(folder)
    assert col["memory_usage"].height >= 1
    assert col["process_trace"].height > 0
    assert col["process_trace"].height == col.manifest.hooks["process_trace"].rows["process_trace"]
    assert not col.manifest.hooks["process_trace"].failed


@pytest.mark.parametrize(
    "where",
    ["drops", "spooled_bytes", "spilled_bytes", "next_poll", "wake_fds", "benchmark_started"],
)
def test_a_hook_whose_answer_to_the_loop_raises_is_detached_alone(
    tmp_path: Path, where: str
) -> None:
    # the loop asks each hook for its drops and spooled bytes (the progress, a spool's
    # failed write), what it holds in memory, when it is due, what wakes it; before it,
    # each is told the benchmark runs: a bug there is the hook's, as in its poll; what
    # it spooled becomes rows at the stop
    done, folder = _collect_with_a_bug(tmp_path, where)
    # spooled_bytes is asked by the hook's own next_poll too: the bug is reached there
    what = "next_poll" if where == "spooled_bytes" and "its next_poll" in done.stderr else where
    _exits_1(
        done,
        f"warning: hook quanta_runtime failed (its {what} raised RuntimeError: {where} bug): "
        "detached; the collection goes on without it and exits with 1",
        "exit code 1 (completed; hook quanta_runtime failed)",
    )
    _others_collected(folder)
    col = read_collection(folder)
    record = col.manifest.hooks["quanta_runtime"]
    assert record.failed and record.reason.startswith(f"its {what} raised RuntimeError")
    # detached before the storm, it may have no row at all: then no table
    made = col["quanta_runtime"].height if "quanta_runtime" in col else 0
    assert made == record.rows.get("quanta_runtime", 0)
    assert where in ("wake_fds", "benchmark_started") or made > 1000  # spooled: rows now
    assert not (folder / ".spool").exists()


@pytest.mark.parametrize("where", ["start", "attach", "notes"])
def test_a_hook_whose_start_raises_a_bug_is_not_attached_and_the_others_run(
    tmp_path: Path, where: str
) -> None:
    # not HookUnavailable (a kernel without what it needs: exit 0): a bug, exit 1; its
    # notes (asked before any hook starts) are part of its start. Its start raises once
    # a storm's switches wait in its spool (the whole system traced): they are no loss,
    # as a hook's whose poll fails: their rows are made at the stop. attach: the bug is
    # in its start's last step (its programs attached, its copier running), before
    # the start is done: its records' layout is known all the same
    done, folder = _collect_with_a_bug(tmp_path, where, "--system-wide")
    said = "notes" if where == "notes" else "start"
    _exits_1(
        done,
        f"warning: hook quanta_runtime failed (its {said} raised RuntimeError: {where} bug): "
        "not attached; the collection goes on without it and exits with 1",
        "exit code 1 (completed; hook quanta_runtime failed)",
    )
    assert "probes attached: 2/3 hooks" in done.stderr
    _others_collected(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no IncompleteCollectionWarning: no spool left
        col = read_collection(folder)
    record = col.manifest.hooks["quanta_runtime"]
    assert record.failed and not record.attached
    assert record.reason == (
        f"its {said} raised RuntimeError: {where} bug; not attached, the other hooks went on"
    )
    made = {t: col[t].height if t in col else 0 for t in ("quanta_runtime", "quanta_queued_time")}
    if where == "notes":  # never started
        assert made["quanta_runtime"] == 0 and record.events == 0
    else:  # every record it spooled before its bug, decoded apart from the collector
        spooled = spooled_switches(tmp_path / "snapshot")
        records, expected = spooled.records, spooled.rows
        assert made["quanta_runtime"] > 1000
        assert made == expected == record.rows
        assert record.events == records
    assert record.rows == made
    assert not (folder / ".spool").exists()
    assert col.manifest.state == "completed" and col.manifest.exit_code == 1


@pytest.mark.parametrize("where", ["spool_work", "spool_made"])
def test_a_hook_failing_while_the_rows_are_made_on_all_cores_keeps_its_spool(
    tmp_path: Path, where: str
) -> None:
    # its bug, in the collector, is told apart from the others' rows made in the
    # workers: its spooled records stay for `kernmlops recover`, the others' are made
    done, folder = _collect_with_a_bug(tmp_path, where)
    named = _exits_1(done)
    assert "on 2 cores" in done.stderr  # the workers made rows
    assert len(named) == 3, done.stderr
    kept = re.fullmatch(
        f"warning: hook quanta_runtime failed at the stop \\(its {where} raised RuntimeError: "
        f"{where} bug\\): its (.+) of spooled records are kept: `kernmlops recover "
        f"{re.escape(str(folder))}` makes their rows",
        named[0],
    )
    assert kept is not None, named[0]
    # after the summary, whose events for it are only those made into rows
    assert named[1] == (
        f"quanta_runtime: {kept[1]} of spooled records wait in the spool, not counted in its "
        f"events nor rows: `kernmlops recover {folder}` makes their rows"
    )
    assert named[2] == "exit code 1 (completed; hook quanta_runtime failed)"
    _others_collected(folder, incomplete=True)
    _recover_makes_each_spooled_record_once(tmp_path, folder)


def test_the_collectors_own_bug_while_the_rows_are_made_keeps_the_spool(tmp_path: Path) -> None:
    # a bug in no hook: the spool stays whole for `kernmlops recover`, one line
    done, folder = _collect_with_a_bug(tmp_path, "adopt")
    assert _exits_1(done, pick=lambda _line: True)[-1] == (
        "error: making the spooled rows failed (TypeError: adopt bug): the spool is kept; "
        f"`kernmlops recover {folder}` makes their rows"
    ), done.stderr
    with pytest.warns(IncompleteCollectionWarning, match="kernmlops recover"):
        assert read_collection(folder)["memory_usage"].height >= 1  # the spool's rows wait
    _recover_makes_each_spooled_record_once(tmp_path, folder)


def _recover_makes_each_spooled_record_once(tmp_path: Path, folder: Path) -> None:
    """The kept spool, decoded apart from the collector (a copy), against what
    `kernmlops recover` then makes: every record's rows once (the parts the workers
    made for some are not made again), the other hooks' tables whole."""
    snapshot = tmp_path / "snapshot"
    shutil.copytree(folder / ".spool", snapshot)  # follows `mem` (the tmpfs)
    expected = spooled_switches(snapshot).rows
    assert expected["quanta_runtime"] > 1000
    recovered = subprocess.run([sys.executable, "-m", "kernmlops", "recover", str(folder)],
                               capture_output=True, text=True, timeout=300)  # fmt: skip
    assert recovered.returncode == 0 and "Traceback" not in recovered.stderr, recovered.stderr
    col = read_collection(folder)
    assert {t: col[t].height for t in expected} == expected
    _others_collected(folder)


def test_strict_makes_a_start_bug_the_collections_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --strict: every hook attached or no collection, a bug as a missing feature
    from kernmlops.collect.attach import StrictError

    def start(self: QuantaRuntimeHook, ctx: object) -> None:
        raise RuntimeError("start bug")

    monkeypatch.setattr(QuantaRuntimeHook, "start", start)
    cfg = load_config({
        "collector": {"output_dir": str(tmp_path), "progress": False, "strict": True,
                      "hooks": ["memory_usage", "quanta_runtime"]},
        "benchmark": {"name": "faux", "duration_s": 0.5},
    })  # fmt: skip
    session = Session(cfg)
    with pytest.raises(StrictError) as raised:
        session.run()
    assert str(raised.value) == (
        "--strict: hook quanta_runtime failed (its start raised RuntimeError: start bug)"
    )
