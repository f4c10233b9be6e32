"""``lb report``: per collection, what the decisions are and how the kernel's
rule, a model and shadow mode agree with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from kernmlops.collect.manifest import MANIFEST_NAME, read_manifest
from kernmlops.errors import CollectionError
from kernmlops.lb.dataset import load_decisions, recorded_costs
from kernmlops.lb.features import (
    LABEL,
    MIGRATION_COST_NS,
    fixed_features,
    float_features,
    rule_decision,
)
from kernmlops.lb.model import Model, metrics
from kernmlops.lb.pipeline import prepare


def _manifests(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """collection_id -> its manifest's lb section (plus ``scenario``: the stress-ng
    scenario, where one ran), for every collection found (read through the typed
    manifest; a folder whose manifest does not check is skipped: its decisions
    are still reported, without the shadow columns)."""
    out: dict[str, dict[str, Any]] = {}
    for p in paths:
        for manifest in [p / MANIFEST_NAME, *p.glob(f"**/collection_id=*/{MANIFEST_NAME}")]:
            if manifest.is_file():
                try:
                    doc = read_manifest(manifest.parent)
                except CollectionError:
                    continue
                lb = doc.get("lb")
                section = dict(lb) if isinstance(lb, dict) else {}
                bench = (doc.get("config") or {}).get("benchmark") or {}
                section["scenario"] = (bench.get("stress_ng") or {}).get("scenario")
                out[str(doc.collection_id)] = section
    return out


class _Scored:
    """The model a report scores: lb train's float model, or lb export's Q20.11
    model evaluated in fixed point as the kernel evaluates it (the accuracy of
    the model deployed, not of the float one it came from)."""

    def __init__(self, path: Path) -> None:
        from kernmlops.lb.fixed import FORMAT as FIXED_FORMAT
        from kernmlops.lb.fixed import FixedModel, load_fixed_json
        from kernmlops.lb.model import ModelError
        from kernmlops.lb.weights import read_model_doc

        self.fixed: FixedModel | None = None
        self.float: Model | None = None
        if read_model_doc(path, ModelError).get("format") == FIXED_FORMAT:
            self.fixed, self.meta = load_fixed_json(path)
            self.kind = "fixed point (Q20.11, as the kernel computes it)"
        else:
            self.float = Model.load(path)
            self.meta = self.float.meta
            self.kind = "floating point (lb train's weights)"

    def predict(self, frame: pl.DataFrame, cost: int) -> np.ndarray:
        if self.fixed is not None:
            return self.fixed.predict(fixed_features(frame, cost))
        assert self.float is not None
        return self.float.predict(float_features(frame, cost))


def build_report(paths: list[Path], model_path: Path | None = None) -> dict[str, Any]:
    """Per collection and over all filtered decisions: the kernel's rule, the two
    baselines and, with ``model_path`` (lb train's model or lb export's
    ``*.q11.json``), the model."""
    model = _Scored(model_path) if model_path else None  # checked before the data is read
    decisions = load_decisions(paths)
    lb = _manifests(paths)
    recorded_by_id = recorded_costs(paths)  # each collection's own: a lab mixes them
    model_default = MIGRATION_COST_NS
    if model is not None:
        model_default = int(model.meta.get("migration_cost_ns", MIGRATION_COST_NS))
    rows = []
    ys: list[np.ndarray] = []
    rules: list[np.ndarray] = []
    preds: list[np.ndarray] = []
    for (cid,), group in sorted(decisions.group_by("collection_id"), key=lambda kv: str(kv[0])):
        kept = prepare(group)
        # the hot window this collection was recorded with: the kernel's answers and so
        # the rule follow it, with a model or without; the model's own where none is
        recorded = recorded_by_id.get(str(cid))
        cost = recorded or MIGRATION_COST_NS
        row: dict[str, Any] = {
            "collection_id": str(cid),
            "variant": ",".join(sorted({str(v) for v in group["variant"].drop_nulls().unique()})),
            "scenario": (lb.get(str(cid)) or {}).get("scenario"),
            "decisions": group.height,
            "filtered": kept.height,
            "stay": int((kept[LABEL] == 0).sum()),
            "migrate_share": float(kept[LABEL].mean()) if kept.height else None,
            "rule_accuracy": None,
        }
        if kept.height:
            y = kept[LABEL].to_numpy()
            rule = rule_decision(float_features(kept, cost))
            row["rule"] = metrics(y, rule)
            row["rule_accuracy"] = row["rule"]["accuracy"]
            ys.append(y)
            rules.append(rule)
            if model is not None:
                pred = model.predict(kept, recorded or model_default)
                m = metrics(y, pred)
                row["model_accuracy"] = m["accuracy"]
                row["model"] = m
                preds.append(pred)
        shadow = (lb.get(str(cid)) or {}).get("shadow") or {}
        for kind in ("kprobe", "tracepoint"):
            kernel = (shadow.get(kind) or {}).get("kernel") or {}
            on_data = (shadow.get(kind) or {}).get("rows") or {}
            if kind == "tracepoint" and on_data.get("data_set_pulls") is not None:
                # the pulls this collection's data set holds, not every one the
                # program saw while attached
                row["shadow_agreement"] = on_data["agreement"]
                row["shadow"] = shadow[kind]
                break
            if kernel.get("agreement") is not None:
                row["shadow_agreement"] = kernel["agreement"]
                row["shadow"] = shadow[kind]
                break
        rows.append(row)
    total = prepare(decisions)
    out: dict[str, Any] = {"collections": rows, "decisions": decisions.height}
    if model is not None:
        out["model_kind"] = model.kind
    if ys:
        # every filtered row, the model beside the two baselines (balanced accuracy
        # and recall per class: "stay" is rare), each collection at its own cost
        y = np.concatenate(ys)
        if model is not None:
            out["model"] = metrics(y, np.concatenate(preds))
        out["hand_rule"] = metrics(y, np.concatenate(rules))
        out["majority"] = metrics(y, np.full(len(y), int(y.mean() >= 0.5)))
    counts = total.group_by("variant").len() if total.height else pl.DataFrame()
    out["filtered_by_variant"] = {str(r["variant"]): r["len"] for r in counts.iter_rows(named=True)}
    return out
