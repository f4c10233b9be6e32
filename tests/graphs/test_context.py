"""`kernmlops graph` / `report` on a damaged manifest or a folder they cannot write:
one line naming the file (or folder) and the key, exit 2, no traceback; on a
collection that recorded no rows: one line saying so, exit 1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.data import Collection
from kernmlops.graphs.cli import graph_command, report_command
from kernmlops.graphs.context import checked_manifest, load
from tests.graphs.conftest import BENCH_START, synthetic_tables, write_collection

NOBODY = 65534


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A good collection: each test damages a copy."""
    root = tmp_path_factory.mktemp("good")
    tables = {k: v for k, v in synthetic_tables().items() if k in ("process_trace", "page_faults")}
    return write_collection(root, tables)


def _damaged(folder: Path, tmp_path: Path, change) -> Path:
    copy = tmp_path / "collection"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    change(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def _set(path: str, value: object):
    def change(manifest: dict) -> None:
        *parents, last = path.split(".")
        node = manifest
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return change


def _one_line_error(command, args: list[str]) -> str:
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    lines = result.output.splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    return lines[0].removeprefix("error: ")


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("system.boot_time_unix", "x", "expected a number, got 'x'"),
        ("system.logical_cpus", "many", "expected an integer, got 'many'"),
        ("system.memory_bytes", [1], "expected a number, got [1]"),
        ("config.hooks.page_faults", 5, "expected an object, got 5"),
        ("config.hooks.page_faults.sample_every", "often", "expected an integer, got 'often'"),
    ],
)
def test_a_wrong_type_in_what_graphs_read_is_one_line(
    folder: Path, tmp_path: Path, key: str, value: object, expected: str
) -> None:
    copy = _damaged(folder, tmp_path, _set(key, value))
    where = copy / "manifest.json"
    for command, args in (
        (graph_command, [str(copy), "-o", str(tmp_path / "figs")]),
        (report_command, [str(copy), "-o", str(tmp_path / "r.html")]),
    ):
        assert _one_line_error(command, args) == f"{where}: {key}: {expected}"
    assert not (tmp_path / "figs").exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize(
    ("key", "value"),
    [("hooks", 5), ("system", "x"), ("started_at", 3), ("benchmark", 5), ("config", [1]),
     ("benchmark.pid", "x"), ("hooks.process_trace", 5), ("filter", 3), ("attach_s", "x")],
)  # fmt: skip
def test_a_wrong_type_anywhere_in_the_manifest_is_one_line(
    folder: Path, tmp_path: Path, key: str, value: object
) -> None:
    copy = _damaged(folder, tmp_path, _set(key, value))
    for command, args in (
        (graph_command, [str(copy), "-o", str(tmp_path / "figs")]),
        (report_command, [str(copy), "-o", str(tmp_path / "r.html")]),
    ):
        # the manifest reader or the graphs' own check: either names the file and the key
        msg = _one_line_error(command, args)
        assert msg.startswith(f"{copy / 'manifest.json'}: ")
        assert f" {key}: " in msg


def test_checked_manifest_gives_plain_values(folder: Path) -> None:
    data = load(folder)
    assert isinstance(data.manifest, dict)
    assert data.manifest["benchmark"]["pid"] == 100
    assert json.loads(json.dumps(data.manifest)) == data.manifest  # plain JSON values
    assert data.markers[0].t_us == BENCH_START  # the pid is found, so is the start
    # a hand-made (version 1) manifest with the benchmark's name alone
    old = Collection(path=folder, manifest={"benchmark": "faux"}, tables={})  # type: ignore[arg-type]
    assert checked_manifest(old) == {"benchmark": {"name": "faux"}}


def test_graphs_in_the_way_of_the_graphs_folder(folder: Path, tmp_path: Path) -> None:
    copy = _damaged(folder, tmp_path, lambda m: None)
    (copy / "graphs").write_text("not a folder")
    assert _one_line_error(graph_command, [str(copy)]) == (
        f"cannot write graphs into {copy / 'graphs'}: a file is in the way, not a folder "
        "(choose another folder with -o)"
    )
    out = copy / "graphs" / "report.html"
    assert _one_line_error(report_command, [str(copy), "-o", str(out)]) == (
        f"cannot write the report report.html into {copy / 'graphs'}: a file is in the way, "
        "not a folder (choose another path with -o)"
    )


@pytest.fixture
def read_only_collection(folder: Path) -> Iterator[Path]:
    """A copy of the collection that nobody (the user the test runs as when root) may
    read but not write: mode 555, in a folder every user can reach."""
    top = Path(tempfile.mkdtemp(prefix="kmo-ro-"))
    try:
        top.chmod(0o755)
        copy = top / "collection"
        shutil.copytree(folder, copy)
        for path in [copy, *copy.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        yield copy
    finally:
        for path in [top, *top.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(top)


def _as_unprivileged(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run as nobody"
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["graph", "{c}"], "cannot write graphs into {c}/graphs: Permission denied "
                           "(choose another folder with -o)"),
        (["report", "{c}", "-o", "{c}/r.html"], "cannot write the report r.html into {c}: "
                                                "not writable (choose another path with -o)"),
    ],
)  # fmt: skip
def test_a_read_only_collection_is_one_line(
    read_only_collection: Path, args: list[str], expected: str
) -> None:
    c = str(read_only_collection)
    argv = [sys.executable, "-m", "kernmlops", *(a.format(c=c) for a in args)]
    proc = subprocess.run(
        _as_unprivileged(argv), capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [f"error: {expected.format(c=c)}"]
