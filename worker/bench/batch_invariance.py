"""`sentiment-worker batch-invariance`: does a review's label depend on the reviews batched with it?

Each review is labelled twice through the served classifier: alone (a batch of one) and inside batches of
``batch_size`` reviews of mixed lengths (a seeded shuffle, so short reviews share a batch with long ones and
are padded, as the HTTP batcher and a Kafka window may batch them). The two must agree: the same label and
every probability within ``tolerance``. A float32 form or a statically quantized INT8 form (fixed,
calibrated activation scales) meets it; ONNX Runtime's dynamic quantization does not, since it scales the
activations by each batch's range, so a review's label follows its batch-mates.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from worker.model.classifier import TextClassifierBase

TOLERANCE = 1e-4
"""Largest allowed |p_alone - p_batched| on any probability."""


@dataclass(frozen=True)
class BatchInvariance:
    """Alone against batched on ``texts`` reviews: how many labels changed and the largest probability
    move; ``invariant`` when no label changed and no probability moved more than ``tolerance``."""

    texts: int
    batch_size: int
    seed: int
    label_changes: int
    max_abs_diff: float
    tolerance: float

    @property
    def invariant(self) -> bool:
        return self.label_changes == 0 and self.max_abs_diff <= self.tolerance

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "invariant": self.invariant}


def alone_probs(classifier: TextClassifierBase, texts: Sequence[str]) -> np.ndarray:
    """Each review in a batch of its own; float32 [n, num_labels] in input order."""
    probs = np.zeros((len(texts), len(classifier.labels)), dtype=np.float32)
    for i, text in enumerate(texts):
        probs[i] = classifier.predict_texts([text])[0]
    return probs


def mixed_batch_probs(
    classifier: TextClassifierBase, texts: Sequence[str], batch_size: int, seed: int
) -> np.ndarray:
    """The reviews shuffled with ``seed`` and labelled ``batch_size`` at a time (mixed lengths, padded to
    each batch's longest); float32 [n, num_labels] in input order."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    probs = np.zeros((len(texts), len(classifier.labels)), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        probs[idx] = classifier.predict_texts([texts[i] for i in idx])
    return probs


def batch_invariance(
    classifier: TextClassifierBase,
    texts: Sequence[str],
    *,
    batch_size: int = 32,
    seed: int = 0,
    tolerance: float = TOLERANCE,
) -> BatchInvariance:
    """Labels ``texts`` alone and in mixed batches of ``batch_size`` and compares (see the module)."""
    if not texts:
        raise ValueError("batch invariance needs at least one review")
    if batch_size < 2:
        raise ValueError(f"batch size must be at least 2 to batch reviews together, got {batch_size}")
    alone = alone_probs(classifier, texts)
    batched = mixed_batch_probs(classifier, texts, batch_size, seed)
    return BatchInvariance(
        texts=len(texts),
        batch_size=batch_size,
        seed=seed,
        label_changes=int((alone.argmax(axis=1) != batched.argmax(axis=1)).sum()),
        max_abs_diff=float(np.abs(alone - batched).max()),
        tolerance=tolerance,
    )


def format_batch_invariance(model: str, result: BatchInvariance) -> str:
    """One line: the model, the counts and the verdict."""
    verdict = "batch-invariant" if result.invariant else "NOT batch-invariant"
    return (
        f"{model}: {result.texts} reviews alone vs in mixed batches of {result.batch_size}: "
        f"{result.label_changes} label changes, max |dp| {result.max_abs_diff:.2e} "
        f"(tolerance {result.tolerance:.0e}): {verdict}"
    )
