"""The attacks of issue 27 against a real running exporter (root + BPF): a
scraper beside 1,000 slowloris clients, beside 1,000 idle connections, and 20
scrapers at once; every scrape must be answered, well within Prometheus'
10 s timeout. attack.py is the same code as a command, for measuring."""

from __future__ import annotations

import pytest

from tests.exporter.attack import under_attack
from tests.exporter.conftest import LiveExporter

pytestmark = pytest.mark.bpf


@pytest.mark.parametrize(
    ("attack", "size"),
    [("slowloris", {"clients": 1000}), ("idle", {"clients": 1000}), ("parallel", {"scrapers": 20})],
)
def test_scrapes_are_answered_under_attack(
    live_exporter: LiveExporter, attack: str, size: dict[str, int]
) -> None:
    tally = under_attack(live_exporter.url, attack, seconds=2.0, settle_s=0.5, **size)
    print(f"{attack} {size}: {tally}")
    assert tally.total >= 5
    assert tally.ok == tally.total, str(tally)
    assert tally.slowest_s < 5.0, str(tally)
    assert live_exporter.proc.poll() is None
