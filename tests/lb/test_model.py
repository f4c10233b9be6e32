"""Training the 15 -> 10 -> 1 MLP on a rule-generated data set, split by run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.lb.dataset import synthetic_decisions
from kernmlops.lb.features import LABEL, float_features, rule_decision
from kernmlops.lb.model import (
    Model,
    ModelError,
    TrainConfig,
    metrics,
    split_by_collection,
    train,
)
from kernmlops.lb.pipeline import train_model

FAST = TrainConfig(epochs=25, seeds=2, batch=256)


@pytest.fixture(scope="module")
def runs() -> pl.DataFrame:
    """Four 'runs' of rule-labelled decisions, each its own collection."""
    return pl.concat([synthetic_decisions(3000, f"run-{i}", seed=10 + i) for i in range(4)])


@pytest.fixture(scope="module")
def trained(runs: pl.DataFrame):
    return train_model(runs, test_collections=["run-3"], config=FAST)


def test_rule_labels_are_the_kernel_rule(runs: pl.DataFrame) -> None:
    # the generator labels with the rule; both classes are well represented
    y = runs[LABEL].to_numpy()
    assert 0.3 < y.mean() < 0.8
    assert (rule_decision(float_features(runs)) == y).all()


def test_reaches_99_percent_on_an_unseen_run(trained) -> None:
    test = trained.report["test"]
    assert test["collections"] == ["run-3"]
    assert trained.report["train"]["collections"] == ["run-0", "run-1", "run-2"]
    assert test["rows"] == 3000
    assert test["float"]["accuracy"] >= 0.99
    assert test["fixed"]["accuracy"] >= 0.99
    tn, fp = test["float"]["confusion"][0]
    fn, tp = test["float"]["confusion"][1]
    assert tn + fp + fn + tp == 3000
    assert test["float"]["precision"] == pytest.approx(tp / (tp + fp))
    assert test["float"]["recall"] == pytest.approx(tp / (tp + fn))


def test_model_shape_and_round_trip(trained, tmp_path: Path, runs: pl.DataFrame) -> None:
    m = trained.model
    assert m.w1.shape == (15, 10) and m.b1.shape == (10,) and m.w2.shape == (10,)
    path = m.save(tmp_path / "m.json")
    back = Model.load(path)
    x = float_features(runs.head(500))
    np.testing.assert_array_equal(back.logits(x), m.logits(x))
    assert back.meta["report"]["test"]["collections"] == ["run-3"]


def test_metrics_by_hand() -> None:
    m = metrics(np.array([1, 1, 0, 0, 1]), np.array([1, 0, 0, 1, 1]))
    assert m["confusion"] == [[1, 1], [1, 2]]
    assert m["accuracy"] == pytest.approx(3 / 5)
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3)
    # stay: 1 of 2 right; migrate: 2 of 3
    assert m["recall_per_class"] == {"stay": pytest.approx(1 / 2), "migrate": pytest.approx(2 / 3)}
    assert m["balanced_accuracy"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert (m["positives"], m["negatives"]) == (3, 2)
    # always "migrate" on 96% migrate: accuracy 96%, balanced accuracy 50%
    y = np.array([1] * 96 + [0] * 4)
    always = metrics(y, np.ones(100))
    assert always["accuracy"] == pytest.approx(0.96)
    assert always["balanced_accuracy"] == pytest.approx(0.5)
    assert always["recall_per_class"] == {"stay": 0.0, "migrate": 1.0}
    assert metrics(np.ones(3), np.ones(3))["balanced_accuracy"] == 1.0  # one class present


def test_split_keeps_runs_whole() -> None:
    cols = np.array(["a", "a", "b", "c", "c", "d"])
    train, test, train_ids, test_ids = split_by_collection(cols, 0.25, seed=3)
    assert len(test_ids) == 1 and len(train_ids) == 3
    for c in set(cols):
        side = test[cols == c]
        assert side.all() or not side.any()
    assert (train ^ test).all()


def test_split_needs_two_runs() -> None:
    with pytest.raises(ModelError, match="at least 2 collections"):
        split_by_collection(np.array(["only", "only"]))
    with pytest.raises(ModelError, match="not in the data"):
        split_by_collection(np.array(["a", "b"]), test=["zzz"])


def test_one_label_only_is_refused(runs: pl.DataFrame) -> None:
    ones = runs.filter(pl.col(LABEL) == 1)
    with pytest.raises(ModelError, match="one label only"):
        train_model(ones, config=FAST)


@pytest.mark.parametrize("epochs", [0, -1])
def test_no_epoch_is_refused(runs: pl.DataFrame, epochs: int) -> None:
    # no epoch: the random start would be returned as the model
    with pytest.raises(ModelError, match=f"epochs must be at least 1, got {epochs}"):
        train_model(runs, config=TrainConfig(epochs=epochs, seeds=1))


def test_bad_model_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "m.json"
    bad.write_text('{"format": "something-else"}')
    with pytest.raises(ModelError, match="not a kernmlops lb model"):
        Model.load(bad)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"b2": None}, "no b2"),
        ({"w1": [[0.0] * 10] * 14 + [[0.0] * 9]}, "w1 must be 15x10 numbers, its rows differ"),
        ({"b1": [0.0] * 9}, "b1 is 9 numbers, must be 10 numbers"),
        ({"w2": "x"}, 'w2 holds "x", not a number'),
    ],
)
def test_wrong_weights_are_a_model_error(tmp_path: Path, change: dict, message: str) -> None:
    doc = Model(np.zeros((15, 10)), np.zeros(10), np.zeros(10), 0.0).to_json()
    doc.update(change)
    doc = {k: v for k, v in doc.items() if v is not None}
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ModelError, match=message):
        Model.load(bad)


def test_balanced_weights_make_the_rare_class_weigh_as_much() -> None:
    from kernmlops.lb.model import _class_weights

    y = np.array([1.0] * 9 + [0.0])
    w = _class_weights(y, True)
    assert w[y == 1].sum() == pytest.approx(w[y == 0].sum()) == pytest.approx(5.0)
    assert (_class_weights(y, False) == 1).all()
    assert (_class_weights(np.ones(4), True) == 1).all()  # one class: nothing to balance


def test_balanced_training_raises_the_rare_class_recall() -> None:
    # a rare class the features separate only in part: weighting trades migrate
    # recall for stay recall, as it should
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4000, 15))
    y = ((x[:, 0] + 0.8 * rng.normal(size=4000)) > -1.6).astype(float)  # ~8% stay
    plain = metrics(y, train(x, y, TrainConfig(epochs=20)).predict(x))
    weighted = metrics(y, train(x, y, TrainConfig(epochs=20, balanced=True)).predict(x))
    assert weighted["recall_per_class"]["stay"] > plain["recall_per_class"]["stay"] + 0.1
    assert weighted["balanced_accuracy"] > plain["balanced_accuracy"]


def test_a_model_q11_cannot_hold_is_a_model_error(runs: pl.DataFrame) -> None:
    """src_load 500,000 in every row but one (500,001): std 5.8e-5 of a feature of
    mean 500, so the standardization folded into layer 1 needs a bias near
    500 / 5.8e-5 = 8.7e6 > 2^20. That ended in a ValueError traceback from the
    quantizer; now one line naming the feature."""
    one = runs.filter(pl.col("collection_id").is_in(["run-0", "run-1"]))
    load = np.full(one.height, 500_000)
    load[5] = 500_001
    one = one.with_columns(pl.Series("src_load", load))
    x = float_features(one)
    assert x[:, 9].std() == pytest.approx(1e-3 * np.sqrt(1 / one.height), rel=1e-3)
    with pytest.raises(ModelError, match=r"feature src_load barely varies .*mean 500,"):
        train(x, one[LABEL].to_numpy(), FAST)
    with pytest.raises(ModelError, match=r"does not fit Q20\.11"):
        train_model(one, test_collections=["run-1"], config=FAST)


def test_no_model_is_returned_that_its_readers_refuse(
    runs: pl.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fit whose weights each fit Q20.11 but whose 64-bit forward pass overflows was
    saved by lb train and refused afterwards by lb export, lb shadow and kmo_lb."""
    import kernmlops.lb.model as model_module

    one = runs.filter(pl.col("collection_id") == "run-0")
    x = float_features(one)
    sigma = x[:, 8].std()  # src_len, standardized: the fold divides its weight by sigma

    def huge(xs, y, xv, yv, cfg, seed):  # a fit that ran away
        w1 = np.zeros((15, cfg.hidden))
        w1[8, 0] = 2000.0 * sigma  # 2000 once folded
        w2 = np.zeros(cfg.hidden)
        w2[0] = 1e5
        return [w1, np.zeros(cfg.hidden), w2, np.zeros(1)], 0.1

    monkeypatch.setattr(model_module, "_fit_one", huge)
    with pytest.raises(ModelError, match="the trained model: weights this large overflow"):
        train(x, one[LABEL].to_numpy(), FAST)
