"""``duet process`` on a hostile or damaged folder: every path the folder names
stays inside it, and nothing is read past its size limit.

The folders are written by hand as an attacker would: a ``duet-run.json``
naming a secret file outside the folder (absolute, with ``..``, through a
link), artifacts that are huge or a FIFO. The secret is a real file with a
marker; the tests prove that the marker reaches no output and that each
refusal is named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.confined import UnsafePathError
from kernmlops.duet.cli import duet_group
from kernmlops.duet.process import process_dirs
from kernmlops.duet.runner import INDEX, DuetError, read_index

MARKER = "root:$6$SECRET-HASH:19000"
T0 = 5_000_000_000


def _harness_csv(n: int = 3) -> str:
    rows = ["iteration,iteration_start_ns,iteration_end_ns,iteration_time_ns,epoch_start_ms,"
            "exit_code"]  # fmt: skip
    for i in range(n):
        s = T0 + i * 2_000_000
        rows.append(f"{i},{s},{s + 1_000_000},1000000,{1_700_000_000_000 + i * 2},0")
    return "\n".join(rows) + "\n"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A root-only file outside the results folder; it looks like lscpu and like a
    harness result, so a reader that followed a path to it would show it."""
    path = tmp_path / "secret"
    path.write_text(f"Model name: {MARKER}\nCPU(s): 64\n")
    path.chmod(0o600)
    return path


def _suite(folder: Path, results: list[object], artifacts: dict[str, object]) -> Path:
    """A `duet run` folder: one trial whose side A lists ``results``."""
    (folder / "results").mkdir(parents=True)
    (folder / "results" / "s.d.0.duet.AB.A.out.csv").write_text(_harness_csv())
    side = {"status": "ok", "results": results, "release_ns": T0, "release_epoch_ms": 1}
    trial = {"label": "s.d.0.duet.AB", "suite": "s", "benchmark": "d", "runid": 0,
             "kind": "duet", "order": "AB", "aa": True, "sides": {"A": side}}  # fmt: skip
    index = {"format": "kernmlops-duet-run/1", "suite": "s", "artifacts": artifacts,
             "trials": [trial]}  # fmt: skip
    (folder / INDEX).write_text(json.dumps(index))
    return folder


GOOD = "results/s.d.0.duet.AB.A.out.csv"


def _process(folder: Path, *args: str):
    r = CliRunner().invoke(duet_group, ["process", str(folder), *args])
    out = "".join(p.read_text() for p in folder.glob("duet-results.*") if p.suffix != ".parquet")
    return r, out


@pytest.mark.parametrize("how", ["absolute", "dotdot", "link"])
def test_an_artifact_outside_the_folder_is_refused(tmp_path: Path, secret: Path, how: str):
    folder = tmp_path / "run"
    name = {"absolute": str(secret), "dotdot": "../secret", "link": "artifacts/lscpu"}[how]
    _suite(folder, [GOOD], {"lscpu": {"file": name}, "hostname": {"file": "artifacts/hostname"}})
    (folder / "artifacts").mkdir()
    (folder / "artifacts" / "hostname").write_text("bench-host\n")
    if how == "link":
        (folder / "artifacts" / "lscpu").symlink_to(secret)
    r, out = _process(folder)
    assert r.exit_code == 0, r.output
    assert MARKER not in out and MARKER not in r.output  # the secret reached no output
    assert "bench-host" in out  # the artifact inside the folder is still read
    why = {"absolute": "is an absolute path", "dotdot": "climbs out with '..'",
           "link": "is a link out of the folder"}[how]  # fmt: skip
    [warning] = [ln for ln in r.stderr.splitlines() if "lscpu" in ln]
    assert warning.startswith("warning:") and why in warning and "not read" in warning


@pytest.mark.parametrize("how", ["absolute", "dotdot", "link", "linked dir"])
def test_a_result_outside_the_folder_is_refused(tmp_path: Path, secret: Path, how: str):
    secret.write_text(_harness_csv(7).replace("0\n", f"0 {MARKER}\n", 1))
    folder = tmp_path / "run"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "x.csv").write_text(_harness_csv(7))
    name = {"absolute": str(outside / "x.csv"), "dotdot": "../elsewhere/x.csv",
            "link": "results/link.csv", "linked dir": "results/dir"}[how]  # fmt: skip
    _suite(folder, [GOOD, name], {})
    if how == "link":
        (folder / "results" / "link.csv").symlink_to(outside / "x.csv")
    if how == "linked dir":  # a result folder (SPEC's) holding a link to the secret
        (folder / "results" / "dir").mkdir()
        (folder / "results" / "dir" / "CPU2017.001.log").symlink_to(secret)
    processed = process_dirs([folder])
    assert processed.results.height == 3  # only the result inside the folder
    assert processed.results["source_file"].unique().to_list() == [GOOD]
    [err] = processed.errors
    assert "not read" in err and MARKER not in err


def test_links_inside_the_folder_are_followed(tmp_path: Path):
    folder = _suite(tmp_path / "run", ["results/again.csv"], {"x": {"file": "artifacts/x"}})
    (folder / "results" / "again.csv").symlink_to(folder / "results" / "s.d.0.duet.AB.A.out.csv")
    (folder / "artifacts").mkdir()
    (folder / "artifacts" / "real").write_text("inside\n")
    (folder / "artifacts" / "x").symlink_to("real")
    processed = process_dirs([folder])
    assert processed.errors == [] and processed.results.height == 3
    assert processed.results["artifact_x"].unique().to_list() == ["inside"]


def test_huge_files_are_refused_by_size_before_any_read(tmp_path: Path):
    folder = _suite(tmp_path / "run", [GOOD, "results/big.csv"], {"lscpu": {"file": "big"}})
    # sparse: 1 GiB that costs no disk, as the 1 GB artifact of the report
    with open(folder / "big", "wb") as f:
        f.truncate(1 << 30)
    (folder / "results" / "big.csv").write_text(_harness_csv(40_000))  # ~2 MiB
    r, _ = _process(folder, "--max-file-mb", "1")
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    assert any("artifact lscpu of 1.0 GiB, over the 1.0 MiB limit: not read" in ln for ln in lines)
    assert any(
        "result file of 2." in ln
        and "over the 1.0 MiB limit: not read (duet process --max-file-mb raises the limit)" in ln
        for ln in lines
    ), lines
    assert "3 iterations from 2 file(s)" in r.stderr
    # the default limit reads the 2 MiB result
    assert process_dirs([folder]).results.height == 40_003


def test_a_fifo_artifact_does_not_hang_the_reader(tmp_path: Path):
    folder = _suite(tmp_path / "run", [GOOD], {"date": {"file": "artifacts/date"}})
    (folder / "artifacts").mkdir()
    os.mkfifo(folder / "artifacts" / "date")  # no writer: a plain open would block forever
    processed = process_dirs([folder])
    assert processed.results.height == 3
    assert ["not a regular file" in e for e in processed.errors] == [True]


def test_an_original_folder_is_confined_too(tmp_path: Path, secret: Path):
    folder = tmp_path / "results.20261124"
    (folder / "artifacts").mkdir(parents=True)
    (folder / "artifacts" / "lscpu").symlink_to(secret)
    (folder / "artifacts" / "hostname").write_text("bench-host\n")
    (folder / "s.d.0.duet.AB.A.out.csv").write_text(_harness_csv())
    (folder / "s.d.0.duet.AB.B.out.csv").symlink_to(secret)
    processed = process_dirs([folder])
    assert processed.results.height == 3
    assert processed.results["artifact_hostname"].unique().to_list() == ["bench-host"]
    assert "artifact_lscpu" not in processed.results.columns
    assert len(processed.errors) == 2
    assert all("is a link out of the folder" in e for e in processed.errors)


def test_a_suite_linked_in_from_elsewhere_is_not_read(tmp_path: Path):
    parent = tmp_path / "all"
    _suite(parent / "mine", [GOOD], {})
    _suite(tmp_path / "other-users", [GOOD], {})
    (parent / "theirs").symlink_to(tmp_path / "other-users")
    processed = process_dirs([parent])
    assert processed.results.height == 3
    assert ["suite folder 'theirs' is a link out" in e for e in processed.errors] == [True]


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ({"trials": [{"sides": {"A": {"status": "failed"}}}]}, "damaged (KeyError"),
        ({"trials": "none"}, "damaged (AttributeError"),
        ([1, 2], "not a duet run's index"),
        ({"artifacts": {"lscpu": "lscpu"}, "trials": []}, None),
    ],
)
def test_a_damaged_index_is_one_line(tmp_path: Path, index: object, message: str | None):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / INDEX).write_text(json.dumps(index))
    r = CliRunner().invoke(duet_group, ["process", str(folder)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 + (message is None), r.output
    assert "Traceback" not in r.output
    assert (message or "artifact lscpu is not an object: not read") in r.stderr


def test_the_index_itself_is_confined_and_limited(tmp_path: Path, secret: Path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / INDEX).symlink_to(secret)
    with pytest.raises(DuetError, match=r"duet-run\.json 'duet-run\.json' is a link out"):
        read_index(folder)
    (folder / INDEX).unlink()
    (folder / INDEX).write_text(json.dumps({"trials": [], "pad": "x" * 4096}))
    monkeypatch.setattr("kernmlops.duet.runner.INDEX_MAX_BYTES", 1024)
    with pytest.raises(DuetError, match=r"over the 1.0 KiB limit"):
        read_index(folder)


def test_an_index_with_a_number_too_long_to_read(tmp_path: Path):
    """A damaged duet-run.json holding a 5000-digit number (past Python's int parsing
    limit) is one line and exit 2, not json's ValueError traceback."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / INDEX).write_text('{"trials": [], "runs": ' + "9" * 5000 + "}")
    r = CliRunner().invoke(duet_group, ["process", str(folder)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert "Traceback" not in r.output and "not valid JSON" in r.stderr, r.stderr


def test_a_collection_path_outside_the_folder_is_refused(tmp_path: Path):
    from kernmlops.duet.collect import kernel_stats_for_suite

    index = {"trials": [{"collection": {"path": "/etc", "collection_id": "x"}, "sides": {}}]}
    with pytest.raises(UnsafePathError, match="collection '/etc' is an absolute path"):
        kernel_stats_for_suite(tmp_path, index)
