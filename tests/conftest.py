"""Test-wide rules: tests marked ``bpf`` need root and a kernel that loads BPF.

Where the kernel or the user cannot load BPF, such tests are skipped with the
reason, unless KERNMLOPS_REQUIRE_BPF=1 (CI), which turns the skip into a
failure: in CI every BPF test must run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests import lanes

if TYPE_CHECKING:
    from tests.lab import LabRun, LabStart

REQUIRE_BPF = os.environ.get("KERNMLOPS_REQUIRE_BPF") == "1"
REPO = Path(__file__).resolve().parent.parent


def skip_here(reason: str) -> None:
    """Skip on a developer's machine that lacks something; in CI
    (KERNMLOPS_REQUIRE_BPF=1), where `make test` provides it, fail instead."""
    (pytest.fail if REQUIRE_BPF else pytest.skip)(reason)


#: the CPU the hot-plug tests take offline and bring back
HOTPLUG_CPU = 1
_HOTPLUG_ONLINE = Path(f"/sys/devices/system/cpu/cpu{HOTPLUG_CPU}/online")


@contextmanager
def cpu_offline() -> Iterator[None]:
    """CPU 1 offline for the block (other tests run beside: keep it short), and
    online again whatever happens."""
    if not _HOTPLUG_ONLINE.exists() or _HOTPLUG_ONLINE.read_text().strip() != "1":
        skip_here(f"CPU {HOTPLUG_CPU} is not online and hot-pluggable on this machine")
    try:
        _HOTPLUG_ONLINE.write_text("0")
    except OSError as err:
        skip_here(f"this machine refuses to take CPU {HOTPLUG_CPU} offline: {err.strerror}")
    try:
        yield
    finally:
        _HOTPLUG_ONLINE.write_text("1")


def needs_tools(*tools: str) -> pytest.MarkDecorator:
    """Skip when a tool is missing, except in CI (KERNMLOPS_REQUIRE_BPF=1): there
    `make test` installed every tool, so a missing one must fail, not skip."""
    missing = [t for t in tools if shutil.which(t) is None]
    return pytest.mark.skipif(
        bool(missing) and not REQUIRE_BPF,
        reason=f"not installed: {', '.join(missing)} (make test installs them)",
    )


@cache
def bpf_unavailable() -> str | None:
    """Why BPF tests cannot run here, or None."""
    from kernmlops.ebpf.probe import has_bpf_capabilities, probe_program

    if not has_bpf_capabilities():
        return "not root (needs CAP_SYS_ADMIN or CAP_BPF+CAP_PERFMON)"
    try:
        from kernmlops.ebpf.build import build

        build()
    except Exception as err:  # any reason is reported
        return f"BPF objects cannot be built: {err}"
    for feature in ("tp_btf", "raw_tp"):
        if probe_program(feature).ok:
            return None
    return "the kernel loads neither tp_btf nor raw_tp programs"


@pytest.hookimpl(trylast=True)  # after -k/-m deselected what they do
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _skip_bpf(items)
    if lanes.in_idle_lane():
        return
    beside, alone = run_order(items)
    if beside and alone and lanes.wanted(config):
        items[:] = alone
        _idle_lane_items[:] = beside
    else:
        items[:] = beside + alone


def _skip_bpf(items: list[pytest.Item]) -> None:
    if REQUIRE_BPF or not any(i.get_closest_marker("bpf") for i in items):
        return
    reason = bpf_unavailable()
    if reason:
        marker = pytest.mark.skip(reason=f"needs BPF: {reason}")
        for item in items:
            if item.get_closest_marker("bpf"):
                item.add_marker(marker)


@pytest.fixture
def unhurried(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test of what a command says without a terminal: the plain line a long
    step says every PLAIN_EVERY_S (10 s) and a long wait's after WAIT_SAY_AFTER_S
    (2 s) put off for good (tests/test_clitools.py tests them). A starved run in the
    idle lane can make a quick command's step last that long, and say one more line."""
    from kernmlops import clitools

    monkeypatch.setattr(clitools, "PLAIN_EVERY_S", 1e6)
    monkeypatch.setattr(clitools, "WAIT_SAY_AFTER_S", 1e6)


# -- the run's order and its two lanes (tests/lanes.py) ---------------------------------------


def lab_parts(items: list[pytest.Item]) -> dict[str, Any]:
    """The ``LAB_PART`` of every test module whose tests use the ``lab`` fixture and
    are not skipped, by name."""
    parts = {}
    for item in items:
        part = getattr(getattr(item, "module", None), "LAB_PART", None)
        skipped = any(item.iter_markers("skip")) or any(
            m.args and m.args[0] is True for m in item.iter_markers("skipif")
        )  # needs_tools' condition is a plain bool
        if part is not None and "lab" in getattr(item, "fixturenames", ()) and not skipped:
            parts[part.name] = part
    return parts


def run_order(items: list[pytest.Item]) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """(the modules that may run beside the others, those that run one at a time in
    order). A module runs beside the others (the idle lane) only if none of its tests
    is marked ``bpf`` (drops and costs under load) or ``quiet`` (asserts something of
    time), uses Spark (its JVMs live from the first test that uses them to the last,
    and tests between them that count their children must not see them: the order
    among these modules stays the one they had) or the kernel lab. The others: the
    ``bpf`` and Spark modules, the lab's (its boot runs beside those), the ``quiet``
    ones. Whole modules move, so their module-scoped fixtures are made once."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    beside: list[pytest.Item] = []
    loud: list[pytest.Item] = []
    lab: list[pytest.Item] = []
    quiet: list[pytest.Item] = []
    for tests in modules.values():
        if any("lab" in getattr(i, "fixturenames", ()) for i in tests):
            lab.extend(tests)
        elif any(i.get_closest_marker("quiet") for i in tests):
            quiet.extend(tests)
        elif any(
            i.get_closest_marker("bpf") or "spark" in getattr(i, "fixturenames", ()) for i in tests
        ):
            loud.extend(tests)
        else:
            beside.extend(tests)
    return beside, [*loud, *lab, *quiet]


#: the tests the idle lane runs, chosen at collection; the lane once started
_idle_lane_items: list[pytest.Item] = []
_idle_lane: list[lanes.IdleLane] = []


def _start_idle_lane(session: pytest.Session) -> None:
    if _idle_lane_items:
        base = session.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
        extra = []
        xml = getattr(session.config.option, "xmlpath", None)
        if xml:  # the lane's own JUnit report beside the run's
            extra.append(f"--junitxml={Path(xml).with_suffix('.idle-lane.xml').absolute()}")
        lane = lanes.IdleLane(
            [i.nodeid for i in _idle_lane_items], session.config.rootpath, base, extra
        )
        _idle_lane.append(lane)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"{lane.count} tests run beside these at the idle CPU policy "
                f"(tests/lanes.py; log {lane.log})"
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A quiet test runs alone: the idle lane waits between two of its tests."""
    lock = lanes.idle_lane_lock()
    if lock is not None:  # a test of the idle lane
        if lanes.main_gone():
            pytest.exit("the main test run is gone (killed?): the idle lane stops too", 2)
        with lanes.hold(lock, alone=False):
            yield
    elif _idle_lane and _idle_lane[0].running() and item.get_closest_marker("quiet"):
        with lanes.hold(_idle_lane[0].lock, alone=True):
            yield
    else:
        yield


#: a main run that ended so stops the idle lane, not waits for it
_ENDED_EARLY = (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR)

#: the lab's boot, started once the run's tests are known
_lab_started: list[LabStart] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    for started in _lab_started:
        started.stop()
    for lane in _idle_lane:
        if session.shouldstop or session.shouldfail or session.exitstatus in _ENDED_EARLY:
            lane.stop()
            continue
        if lane.running():
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                # after the progress line, which ensure_newline does not know of
                reporter.write("\n")
                reporter.write_line(f"waiting for the idle lane ({lane.log})")
        if lane.wait() != 0 and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for lane in _idle_lane:
        lines = lane.report()
        terminalreporter.section("idle lane", sep="=", red=lane.failed, green=not lane.failed)
        for line in lines:
            terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    # the last line of the run is the idle lane's too: the main run's "N passed" above
    # it is half the run
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for lane in _idle_lane:
        if reporter is not None:
            said = f"idle lane: {lane.summary()}"
            reporter.write_sep("=", said, red=lane.failed, green=not lane.failed)


def _start_lab(session: pytest.Session) -> None:
    parts = lab_parts(session.items)
    if parts and not session.config.option.collectonly:
        from tests.lab import LabStart

        out = session.config._tmp_path_factory.mktemp("lab")  # type: ignore[attr-defined]
        _lab_started.append(LabStart(parts.values(), out))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if REQUIRE_BPF and item.get_closest_marker("bpf"):
        reason = bpf_unavailable()
        if reason:
            pytest.fail(f"KERNMLOPS_REQUIRE_BPF=1 but {reason}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _free_spool_memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Collections that tests kill or fail on purpose keep their spool for a recovery;
    its memory part (a tmpfs folder) would outlive the test run: free it at the end."""
    yield
    from kernmlops.spool.memory import MEMORY_PREFIX, OWNER_FILE, SHM

    base = str(tmp_path_factory.getbasetemp())
    for folder in SHM.glob(f"{MEMORY_PREFIX}*"):
        try:
            owner = (folder / OWNER_FILE).read_text()
        except OSError:
            continue
        if owner.startswith(base):
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _free_killed_benchmark_folders() -> Iterator[None]:
    """A collector a test kills leaves its benchmark's temporary folder, which the next
    collect sweeps once it is 10 minutes old (collect.benchmark.sweep_stale): the
    ones this run's killed collectors left go at its end, not a later user's run."""
    from kernmlops.collect.benchmark import WORK_PREFIX, _lock

    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob(f"{WORK_PREFIX}*"))
    yield
    for folder in set(tmp.glob(f"{WORK_PREFIX}*")) - before:
        held = _lock(folder)  # None: a live collector's (or not a folder)
        if held is not None:
            try:
                shutil.rmtree(folder, ignore_errors=True)
            finally:
                os.close(held)


@pytest.fixture(scope="session")
def bpf_build_dir() -> Path:
    """The project's BPF objects, built (or found up to date) in the default build folder.
    Compiling needs clang and bpftool (installed by `make test`), not root."""
    from kernmlops.ebpf.build import build, default_build_dir

    objs = build()
    assert objs, "no BPF sources found"
    directory = default_build_dir()
    assert all(o.parent == directory and o.exists() for o in objs)
    return directory


@pytest.fixture(scope="session")
def compile_bpf(
    bpf_build_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], Path]:
    """compile_bpf(name, source) -> path of ``<name>.bpf.o`` built from C ``source``.

    The source may include the project's headers (common.h, filter.h); the
    vmlinux.h of the project build is reused. Compiled once per session and name.
    """
    from kernmlops.ebpf.build import compile_object

    out = tmp_path_factory.mktemp("bpf-test-objects")
    built: dict[str, tuple[str, Path]] = {}

    def compile_(name: str, source: str) -> Path:
        if name in built:
            assert built[name][0] == source, f"two different sources named {name}"
            return built[name][1]
        src = out / f"{name}.bpf.c"
        src.write_text(source)
        obj = compile_object(src, out / f"{name}.bpf.o", vmlinux_dir=bpf_build_dir)
        built[name] = (source, obj)
        return obj

    return compile_


#: the session's Spark (fixture ``spark``): its stop, and the last test that uses it
_spark_stops: list[Callable[[], None]] = []
_last_spark_test: list[str] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    users = [i.nodeid for i in session.items if "spark" in getattr(i, "fixturenames", ())]
    _last_spark_test[:] = users[-1:]
    _start_lab(session)
    _start_idle_lane(session)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    # Spark's JVMs (~1.5 GB) would idle through the rest of the run: gone after their
    # last test instead of at the session's end.
    if [item.nodeid] == _last_spark_test:
        _stop_spark()


def _stop_spark() -> None:
    while _spark_stops:
        _spark_stops.pop()()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A SparkSession on a real standalone cluster (tests/spark.py: a master and a
    worker on this machine), started once for every test that uses Spark: its JVMs
    cost more than most such tests."""
    from tests.spark import start_cluster

    session, stop = start_cluster(tmp_path_factory.mktemp("spark"))
    _spark_stops.append(stop)
    yield session
    _stop_spark()


@pytest.fixture(scope="session")
def lab(request: pytest.FixtureRequest) -> LabRun:
    """The kernel lab's one boot for the run (tests/lab.py): the ``LAB_PART`` of every
    collected test module that uses it, run in one guest, started in the background
    as soon as the run's tests were collected."""
    if not _lab_started:
        pytest.fail(f"{request.node.nodeid} uses the lab, but its module has no LAB_PART")
    return _lab_started[0].result()


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /dev/shm."""
    from kernmlops.spool import memory as spool_mod

    folder = tmp_path / "shm"
    folder.mkdir()
    monkeypatch.setattr(spool_mod, "SHM", folder)
    monkeypatch.setattr(spool_mod, "_is_tmpfs", lambda path: True)
    return folder


def without_task_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    """libbpf's probe says this kernel has no BPF task storage (before Linux 5.11); the
    other map types as the kernel has them."""
    from kernmlops.ebpf import libbpf

    real = libbpf.has_map_type
    monkeypatch.setattr(
        libbpf, "has_map_type", lambda t: t != libbpf.MAP_TYPE_TASK_STORAGE and real(t)
    )
