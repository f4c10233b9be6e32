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
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.lab import LabRun, LabStart

REQUIRE_BPF = os.environ.get("KERNMLOPS_REQUIRE_BPF") == "1"
REPO = Path(__file__).resolve().parent.parent


def skip_here(reason: str) -> None:
    """Skip on a developer's machine that lacks something; in CI
    (KERNMLOPS_REQUIRE_BPF=1), where `make test` provides it, fail instead."""
    (pytest.fail if REQUIRE_BPF else pytest.skip)(reason)


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
    if lab_parts(items):
        items[:] = beside_the_lab(items)


def _skip_bpf(items: list[pytest.Item]) -> None:
    if REQUIRE_BPF or not any(i.get_closest_marker("bpf") for i in items):
        return
    reason = bpf_unavailable()
    if reason:
        marker = pytest.mark.skip(reason=f"needs BPF: {reason}")
        for item in items:
            if item.get_closest_marker("bpf"):
                item.add_marker(marker)


# -- the kernel lab's boot, beside the tests that do not mind ---------------------------------


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


def beside_the_lab(items: list[pytest.Item]) -> list[pytest.Item]:
    """The run's order when the kernel lab boots: modules whose tests may run beside
    its VM (it keeps a CPU busy for minutes) first, then the lab's tests, then the
    rest. A module runs beside the VM only if none of its tests is marked ``bpf``
    (drops and costs under load) or ``quiet`` (asserts something of time), or uses
    Spark: its JVMs live from the first test that uses them to the last, and tests
    between them that count their children must not see them (the order among its
    modules stays the one they had). Whole modules move, so their module-scoped
    fixtures are made once."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups: tuple[list[pytest.Item], ...] = ([], [], [])
    for tests in modules.values():
        if any("lab" in getattr(i, "fixturenames", ()) for i in tests):
            groups[1].extend(tests)
        elif any(
            i.get_closest_marker("bpf")
            or i.get_closest_marker("quiet")
            or "spark" in getattr(i, "fixturenames", ())
            for i in tests
        ):
            groups[2].extend(tests)
        else:
            groups[0].extend(tests)
    return [*groups[0], *groups[1], *groups[2]]


#: the lab's boot, started once the run's tests are known
_lab_started: list[LabStart] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    for started in _lab_started:
        started.stop()


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
