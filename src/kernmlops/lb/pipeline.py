"""Decisions -> features -> model -> metrics, fixed point included.

The library behind ``lb train``, ``lb export`` and ``lb report``: every
step a notebook can call alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from kernmlops import __version__
from kernmlops.lb.features import (
    LABEL,
    MIGRATION_COST_NS,
    FeatureError,
    fixed_features,
    float_features,
    mllb_filter,
    rule_decision,
)
from kernmlops.lb.fixed import FixedModel, agreement
from kernmlops.lb.model import (
    Model,
    ModelError,
    TrainConfig,
    metrics,
    split_by_collection,
    split_rows,
    train,
)


def prepare(decisions: pl.DataFrame, *, impute: bool = True) -> pl.DataFrame:
    """MLLB's filter, then (approximate sources only) the missing columns
    filled as the tracepoint shadow program fills them."""
    from kernmlops.lb.dataset import impute_missing

    kept = mllb_filter(decisions).filter(pl.col(LABEL).is_not_null())
    if impute:
        kept = impute_missing(kept)
    return kept


@dataclass
class TrainResult:
    model: Model
    fixed: FixedModel
    report: dict[str, Any]


def _per_collection(frame: pl.DataFrame, pred: np.ndarray) -> dict[str, Any]:
    out = {}
    cols = frame["collection_id"].to_numpy()
    y = frame[LABEL].to_numpy()
    for c in sorted(set(cols)):
        m = cols == c
        out[str(c)] = metrics(y[m], pred[m])["accuracy"]
    return out


def evaluate(
    model: Model,
    fixed: FixedModel,
    frame: pl.DataFrame,
    migration_cost_ns: int = MIGRATION_COST_NS,
) -> dict[str, Any]:
    """Float and fixed metrics, float vs fixed agreement, and beside them the
    two baselines: MLLB's hand rule on the same 15 features (CFS's heuristic
    as the features can express it) and always answering the commoner label."""
    x = float_features(frame, migration_cost_ns)
    xq = fixed_features(frame, migration_cost_ns)
    y = frame[LABEL].to_numpy()
    pred = model.predict(x)
    commoner = int(y.mean() >= 0.5) if len(y) else 1
    return {
        "float": metrics(y, pred),
        "fixed": metrics(y, fixed.predict(xq)),
        "float_vs_fixed": agreement(model, fixed, x, xq),
        "rule": metrics(y, rule_decision(x)),
        # what always answering the commoner label scores: the bar to clear
        "majority_baseline": float(max(y.mean(), 1 - y.mean())) if len(y) else None,
        "majority": metrics(y, np.full(len(y), commoner)),
        "per_collection_accuracy": _per_collection(frame, pred),
    }


def train_model(
    decisions: pl.DataFrame,
    *,
    split: str = "collection",
    test_collections: list[str] | None = None,
    test_fraction: float = 0.25,
    seed: int = 0,
    config: TrainConfig | None = None,
    migration_cost_ns: int = MIGRATION_COST_NS,
    sources: list[str] | None = None,
) -> TrainResult:
    """Train on part of the decisions, test on the rest (other runs by
    default), and quantize; the report holds every number."""
    frame = prepare(decisions)
    if frame.height < 2:
        raise ModelError(
            f"{frame.height} decisions pass MLLB's filter (of {decisions.height}): too few to train"
        )
    cols = frame["collection_id"].fill_null("").to_numpy()
    if split == "collection":
        is_train, is_test, train_ids, test_ids = split_by_collection(
            cols, test_fraction, seed, test_collections
        )
    elif split == "rows":
        is_train, is_test = split_rows(frame.height, test_fraction, seed)
        train_ids = test_ids = sorted({str(c) for c in cols})
    else:
        raise ModelError(f"split must be 'collection' or 'rows', not {split!r}")
    train_frame, test_frame = frame.filter(pl.Series(is_train)), frame.filter(pl.Series(is_test))
    try:
        x = float_features(train_frame, migration_cost_ns)
    except FeatureError as err:
        raise ModelError(str(err)) from err
    y = train_frame[LABEL].to_numpy()
    if len(set(y.tolist())) < 2:
        raise ModelError(f"the training rows have one label only ({int(y[0])}): nothing to learn")
    cfg = config or TrainConfig(seed=seed)
    model = train(x, y, cfg)
    fixed = FixedModel.from_model(model)
    report = {
        "kernmlops": __version__,
        "migration_cost_ns": migration_cost_ns,
        "split": split,
        "sources": sources or [],
        "decisions": decisions.height,
        "filtered": frame.height,
        "variants": sorted({str(v) for v in frame["variant"].drop_nulls().unique()}),
        "train": {
            "collections": train_ids,
            "rows": train_frame.height,
            **evaluate(model, fixed, train_frame, migration_cost_ns),
        },
        "test": {
            "collections": test_ids,
            "rows": test_frame.height,
            **(evaluate(model, fixed, test_frame, migration_cost_ns) if test_frame.height else {}),
        },
    }
    model.meta.update(
        {
            "kernmlops": __version__,
            "migration_cost_ns": migration_cost_ns,
            "test_accuracy": report["test"].get("float", {}).get("accuracy"),
            "source": ",".join(report["variants"]),
            "report": report,
        }
    )
    return TrainResult(model, fixed, report)
