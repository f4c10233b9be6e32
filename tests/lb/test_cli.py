"""``kernmlops lb`` commands through click's runner: import, train, export,
report, and the errors a user can make."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.data import read_collection
from kernmlops.errors import KernmlopsWarning
from kernmlops.lb.cli import lb_group
from kernmlops.lb.dataset import recorded_cost, synthetic_decisions, write_decisions

RAW = Path(__file__).parent / "mllb_raw.csv"


def _invoke(*args: str):
    return CliRunner().invoke(lb_group, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lbdata")
    for i in range(3):
        frame = synthetic_decisions(1500, f"syn-{i}", seed=40 + i)
        write_decisions(frame, root, f"syn-{i}", "synthetic", {"lb": {"variant": "synthetic"}})
    return root


def test_group_help_says_how_to_know_whether_kprobes_are_there() -> None:
    """It said "Where kprobes are off (like here)" on every machine: a claim about the
    machine it was written on."""
    out = _invoke("--help").output
    assert "like here" not in out
    assert "neither kprobes nor fentry (kernmlops doctor says)" in " ".join(out.split())


def test_import_mllb_writes_a_collection(tmp_path: Path) -> None:
    r = _invoke("import-mllb", RAW, "-o", tmp_path)
    assert r.exit_code == 0, r.output
    (folder,) = (tmp_path / "curated" / "benchmark=mllb-import").iterdir()
    c = read_collection(folder)
    assert c.collection_id == "mllb-mllb_raw"
    assert c["lb_decisions"].height == 5
    assert c.manifest["lb"]["variant"] == "mllb"


def test_import_errors_exit_non_zero(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    r = _invoke("import-mllb", bad, "-o", tmp_path)
    assert r.exit_code == 2 and "not an MLLB raw dump" in r.output
    r = _invoke("import-mllb", RAW, RAW, "--collection-id", "x", "-o", tmp_path)
    assert r.exit_code == 2 and "one file" in r.output


def _raw_with(tmp_path: Path, row: int, **cells: str) -> Path:
    """RAW with the named columns of data row ``row`` (1 = the first) replaced."""
    header, *rows = RAW.read_text().splitlines()
    names = header.split(",")
    values = rows[row - 1].split(",")
    for name, value in cells.items():
        values[names.index(name)] = value
    rows[row - 1] = ",".join(values)
    path = tmp_path / "raw_x.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.mark.parametrize(
    ("row", "cells", "message"),
    [
        (2, {"src_len": "1.5"}, "column src_len, row 2 (line 3): 1.5 is not a whole number"),
        (4, {"delta": "7.25"}, "column delta, row 4 (line 5): 7.25 is not a whole number"),
        (2, {"src_len": "-2"}, "column src_len, row 2 (line 3): -2 is negative"),
        (3, {"dst_len": "-1"}, "column dst_len, row 3 (line 4): -1 is negative"),
        (5, {"nr_fails": "-3"}, "column nr_fails, row 5 (line 6): -3 is negative"),
        (2, {"can_migrate": "2"}, "column can_migrate, row 2 (line 3): 2 is not 0 or 1"),
        (1, {"can_migrate": "-1"}, "column can_migrate, row 1 (line 2): -1 is not 0 or 1"),
        (3, {"buddy_hot": "300"}, "column buddy_hot, row 3 (line 4): 300 is not 0 or 1"),
        (2, {"pid": "abc"}, "column pid, row 2 (line 3): abc is not a number"),
        (2, {"src_load": "1e30"}, "column src_load, row 2 (line 3): 1e30 is out of range"),
        (3, {"can_migrate": ""}, "column can_migrate, row 3 (line 4): empty (a required column)"),
        (1, {"delta": " "}, "column delta, row 1 (line 2): empty (a required column)"),
    ],
)
def test_import_refuses_values_mllb_cannot_have(
    tmp_path: Path, row: int, cells: dict[str, str], message: str
) -> None:
    # truncated, 1.5 became 1; a label of 2 or -1 is no decision
    raw = _raw_with(tmp_path, row, **cells)
    r = _invoke("import-mllb", raw, "-o", tmp_path / "out")
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: {raw}: {message}") and r.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def _refused(tmp_path: Path, raw: Path) -> str:
    """The one error line of importing ``raw`` (exit 2, nothing written)."""
    r = _invoke("import-mllb", raw, "-o", tmp_path / "refused")
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.output, r.stderr
    assert not (tmp_path / "refused").exists()
    return r.stderr.removeprefix("error: ").rstrip("\n")


def test_import_leaves_an_empty_optional_cell_null(tmp_path: Path) -> None:
    raw = _raw_with(tmp_path, 2, pid="", imbalance="")
    r = _invoke("import-mllb", raw, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    (folder,) = (tmp_path / "out" / "curated" / "benchmark=mllb-import").iterdir()
    rows = read_collection(folder)["lb_decisions"]
    assert rows["pid"].to_list() == [100, None, 102, 103, 104]
    assert rows["imbalance"].to_list() == [512, None, 100, 100, 800]


@pytest.mark.parametrize(
    ("value", "why"), [("abc", "abc is not a number"), ("1.5", "1.5 is not a whole number")]
)
def test_import_says_a_bad_value_far_down_the_file_in_one_line(
    tmp_path: Path, value: str, why: str
) -> None:
    """A bad value past the rows a CSV reader guesses types from (10,000): the same one
    line as near the top, naming its row and line."""
    header, *rows = RAW.read_text().splitlines()
    many = [rows[k % len(rows)] for k in range(12_000)]
    names = header.split(",")
    cells = many[10_500].split(",")
    cells[names.index("src_len")] = value
    many[10_500] = ",".join(cells)
    raw = tmp_path / "raw_long.csv"
    raw.write_text("\n".join([header, *many]) + "\n")
    assert _refused(tmp_path, raw) == f"{raw}: column src_len, row 10501 (line 10502): {why}"


def test_import_skips_blank_lines_and_counts_them_in_line_numbers(tmp_path: Path) -> None:
    header, *rows = RAW.read_text().splitlines()
    # blank lines before the header, between rows (one of spaces, one with a CR) and at
    # the end: none is a decision, each is a line
    lines = ["", header, rows[0], "", rows[1], "   ", "\r", rows[2], rows[3], rows[4], "", ""]
    raw = tmp_path / "raw_blank.csv"
    raw.write_text("\n".join(lines) + "\n")
    r = _invoke("import-mllb", raw, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    (folder,) = (tmp_path / "out" / "curated" / "benchmark=mllb-import").iterdir()
    assert read_collection(folder)["lb_decisions"]["pid"].to_list() == [100, 101, 102, 103, 104]
    # the fourth decision is on line 9 of the file (count them above)
    bad = rows[3].split(",")
    bad[header.split(",").index("can_migrate")] = "7"
    lines[8] = ",".join(bad)
    raw.write_text("\n".join(lines) + "\n")
    assert _refused(tmp_path, raw) == f"{raw}: column can_migrate, row 4 (line 9): 7 is not 0 or 1"


def test_import_names_a_line_whose_fields_are_not_the_headers(tmp_path: Path) -> None:
    header, *rows = RAW.read_text().splitlines()
    width = header.count(",") + 1
    raw = tmp_path / "raw_ragged.csv"
    for changed, fields in ((rows[2] + ",9", width + 1), (rows[2].rsplit(",", 1)[0], width - 1)):
        lines = [header, "", *rows[:2], changed, *rows[3:]]
        raw.write_text("\n".join(lines) + "\n")
        assert _refused(tmp_path, raw) == f"{raw}: line 5 has {fields} fields, the header {width}"
    empty = tmp_path / "raw_empty.csv"
    empty.write_text("\n \n")
    assert _refused(tmp_path, empty) == f"{empty} is empty: no header, no decisions"


def test_import_keeps_mllb_signed_columns_negative(tmp_path: Path) -> None:
    # delta (s64), delta_faults (dst - src) and imbalance (long) may be negative
    raw = _raw_with(tmp_path, 3, delta="-1500", delta_faults="-9", imbalance="-4")
    r = _invoke("import-mllb", raw, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    (folder,) = (tmp_path / "out" / "curated" / "benchmark=mllb-import").iterdir()
    rows = read_collection(folder)["lb_decisions"].row(2, named=True)
    assert (rows["delta_ns"], rows["delta_faults"], rows["imbalance"]) == (-1500, -9, -4)


@pytest.mark.parametrize("cid", ["../../evil", "a/b", ".."])
def test_import_refuses_an_id_that_is_not_one_name(tmp_path: Path, cid: str) -> None:
    # the manifest's rule, checked before the folder is made: nothing written anywhere
    r = _invoke("import-mllb", RAW, "--collection-id", cid, "-o", tmp_path / "out")
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    assert r.stderr == (
        f"error: bad collection id {cid!r}: a collection id is one name: no '/', not '.' or '..'\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_train_export_report(data: Path, tmp_path: Path) -> None:
    model = tmp_path / "m.json"
    r = _invoke("train", data, "-o", model, "--test-collection", "syn-2", "--epochs", "15")
    assert r.exit_code == 0, r.output
    assert "[[tn, fp], [fn, tp]]" in r.output  # printed, not eaten as markup
    doc = json.loads(model.read_text())
    test = doc["meta"]["report"]["test"]
    # the counts printed are the test run's own labels, counted here
    labels = read_collection(data / "curated" / "benchmark=synthetic" / "collection_id=syn-2")[
        "lb_decisions"
    ]["can_migrate"]
    stay, move = int((labels == 0).sum()), int((labels == 1).sum())
    assert f"test: 1,500 decisions ({stay:,} stay, {move:,} migrate) from 1 collection(s)" in (
        r.output
    )
    # model, the hand rule and the majority baseline side by side, balanced accuracy first
    scored = [ln for ln in r.output.splitlines() if "balanced" in ln]
    lines = {ln.split("balanced")[0].strip(): ln for ln in scored}
    for name in ("model (float)", "model (fixed Q20.11)", "hand rule (15 features)",
                 "always the commoner"):  # fmt: skip
        assert name in lines, r.output
    assert "balanced  50.00%" in lines["always the commoner"]  # one class always: 50%
    assert "balanced 100.00%" in lines["hand rule (15 features)"]  # labelled by the rule
    m = test["majority"]
    assert m["recall_per_class"]["stay" if move >= stay else "migrate"] == 0.0
    assert test["rule"]["balanced_accuracy"] == 1.0
    assert doc["meta"]["report"]["test"]["collections"] == ["syn-2"]
    assert doc["meta"]["report"]["test"]["float"]["accuracy"] >= 0.95  # 15 epochs: a smoke test

    out = tmp_path / "export"
    r = _invoke("export", model, "-o", out, "--name", "m")
    assert r.exit_code == 0, r.output
    assert "float vs fixed on 1,500 decisions" in r.output  # the model's test run
    header = (out / "m.h").read_text()
    assert "#define KMO_LB_FBITS 11" in header and "dtype w1[] = {" in header
    q = json.loads((out / "m.q11.json").read_text())
    assert q["fbits"] == 11 and len(q["w1"]) == 15 and len(q["w1"][0]) == 10
    assert q["meta"]["float_vs_fixed"]["agreement"] >= 0.999

    rep = tmp_path / "report.json"
    r = _invoke("report", data, "--model", model, "--json", rep)
    assert r.exit_code == 0, r.output
    body = json.loads(rep.read_text())
    assert [c["collection_id"] for c in body["collections"]] == ["syn-0", "syn-1", "syn-2"]
    assert all(c["rule_accuracy"] == 1.0 for c in body["collections"])
    assert body["collections"][2]["stay"] == stay  # counted from the same rows above
    assert body["collections"][2]["scenario"] is None  # no stress-ng run behind these
    # all filtered rows: the rule labelled them (100%), the majority baseline is 50% balanced
    assert body["hand_rule"]["balanced_accuracy"] == 1.0
    assert body["majority"]["balanced_accuracy"] == 0.5
    assert body["model"]["rows"] == body["hand_rule"]["rows"] == 4500
    assert "always the commoner" in r.output and "hand rule (15 features)" in r.output


def test_train_needs_two_runs_to_split(data: Path, tmp_path: Path) -> None:
    one = data / "curated" / "benchmark=synthetic" / "collection_id=syn-0"
    r = _invoke("train", one, "-o", tmp_path / "m.json")
    assert r.exit_code == 2 and "at least 2 collections" in r.output
    r = _invoke("train", tmp_path / "nothing-here", "-o", tmp_path / "m.json")
    assert r.exit_code == 2 and "no such folder" in r.output


def test_train_refuses_an_output_it_cannot_write_before_training(
    data: Path, tmp_path: Path
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    for out in (afile / "x.json", afile / "sub" / "x.json"):
        r = _invoke("train", data, "-o", out, "--epochs", "1")
        assert r.exit_code == 2, r.output
        assert (
            r.stderr == f"error: cannot write the model to {out}: {afile} is a file, not a folder\n"
        )
        assert r.stdout == "" and "decisions" not in r.output  # refused before training
    assert afile.read_text() == "mine\n" and sorted(tmp_path.iterdir()) == [afile]


def test_train_refuses_a_folder_it_may_not_write_in(data: Path) -> None:
    # root writes in any folder: run by nobody (setpriv drops every capability), in a
    # folder of root's that nobody may read but not write
    top = Path(tempfile.mkdtemp(prefix="kmo-lb-locked-"))
    try:
        top.chmod(0o755)
        shutil.copytree(data, top / "data")
        for p in [top / "data", *(top / "data").rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        locked = top / "locked"
        locked.mkdir(mode=0o755)
        out = locked / "new" / "m.json"
        argv = [sys.executable, "-m", "kernmlops", "lb", "train", str(top / "data"), "-o",
                str(out), "--epochs", "1"]  # fmt: skip
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            assert setpriv, "setpriv (util-linux) is needed to train as nobody"
            argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/",
                           env={**os.environ, "COLUMNS": "400"})  # fmt: skip
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith(f"error: cannot write the model to {out}: ") and (
            "ermission denied" in r.stderr
        ), r.stderr
        assert r.stderr.count("\n") == 1 and "decisions" not in r.stdout  # before training
        assert list(locked.iterdir()) == []
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_train_says_in_one_line_when_the_model_cannot_be_saved(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import kernmlops.lb.model

    def read_only(path, data, **kw):  # the mount turned read-only during the training
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(kernmlops.lb.model, "write_atomic", read_only)
    out = tmp_path / "m.json"
    r = _invoke("train", data, "-o", out, "--epochs", "1")
    assert r.exit_code == 2, r.output
    assert r.stderr == f"error: cannot write the model to {out}: Read-only file system\n"
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--epochs", "0"), ("--epochs", "-1"), ("--migration-cost-ns", "-5"),
     ("--migration-cost-ns", "0")],
)  # fmt: skip
def test_train_refuses_no_epochs_and_a_cost_below_1(
    data: Path, tmp_path: Path, option: str, value: str
) -> None:
    # 0 epochs saved the random start as a model; the cost's range is lb deploy's
    out = tmp_path / "m.json"
    r = _invoke("train", data, "-o", out, option, value)
    assert r.exit_code == 2
    assert f"Invalid value for '{option}': {value} is not in the range x>=1" in r.output
    assert not out.exists()


def test_collect_refuses_a_cost_below_1(tmp_path: Path) -> None:
    r = _invoke("collect", "--migration-cost-ns", "-5", "-o", tmp_path / "d", "--", "true")
    assert r.exit_code == 2
    assert "Invalid value for '--migration-cost-ns': -5 is not in the range x>=1" in r.output
    assert not (tmp_path / "d").exists()


def test_shadow_needs_a_readable_model(tmp_path: Path) -> None:
    bad = tmp_path / "m.json"
    bad.write_text("not json")
    r = _invoke("shadow", bad, "-o", tmp_path, "--no-progress", "--", "true")
    assert r.exit_code == 2 and "is not a model: not JSON" in r.output


@pytest.mark.parametrize("command", ["shadow", "collect"])
def test_a_model_of_12_hidden_units_is_refused_before_anything_runs(
    tmp_path: Path, command: str
) -> None:
    """A valid float model of 12 hidden units got as far as "lb collect 1/1 ..." and the
    BPF hook's refusal; the kernel's arrays hold 10."""
    import numpy as np

    from kernmlops.lb.model import Model

    model = Model(np.zeros((15, 12)), np.zeros(12), np.zeros(12), 0.0).save(tmp_path / "m.json")
    args = [model] if command == "shadow" else ["--model", model]
    r = _invoke(command, *args, "-o", tmp_path / "d", "--no-progress", "--", "true")
    assert r.exit_code == 2, r.output
    assert r.output == f"error: {model}: 12 hidden units; the model in the kernel has MLLB's 10\n"
    assert not (tmp_path / "d").exists()


def test_train_uses_the_recorded_migration_cost(tmp_path: Path) -> None:
    # rows labelled by the rule with a 10 ms hot window: trained at the recorded
    # 10 ms the hand rule is exact; two costs in one data set are refused
    for i in range(2):
        frame = synthetic_decisions(600, f"c-{i}", seed=60 + i, migration_cost_ns=10_000_000)
        lb = {"variant": "kprobe", "migration_cost_ns": 10_000_000}
        write_decisions(frame, tmp_path / "a", f"c-{i}", "synthetic", {"lb": lb})
    r = _invoke("train", tmp_path / "a", "-o", tmp_path / "m.json", "--epochs", "3", "--balanced")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "m.json").read_text())["meta"]["report"]
    assert rep["migration_cost_ns"] == 10_000_000
    assert rep["test"]["rule"]["balanced_accuracy"] == 1.0
    r = _invoke("report", tmp_path / "a", "--json", tmp_path / "r.json")  # no model: recorded cost
    assert json.loads((tmp_path / "r.json").read_text())["hand_rule"]["balanced_accuracy"] == 1.0
    # a model trained at another cost changes neither the rule's score on these data nor
    # the hot window its own features use: the kernel's, recorded (it took the model's,
    # and the rule's column moved with --model)
    doc = json.loads((tmp_path / "m.json").read_text())
    doc["meta"]["migration_cost_ns"] = 500_000
    (tmp_path / "m500.json").write_text(json.dumps(doc))
    r = _invoke(
        "report", tmp_path / "a", "--model", tmp_path / "m500.json", "--json", tmp_path / "r.json"
    )
    assert r.exit_code == 0, r.output
    with_model = json.loads((tmp_path / "r.json").read_text())
    assert with_model["hand_rule"]["balanced_accuracy"] == 1.0
    assert [c["rule_accuracy"] for c in with_model["collections"]] == [1.0, 1.0]
    import polars as pl

    from kernmlops.lb.features import LABEL, float_features
    from kernmlops.lb.model import Model
    from kernmlops.lb.pipeline import prepare

    folders = sorted((tmp_path / "a").rglob("collection_id=*"))
    rows = pl.concat([read_collection(f)["lb_decisions"] for f in folders], how="diagonal_relaxed")
    kept = prepare(rows)
    pred = Model.load(tmp_path / "m.json").predict(float_features(kept, 10_000_000))
    assert with_model["model"]["accuracy"] == float((pred == kept[LABEL].to_numpy()).mean())
    other = {"variant": "kprobe", "migration_cost_ns": 500_000}
    frame = synthetic_decisions(100, "c-9", seed=9)
    write_decisions(frame, tmp_path / "a", "c-9", "synthetic", {"lb": other})
    r = _invoke("train", tmp_path / "a", "-o", tmp_path / "m.json")
    assert r.exit_code == 2 and "different migration costs (500,000, 10,000,000 ns)" in r.output


NOBODY = 65534
SUDO = {"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY), "SUDO_USER": "nobody"}


@pytest.mark.skipif(os.geteuid() != 0, reason="plays sudo: needs root")
def test_train_names_the_collection_whose_column_is_missing(tmp_path: Path) -> None:
    """A part without src_load read as nulls, and the error pointed a command-line user
    at a Python function without saying which collection it was."""
    for i in range(2):
        frame = synthetic_decisions(50, f"c-{i}", seed=i)
        write_decisions(frame.drop("src_load") if i else frame, tmp_path, f"c-{i}", "s", {})
    r = CliRunner().invoke(lb_group, ["train", str(tmp_path), "-o", str(tmp_path / "m.json")])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: 50 decisions in collection c-1 have no src_load"), r.stderr
    assert "their lb_decisions lack it or leave it empty" in r.stderr
    assert not (tmp_path / "m.json").exists()


def test_export_data_that_is_not_there_is_an_error(data: Path, tmp_path: Path) -> None:
    """--data with a typo was skipped in silence: exit 0, no check, and '(pass --data)'."""
    model = tmp_path / "m.json"
    assert _invoke("train", data, "-o", model, "--epochs", "2").exit_code == 0
    out = tmp_path / "out"
    r = CliRunner().invoke(
        lb_group, ["export", str(model), "-o", str(out), "--data", str(data) + "x"]
    )
    assert r.exit_code == 2, r.output
    assert r.stderr == f"error: --data {data}x: no such file or folder\n"
    assert not out.exists()  # refused before anything was written
    # the model's own data moved away: exported, and the reason the check is missing said
    doc = json.loads(model.read_text())
    doc["meta"]["report"]["sources"] = [str(tmp_path / "moved")]
    model.write_text(json.dumps(doc))
    r = _invoke("export", model, "-o", out)
    assert r.exit_code == 0, r.output
    assert f"the model's training data ({tmp_path}/moved) is not all here" in r.output


def test_report_json_that_cannot_be_written_is_one_line(data: Path, tmp_path: Path) -> None:
    """--json into a folder that was not there was a FileNotFoundError traceback: the
    folder is made now (as lb train -o and lb export -o make theirs); a file in the way
    is one error line."""
    r = _invoke("report", data, "--json", tmp_path / "no" / "r.json")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "no" / "r.json").read_text())["collections"]
    (tmp_path / "file").write_text("")
    bad = tmp_path / "file" / "r.json"
    r = CliRunner().invoke(lb_group, ["report", str(data), "--json", str(bad)])
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert "lb decisions" in r.stdout  # the report itself was said
    assert r.stderr == (
        f"error: cannot write to {tmp_path}/file: {tmp_path}/file is a file, not a folder\n"
    )
    # a link planted at the name is replaced, not written through
    target, link = tmp_path / "victim", tmp_path / "r.json"
    target.write_text("keep\n")
    link.symlink_to(target)
    assert _invoke("report", data, "--json", link).exit_code == 0
    assert target.read_text() == "keep\n"
    assert json.loads(link.read_text())["collections"]


def test_export_says_when_a_sum_outgrows_int32(tmp_path: Path) -> None:
    """A sum past 2^31 was printed as "largest int32 sum 107,374,050,000 (< 2^31)"."""
    import numpy as np
    import polars as pl

    from kernmlops.lb.model import Model

    w1 = np.zeros((15, 10))
    w1[9] = 5000.0  # src_load
    model = tmp_path / "m.json"
    Model(w1=w1, b1=np.zeros(10), w2=np.ones(10), b2=0.0, meta={}).save(model)
    frame = synthetic_decisions(4, "big-load", seed=1).with_columns(
        pl.lit(10**9, pl.Int64).alias("src_load"),
        pl.lit(0, pl.Int8).alias("p_running"),
        pl.lit(1, pl.Int8).alias("test_aggressive"),
    )
    write_decisions(frame, tmp_path / "data", "big-load", "synthetic", {})
    r = _invoke("export", model, "-o", tmp_path / "out", "--data", tmp_path / "data")
    assert r.exit_code == 0, r.output
    # src_load saturates at 2^20 - 1: Q20.11 (2^20 - 1) * 2048 // 1000 = 2,147,481; each
    # hidden unit 2,147,481 * 5000, the output ten of them (w2 = 1) and, in MLLB's
    # patch, its b2 (ours + 0.5: 1024)
    assert 2_147_481 == (2**20 - 1) * 2048 // 1000
    assert f"largest int32 sum {10 * 2_147_481 * 5000 + 1024:,} >= 2^31" in r.output
    assert "(< 2^31)" not in r.output
    assert "warning: a sum on these decisions does not fit an int32" in r.output


def test_export_under_sudo_writes_through_no_planted_link(tmp_path: Path) -> None:
    """``sudo kernmlops lb export M -o ~/out`` with ~/out a link of the user's to a
    folder of root's: refused in one line, root's file as it was; into a new folder
    the files and the folders made are the user's; --name is a file name only."""
    import numpy as np

    from kernmlops.lb.model import Model

    model = Model(np.zeros((15, 10)), np.zeros(10), np.zeros(10), 0.0).save(tmp_path / "m.json")
    tmp_path.chmod(0o755)
    user, victim = tmp_path / "alice", tmp_path / "root-only"
    user.mkdir()
    os.chown(user, NOBODY, NOBODY)
    victim.mkdir(mode=0o700)
    (victim / "m.h").write_text("root's own\n")
    (user / "out").symlink_to(victim)
    os.chown(user / "out", NOBODY, NOBODY, follow_symlinks=False)
    runner = CliRunner(env=SUDO)
    r = runner.invoke(lb_group, ["export", str(model), "-o", str(user / "out"), "--name", "m"])
    assert r.exit_code == 2, r.output
    assert f"{user / 'out'} is a link in a folder nobody can change" in r.output
    assert sorted(p.name for p in victim.iterdir()) == ["m.h"]
    assert (victim / "m.h").read_text() == "root's own\n"
    for name in ("../../root-only/m", ".m"):
        r = runner.invoke(lb_group, ["export", str(model), "-o", str(user / "new"), "--name", name])
        assert r.exit_code == 2 and "a file name" in r.output, r.output
    assert (victim / "m.h").read_text() == "root's own\n" and not (user / "new").exists()
    r = runner.invoke(lb_group, ["export", str(model), "-o", str(user / "new" / "x")])
    assert r.exit_code == 0, r.output
    made = [user / "new", user / "new" / "x", *(user / "new" / "x").iterdir()]
    assert len(made) == 4 and {p.lstat().st_uid for p in made} == {NOBODY}, made


def test_train_prints_what_its_help_promises(data: Path, tmp_path: Path) -> None:
    """Its help promised "accuracy, precision, recall, F1" on the test runs: neither
    precision nor F1 was printed (they are in the model file)."""
    helped = _invoke("train", "--help").output.split("Examples:")[0]
    out = _invoke("train", data, "-o", tmp_path / "m.json", "--epochs", "2").output
    shown = {"balanced accuracy": "balanced", "recall": "recall", "precision": "precision",
             "F1": "F1", "confusion matrix": "[[tn, fp], [fn, tp]]"}  # fmt: skip
    promised = [w for w in shown if w in " ".join(helped.split()).split("(precision")[0]]
    assert "balanced accuracy" in promised
    assert [w for w in promised if shown[w] not in out] == []
    meta = json.loads((tmp_path / "m.json").read_text())["meta"]["report"]["test"]["float"]
    assert {"precision", "f1"} <= meta.keys()  # where the help says they are


def test_train_report_and_import_under_sudo_are_the_users(data: Path, tmp_path: Path) -> None:
    """Under sudo the model, the report and the imported collection (and the folders
    made for them) were root's in the user's folder: the user's next import there
    without sudo could not make its collection under root's benchmark=mllb-import."""
    tmp_path.chmod(0o755)
    user = tmp_path / "alice"
    user.mkdir()
    os.chown(user, NOBODY, NOBODY)
    runner = CliRunner(env=SUDO)
    for args in (
        ["train", str(data), "-o", str(user / "models" / "m.json"), "--epochs", "2"],
        ["report", str(data), "--json", str(user / "r.json")],
        ["import-mllb", str(RAW), "-o", str(user / "mllb")],
    ):
        r = runner.invoke(lb_group, args)
        assert r.exit_code == 0, r.output
    assert "-> " + str(user / "mllb" / "curated") in r.output  # the path as named
    made = list(user.rglob("*"))
    # models/, m.json, r.json; mllb/curated/benchmark=/collection_id=/lb_decisions/ + 2 files
    assert len(made) == 10
    assert {p: p.lstat().st_uid for p in made} == {p: NOBODY for p in made}


@pytest.mark.parametrize("value", ["0", "1", "1.5"])
def test_train_says_the_test_fraction_excludes_0_and_1(
    data: Path, tmp_path: Path, value: str
) -> None:
    r = _invoke("train", data, "-o", tmp_path / "m.json", "--test-fraction", value)
    assert r.exit_code == 2
    assert r.stderr.splitlines()[-1] == (
        f"Error: Invalid value for '--test-fraction': {float(value)} is not in the range 0<x<1."
    )
    assert not (tmp_path / "m.json").exists()


def _q11_doc(seed: int) -> dict:
    """A Q20.11 model file of lb export's format, with integers drawn here."""
    import numpy as np

    from kernmlops.lb.fixed import FixedModel, fixed_json

    rng = np.random.default_rng(seed)
    fixed = FixedModel(
        w1=rng.integers(-3000, 3000, (15, 10)), b1=rng.integers(-1000, 1000, 10),
        w2=rng.integers(-3000, 3000, 10), b2=int(rng.integers(-500, 500)),
    )  # fmt: skip
    return fixed_json(fixed, {"migration_cost_ns": 500_000})


def test_report_scores_a_q11_model_in_fixed_point(data: Path, tmp_path: Path) -> None:
    from kernmlops.lb.dataset import load_decisions
    from kernmlops.lb.pipeline import prepare
    from tests.lb import q11

    doc = _q11_doc(7)
    model = tmp_path / "m.q11.json"
    model.write_text(json.dumps(doc))
    rep = tmp_path / "rep.json"
    r = _invoke("report", data, "--model", model, "--json", rep)
    assert r.exit_code == 0, r.output  # was: "is not a kernmlops lb model"
    body = json.loads(rep.read_text())
    assert body["model_kind"] == "fixed point (Q20.11, as the kernel computes it)"
    assert f"  model: {model}, evaluated in fixed point (Q20.11, as the kernel computes it)\n" in (
        r.stdout
    )
    # the same rows scored here, one by one, with this file's integers
    rows = prepare(load_decisions([data])).sort("collection_id")
    confusion = [[0, 0], [0, 0]]
    per_collection: dict[str, list[int]] = {}
    for row in rows.iter_rows(named=True):
        out = q11.logit(q11.features(row, 500_000), doc["w1"], doc["b1"], doc["w2"], doc["b2"])
        pred, label = int(out > 0), row["can_migrate"]
        confusion[label][pred] += 1
        per_collection.setdefault(row["collection_id"], []).append(int(pred == label))
    assert 0 < confusion[0][0] + confusion[1][1] < rows.height  # a model that errs, sometimes
    assert body["model"]["confusion"] == confusion
    for c in body["collections"]:
        hits = per_collection[c["collection_id"]]
        assert c["model_accuracy"] == pytest.approx(sum(hits) / len(hits))


def test_report_table_and_scores_are_one_text(data: Path) -> None:
    r = _invoke("report", data)
    assert r.exit_code == 0, r.output
    # the table's closing border, its line's end, then the scores under it
    assert "┘\nall filtered decisions (accuracy columns above; balanced here):\n  hand rule" in (
        r.stdout
    )


@pytest.mark.parametrize("command", ["train", "report"])
def test_a_partial_collection_is_one_warning_line(data: Path, tmp_path: Path, command: str) -> None:
    root = tmp_path / "data"
    shutil.copytree(data, root)
    folder = root / "curated" / "benchmark=synthetic" / "collection_id=syn-1"
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["state"] = "running"  # its collector died: read as far as flushed
    (folder / "manifest.json").write_text(json.dumps(manifest))
    args = ["-o", str(tmp_path / "m.json"), "--test-collection", "syn-2", "--epochs", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", "lb", command, str(root),
         *(args if command == "train" else [])],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # as `graph` says it: not Python's "<file>:<line>: IncompleteCollectionWarning: ..." and
    # the source line that warned
    assert "IncompleteCollectionWarning" not in done.stderr
    warned = [line for line in done.stderr.splitlines() if "not whole" in line]
    assert warned == [
        f"warning: {root / 'curated'}: 1 of the 3 collections read are not whole (read as far "
        f"as they are): {folder} (its collector stopped without finishing)"
    ], done.stderr


def test_report_scores_each_collection_at_its_own_recorded_cost(tmp_path: Path) -> None:
    """A lab folder with runs at 10 ms and at 500 us: lb report refused it, telling
    to "pass --migration-cost-ns", an option it does not have."""
    for cid, cost in (("c-10ms", 10_000_000), ("c-500us", 500_000)):
        frame = synthetic_decisions(400, cid, seed=len(cid), migration_cost_ns=cost)
        lb = {"variant": "kprobe", "migration_cost_ns": cost}
        write_decisions(frame, tmp_path, cid, "synthetic", {"lb": lb})
    r = _invoke("report", tmp_path, "--json", tmp_path / "r.json")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    # labelled by the kernel's rule at each one's own cost: the rule agrees everywhere
    assert [(c["collection_id"], c["rule_accuracy"]) for c in rep["collections"]] == [
        ("c-10ms", 1.0), ("c-500us", 1.0),
    ]  # fmt: skip
    assert rep["hand_rule"]["accuracy"] == 1.0 and rep["hand_rule"]["rows"] == sum(
        c["filtered"] for c in rep["collections"]
    )


def test_a_manifest_the_recorded_cost_cannot_read_is_named_in_one_line(tmp_path: Path) -> None:
    """The cost the readable manifests agree on is used; each one not read (not JSON,
    a link) is named in one warning line, as `kernmlops lb report` says it."""
    from kernmlops.cli import cli

    frame = synthetic_decisions(100, "c-0", seed=5)
    write_decisions(frame, tmp_path, "c-0", "synthetic",
                    {"lb": {"variant": "kprobe", "migration_cost_ns": 250_000}})  # fmt: skip
    broken = tmp_path / "curated" / "benchmark=x" / "collection_id=c-1" / "manifest.json"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"lb": {"migration_cost_ns": 5')  # cut short
    linked = tmp_path / "curated" / "benchmark=x" / "collection_id=c-2" / "manifest.json"
    linked.parent.mkdir(parents=True)
    linked.symlink_to(broken)
    with pytest.warns(KernmlopsWarning) as said:
        assert recorded_cost([tmp_path]) == 250_000
    assert sorted(str(w.message) for w in said) == [
        f"{broken}: not read (not a JSON object): its recorded migration cost is left out",
        f"{linked}: not read (Too many levels of symbolic links): its recorded migration "
        "cost is left out",
    ]
    r = CliRunner().invoke(cli, ["lb", "report", str(tmp_path), "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    lines = sorted(line for line in r.output.splitlines() if line.startswith("warning:"))
    assert lines == [f"warning: {m}" for m in sorted(str(w.message) for w in said)], r.output


def test_the_kmod_folder_default_the_help_names_is_the_one_used_outside_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue: --help said "default: build/kmod", a folder of the source checkout; an
    # installed wheel builds in the user's cache
    from kernmlops.lb import deploy

    monkeypatch.delenv("KERNMLOPS_KMOD_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    # the module as an installed wheel places it: no pyproject.toml three folders up
    monkeypatch.setattr(deploy, "__file__", str(tmp_path / "a" / "b" / "c" / "deploy.py"))
    used = deploy.default_build_dir()
    for argv in (["build-kmod", "--help"], ["deploy", "--help"]):
        said = " ".join(CliRunner().invoke(lb_group, argv, terminal_width=200).output.split())
        named = re.findall(r"else (~/\S+?)\)", said)
        assert [Path(os.path.expanduser(n)) for n in named] == [used], said
        assert "$KERNMLOPS_KMOD_DIR" in said
