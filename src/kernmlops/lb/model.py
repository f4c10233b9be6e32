"""MLLB's model: an MLP 15 -> 10 ReLU -> 1, trained with numpy alone.

Training standardizes the features (mean, std of the training rows), fits
with Adam on the logistic loss, keeps the best of a few seeds on a
validation share of the training rows, and folds the standardization into
the first layer, so the saved weights take the raw features as MLLB's kernel
patch computes them. The decision is ``logit > 0`` (p > 0.5).

The data set is split by collection: the test rows come from runs the model
never saw (:func:`split_by_collection`).
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from kernmlops.errors import KernmlopsError
from kernmlops.fileio import write_atomic
from kernmlops.lb.features import FEATURES, NR_FEATURES
from kernmlops.lb.modelfile import fits_q11
from kernmlops.lb.weights import FLOAT_FORMAT, VERSIONS, check_model, read_model_doc

FORMAT = FLOAT_FORMAT
FORMAT_VERSION = VERSIONS[FORMAT]
HIDDEN = 10


class ModelError(KernmlopsError):
    """A model file is unreadable, or training cannot proceed."""


def check_writable(path: Path) -> None:
    """ModelError unless a model can be saved at ``path``: not a folder, and the
    nearest folder above it that exists is one this process may write in. Cheap:
    checked before training, so a bad -o is said before the work, not after."""
    path = Path(path)
    for here in (path, *path.parents):
        try:
            mode = here.stat().st_mode
        except OSError:  # missing (save makes it), or not searchable: the folders above say
            continue
        if here == path:
            if stat.S_ISDIR(mode):
                raise ModelError(f"cannot write the model to {path}: it is a folder")
            continue  # a file save replaces: its folder decides
        if not stat.S_ISDIR(mode):
            raise ModelError(f"cannot write the model to {path}: {here} is a file, not a folder")
        if not os.access(here, os.W_OK | os.X_OK):
            # access(2) answers for the mount too: EROFS even as root
            read_only = os.statvfs(here).f_flag & os.ST_RDONLY
            why = "the file system is read-only" if read_only else "permission denied"
            raise ModelError(f"cannot write the model to {path}: {why} ({here})")
        return


@dataclass
class Model:
    """Float weights on the raw features: ``w1`` is (15, hidden), feature-major."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: float
    meta: dict[str, Any] = field(default_factory=dict)

    def hidden(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(x @ self.w1 + self.b1, 0.0)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self.hidden(x) @ self.w2 + self.b2

    def predict(self, x: np.ndarray) -> np.ndarray:
        return (self.logits(x) > 0).astype(np.int8)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "features": list(FEATURES),
            "hidden": len(self.b1),
            "layout": "w1[feature][hidden]; logit = relu(x @ w1 + b1) @ w2 + b2",
            "w1": self.w1.tolist(),
            "b1": self.b1.tolist(),
            "w2": self.w2.tolist(),
            "b2": float(self.b2),
            "decision": "migrate when logit > 0",
            "meta": self.meta,
        }

    def save(self, path: Path, *, shown: Path | None = None) -> Path:
        """Write the model to ``path`` whole (folders made); ModelError with one line
        when it cannot be written, naming ``shown`` (the path as the user named it,
        where ``path`` goes through a held folder) or ``path``."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")
        except OSError as err:
            raise ModelError(
                f"cannot write the model to {shown or path}: {err.strerror or err}"
            ) from None
        return path

    @classmethod
    def load(cls, path: Path) -> Model:
        """``lb train``'s model; ModelError with one line for anything else,
        weights that are not finite or do not fit Q20.11 included."""
        doc = read_model_doc(path, ModelError)
        if doc.get("format") != FORMAT:
            raise ModelError(f"{path} is not a kernmlops lb model (lb train writes one)")
        _, w1, b1, w2, b2 = check_model(doc, str(path), error=ModelError)
        meta = doc.get("meta")
        return cls(
            w1=w1, b1=b1, w2=w2, b2=float(b2), meta=dict(meta) if isinstance(meta, dict) else {}
        )


# --- metrics -------------------------------------------------------------------------


def metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, Any]:
    """Accuracy, precision, recall, F1 (positive class: migrate), the
    confusion matrix ``[[tn, fp], [fn, tp]]``, the recall of each class and
    their mean, the balanced accuracy (what counts when one answer is rare:
    "always migrate" scores 50% there, whatever its accuracy)."""
    t = np.asarray(y_true).astype(bool)
    p = np.asarray(y_pred).astype(bool)
    tp = int((t & p).sum())
    tn = int((~t & ~p).sum())
    fp = int((~t & p).sum())
    fn = int((t & ~p).sum())
    n = tp + tn + fp + fn
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = (
        2 * precision * recall / (precision + recall)
        if precision is not None and recall is not None and precision + recall
        else None
    )
    recall_stay = tn / (tn + fp) if tn + fp else None
    both = [r for r in (recall_stay, recall) if r is not None]
    return {
        "rows": n,
        "accuracy": (tp + tn) / n if n else None,
        # the mean of the recalls of the classes present (one class: its recall)
        "balanced_accuracy": sum(both) / len(both) if both else None,
        "recall_per_class": {"stay": recall_stay, "migrate": recall},
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "confusion": [[tn, fp], [fn, tp]],
        "positives": tp + fn,
        "negatives": tn + fp,
    }


# --- splitting -------------------------------------------------------------------------


def split_by_collection(
    collections: np.ndarray,
    test_fraction: float = 0.25,
    seed: int = 0,
    test: list[str] | None = None,
) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """Boolean masks (train, test) and the collection ids of each side.

    ``test`` names the test collections; otherwise a seeded shuffle takes
    ``ceil(fraction * n)`` of them (at least one, leaving one to train on).
    """
    ids = sorted({str(c) for c in collections})
    if test:
        unknown = sorted(set(test) - set(ids))
        if unknown:
            raise ModelError(
                f"test collection(s) {', '.join(unknown)} not in the data "
                f"(collections: {', '.join(ids)})"
            )
        test_ids = sorted(set(test))
    else:
        if len(ids) < 2:
            raise ModelError(
                f"splitting by collection needs at least 2 collections, the data has "
                f"{len(ids)} ({', '.join(ids) or 'none'}): collect more runs, or pass "
                "--split rows (then the test rows come from the training runs)"
            )
        n_test = min(len(ids) - 1, max(1, math.ceil(test_fraction * len(ids))))
        order = np.random.default_rng(seed).permutation(len(ids))
        test_ids = sorted(ids[i] for i in order[:n_test])
    train_ids = [c for c in ids if c not in test_ids]
    if not train_ids:
        raise ModelError("every collection is a test collection: nothing left to train on")
    col = np.asarray([str(c) for c in collections])
    is_test = np.isin(col, test_ids)
    return ~is_test, is_test, train_ids, test_ids


def split_rows(n: int, test_fraction: float = 0.25, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    is_test = np.zeros(n, dtype=bool)
    is_test[order[: max(1, round(test_fraction * n))]] = True
    return ~is_test, is_test


# --- training ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    hidden: int = HIDDEN
    epochs: int = 60
    batch: int = 256
    lr: float = 0.01
    l2: float = 1e-5
    seeds: int = 3
    seed: int = 0
    validation: float = 0.1
    #: stop a seed when the validation loss has not improved for this many epochs
    patience: int = 10
    #: weigh each class by the inverse of its share ("stay" is rare): the loss then
    #: targets balanced accuracy rather than accuracy
    balanced: bool = False


def _bce(logits: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> float:
    # log(1 + e^z) - y z, computed stably; weighted like the training loss
    loss = np.logaddexp(0.0, logits) - y * logits
    return float(np.mean(loss if w is None else loss * w))


def _class_weights(y: np.ndarray, balanced: bool) -> np.ndarray:
    """Per-row loss weights: 1, or n / (2 n_class) so both classes weigh alike."""
    if not balanced:
        return np.ones(len(y))
    pos = float(y.sum())
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return np.ones(len(y))
    return np.where(y > 0.5, len(y) / (2 * pos), len(y) / (2 * neg))


def _fit_one(
    xs: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray, cfg: TrainConfig, seed: int
) -> tuple[list[np.ndarray], float]:
    rng = np.random.default_rng(seed)
    nf, nh = xs.shape[1], cfg.hidden
    params = [
        rng.normal(0.0, math.sqrt(2.0 / nf), (nf, nh)),  # He init for ReLU
        np.full(nh, 0.01),
        rng.normal(0.0, math.sqrt(1.0 / nh), nh),
        np.zeros(1),
    ]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    b1_, b2_, eps = 0.9, 0.999, 1e-8
    step = 0
    best = (math.inf, [p.copy() for p in params])
    stale = 0
    n = len(xs)
    sw = _class_weights(y, cfg.balanced)
    wv = _class_weights(yv, cfg.balanced)
    for epoch in range(cfg.epochs):
        lr = cfg.lr * (0.5 ** (epoch // 20))
        order = rng.permutation(n)
        for start in range(0, n, cfg.batch):
            idx = order[start : start + cfg.batch]
            xb, yb = xs[idx], y[idx]
            w1, bb1, w2, bb2 = params
            z = xb @ w1 + bb1
            h = np.maximum(z, 0.0)
            out = h @ w2 + bb2[0]
            g = (1.0 / (1.0 + np.exp(-out)) - yb) * sw[idx] / len(xb)  # d loss / d logit
            gw2 = h.T @ g + cfg.l2 * w2
            gb2 = np.array([g.sum()])
            gz = np.outer(g, w2) * (z > 0)
            gw1 = xb.T @ gz + cfg.l2 * w1
            gb1 = gz.sum(axis=0)
            step += 1
            for i, grad in enumerate((gw1, gb1, gw2, gb2)):
                m[i] = b1_ * m[i] + (1 - b1_) * grad
                v[i] = b2_ * v[i] + (1 - b2_) * grad * grad
                mh = m[i] / (1 - b1_**step)
                vh = v[i] / (1 - b2_**step)
                params[i] = params[i] - lr * mh / (np.sqrt(vh) + eps)
        w1, bb1, w2, bb2 = params
        val = _bce(np.maximum(xv @ w1 + bb1, 0.0) @ w2 + bb2[0], yv, wv)
        if val < best[0] - 1e-6:
            best = (val, [p.copy() for p in params])
            stale = 0
        else:
            stale += 1
            if stale >= cfg.patience:
                break
    return best[1], best[0]


def _check_fits_q11(
    w1_raw: np.ndarray, b1_raw: np.ndarray, w1: np.ndarray, mu: np.ndarray, sigma: np.ndarray
) -> None:
    """ModelError naming the feature whose folded standardization gives layer 1 a
    weight or bias Q20.11 cannot hold (a feature almost constant at a large value:
    mean / std is huge), instead of a model no reader or kernel takes."""
    rows = [i for i in range(NR_FEATURES) if not all(fits_q11(v) for v in w1_raw[i])]
    if not rows and all(fits_q11(v) for v in b1_raw):
        return
    # a bias out of range: the feature whose mean / std adds the most to it
    i = rows[0] if rows else int(np.argmax(np.abs(mu / sigma) * np.abs(w1).max(axis=1)))
    raise ModelError(
        f"the trained model does not fit Q20.11 fixed point (|w| < 2^20): feature "
        f"{FEATURES[i]} barely varies in the training rows (mean {mu[i]:g}, std "
        f"{sigma[i]:.3g}), and its standardization folded into layer 1 outgrows it; "
        "train on data where it varies more, or without the few rows that differ"
    )


def train(x: np.ndarray, y: np.ndarray, cfg: TrainConfig | None = None) -> Model:
    """Fit the MLP on raw features ``x`` (rows, 15) and labels ``y`` (0/1)."""
    cfg = cfg or TrainConfig()
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if cfg.epochs < 1:  # no epoch: the random weights would be saved as a model
        raise ModelError(f"epochs must be at least 1, got {cfg.epochs}")
    if len(x) < 2:
        raise ModelError(f"need at least 2 decisions to train, got {len(x)}")
    if x.shape[1] != NR_FEATURES:
        raise ModelError(f"features have {x.shape[1]} columns, want {NR_FEATURES}")
    mu = x.mean(axis=0)
    sigma = x.std(axis=0)
    sigma = np.where(sigma > 1e-9, sigma, 1.0)  # constant features: leave unscaled
    xs = (x - mu) / sigma
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(len(x))
    n_val = max(1, int(len(x) * cfg.validation)) if len(x) >= 10 else 0
    val_idx, fit_idx = order[:n_val], order[n_val:]
    if n_val == 0:
        val_idx = fit_idx
    best: tuple[float, list[np.ndarray]] | None = None
    for s in range(cfg.seeds):
        params, loss = _fit_one(
            xs[fit_idx], y[fit_idx], xs[val_idx], y[val_idx], cfg, cfg.seed * 1000 + s
        )
        if best is None or loss < best[0]:
            best = (loss, params)
    assert best is not None
    w1, b1, w2, b2 = best[1]
    # Fold the standardization into layer 1: the kernel feeds raw features.
    w1_raw = w1 / sigma[:, None]
    b1_raw = b1 - (mu / sigma) @ w1
    _check_fits_q11(w1_raw, b1_raw, w1, mu, sigma)
    model = Model(
        w1=w1_raw,
        b1=b1_raw,
        w2=w2.copy(),
        b2=float(b2[0]),
        meta={
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "validation_loss": best[0],
            "train_config": cfg.__dict__,
        },
    )
    # every reader's check (the fixed-point sums included): no model is saved that
    # lb export, lb shadow or kmo_lb would refuse
    check_model(model.to_json(), "the trained model", error=ModelError)
    return model
