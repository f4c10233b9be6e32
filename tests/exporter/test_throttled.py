"""ThrottledCount: a growing count said at most once a while, its growth since."""

from __future__ import annotations

import pytest

from kernmlops.exporter.throttled import ThrottledCount


def test_growth_is_said_at_most_once_a_while(capsys: pytest.CaptureFixture[str]) -> None:
    said = ThrottledCount(60.0)

    def line(n: int) -> str:
        return f"{n} lost"

    said.say(0, 0.0, line)  # nothing grew: nothing said
    said.say(5, 1.0, line)  # the first growth: said at once
    said.say(9, 30.0, line)  # within the minute: held
    said.say(12, 61.0, line)  # a minute on: the growth since the last line
    said.say(12, 200.0, line)  # no growth: nothing
    said.say(13, float("inf"), line)  # at close: said whatever the time
    assert capsys.readouterr().err.splitlines() == ["5 lost", "7 lost", "1 lost"]
