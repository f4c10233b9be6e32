"""Seeing the commands' progress in tests: a terminal forced through the environment
(as rich reads it), and the counts of the last frame a progress bar drew."""

from __future__ import annotations

import re

import pytest

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def force_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """stderr counts as a terminal (rich's TTY_COMPATIBLE), wide, not a dumb one."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("NO_COLOR", raising=False)


def frames(text: str) -> list[str]:
    """Each line or redrawn frame of ``text``, escapes removed."""
    return [f for f in re.split(r"[\r\n]", _ANSI.sub("", text)) if f.strip()]


def last_count(text: str, what: str, unit: str) -> tuple[str, str]:
    """(done, total) as the last frame of the bar ``what`` shows them, ``unit`` after
    them ("graphs"; for bytes the size's unit: "kB", "MB"). Fails where no frame of it
    shows counts."""
    pattern = re.compile(rf"^{re.escape(what)} .*?([\d.,]+)/([\d.,]+) ?{re.escape(unit)}\b")
    shown = [m.groups() for f in frames(text) if (m := pattern.search(f))]
    assert shown, f"no progress of {what!r} in {text!r}"
    return shown[-1]


def shown_bytes(n: int, total: int) -> tuple[str, str, str]:
    """(done, total, unit) as a bar in bytes shows ``n`` of ``total`` (in the unit the
    total is best said in, decimal, one digit after the point past bytes)."""
    from rich.filesize import pick_unit_and_suffix

    unit, suffix = pick_unit_and_suffix(
        total, ["bytes", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"], 1000
    )
    digits = 0 if unit == 1 else 1
    return f"{n / unit:,.{digits}f}", f"{total / unit:,.{digits}f}", suffix
