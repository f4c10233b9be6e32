"""``perf_event/...`` programs as CPUs come and go (exporter/perf_event.py): the
test set cpu-clock.yaml counts cpu-clock samples per CPU; a CPU brought online
after the start, or taken offline and back, must run the program again."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernmlops.exporter.config import resolve_sets
from kernmlops.exporter.core import Exporter
from kernmlops.exporter.perf_event import PerfEventLinks
from tests.conftest import HOTPLUG_CPU, cpu_offline

pytestmark = pytest.mark.bpf

CONFIG = Path(__file__).parent / "ebpf_exporter"
NAME = "ebpf_exporter_cpu_clock_samples_total"
UNATTACHED = "kernmlops_exporter_perf_event_cpus_unattached"


def _series(exporter: Exporter) -> dict[str, float]:
    """cpu-clock samples so far, per CPU."""
    text = exporter.render().decode()
    return {
        s.labels["cpu"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == NAME
    }


def _unattached(exporter: Exporter) -> float:
    text = exporter.render().decode()
    (value,) = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == UNATTACHED
    ]
    return value


def _spin_on(cpu: int, seconds: float = 0.4) -> None:
    """Keep ``cpu`` busy for a while: an idle CPU takes no cpu-clock samples."""
    spin = f"import time\nt = time.monotonic() + {seconds}\nwhile time.monotonic() < t: pass"
    subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", spin], check=True)


def _samples_on(exporter: Exporter, cpu: int) -> float:
    """The samples ``cpu`` takes while busy for a while."""
    before = _series(exporter).get(str(cpu), 0.0)
    _spin_on(cpu)
    return _series(exporter).get(str(cpu), 0.0) - before


@pytest.fixture
def unpolled() -> Iterator[tuple[Exporter, PerfEventLinks]]:
    """cpu-clock.yaml's exporter, its CPU follower not started: the test looks."""
    exporter = Exporter(resolve_sets([str(CONFIG / "cpu-clock.yaml")]), services_later=True)
    try:
        (status,) = exporter.start()
        assert status.attached == 1, [(p.name, p.error) for p in status.programs]
        (links,) = [s for s in exporter.sets[0].services if isinstance(s, PerfEventLinks)]
        yield exporter, links
    finally:
        exporter.close()


def test_a_cpu_gone_and_back_between_two_looks_runs_the_program_again(
    unpolled: tuple[Exporter, PerfEventLinks],
) -> None:
    """A CPU's perf event dies with the CPU going offline; back between two looks
    at the online list (here no look at all), the uevents say it went, and the
    next look attaches the program there again. Without them it stays dead."""
    exporter, links = unpolled
    assert HOTPLUG_CPU in links.links
    assert _samples_on(exporter, HOTPLUG_CPU) > 0
    if links._watch.fileno() is None:
        pytest.fail("no uevent socket on this machine (a network namespace of its own?)")
    with cpu_offline():
        pass
    assert links.refresh() == [HOTPLUG_CPU]
    assert _samples_on(exporter, HOTPLUG_CPU) > 0
    assert _unattached(exporter) == 0
    links._watch.close()  # the same without the uevents: the event stays dead
    with cpu_offline():
        pass
    assert links.refresh() == []
    assert _samples_on(exporter, HOTPLUG_CPU) == 0


def test_a_cpu_brought_online_after_the_start_runs_the_program() -> None:
    """Started with CPU 1 offline, the exporter's follower attaches the program
    there once it comes online (woken by the uevent), and its samples count."""
    with cpu_offline():
        exporter = Exporter(resolve_sets([str(CONFIG / "cpu-clock.yaml")]))
        try:
            (status,) = exporter.start()
        except BaseException:
            exporter.close()
            raise
    try:
        assert status.attached == 1, [(p.name, p.error) for p in status.programs]
        (links,) = [s for s in exporter.sets[0].services if isinstance(s, PerfEventLinks)]
        deadline = time.monotonic() + 10
        while HOTPLUG_CPU not in links.links:
            assert time.monotonic() < deadline, (links.links, links.unattached)
            time.sleep(0.02)
        assert _samples_on(exporter, HOTPLUG_CPU) > 0
        assert _unattached(exporter) == 0
    finally:
        exporter.close()


def test_a_cpu_where_the_event_cannot_open_is_said_once_and_served(
    unpolled: tuple[Exporter, PerfEventLinks], capfd: pytest.CaptureFixture[str]
) -> None:
    """A CPU the online list names but where no event can be opened (one past
    the machine's CPUs) is said on stderr once and served as a gauge; once it
    is gone from the list it is no longer counted."""
    exporter, links = unpolled
    online = sorted(links.links)
    ghost = max(online) + 64
    for _ in range(3):
        assert links.refresh([*online, ghost]) == []
    assert set(links.unattached) == {ghost}
    assert f"CPU {ghost}" in links.unattached[ghost]
    assert _unattached(exporter) == 1
    lines = [line for line in capfd.readouterr().err.splitlines() if f"CPU {ghost} " in line]
    assert len(lines) == 1, lines
    assert "its events are not seen" in lines[0]
    links.refresh(online)
    assert links.unattached == {} and _unattached(exporter) == 0
