"""Every command's --help teaches by example: it shows the command line itself."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from kernmlops.cli import cli


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


@pytest.mark.parametrize("path", list(_commands(cli)), ids=" ".join)
def test_help_shows_an_example_of_the_command(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    # an example line of its own (a paragraph click re-flowed would hide it in prose)
    typed = f"kernmlops {' '.join(path)}"
    examples = [
        line
        for line in result.output.splitlines()
        if line.strip().removeprefix("sudo ").startswith(typed) or f"-- {typed}" in line
    ]
    assert examples, f"{typed} --help shows no example:\n{result.output}"
