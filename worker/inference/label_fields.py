"""The label fields of one text's result, built once for every entry point (Kafka results, HTTP answers,
`predict` lines, `doctor`): the top label, its id, its confidence and the rounded probability per label."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import numpy as np

PROBABILITY_DIGITS = 6  # decimals kept of each probability and of the confidence


class LabelFields(TypedDict):
    """The fields every result of a labelled text carries, in this order."""

    label: str
    label_id: int
    confidence: float
    probabilities: dict[str, float]


def label_fields(probabilities: np.ndarray | Sequence[float], labels: Sequence[str]) -> LabelFields:
    """The label fields of one text from the model's `probabilities` (one per label, in `labels` order).

    The label is the argmax (on a tie, the first label of the tied ones); the confidence is its
    probability; every probability is rounded to 6 decimals after the choice.
    """
    label_id = int(np.argmax(probabilities))
    return {
        "label": labels[label_id],
        "label_id": label_id,
        "confidence": round(float(probabilities[label_id]), PROBABILITY_DIGITS),
        "probabilities": {
            label: round(float(p), PROBABILITY_DIGITS) for label, p in zip(labels, probabilities, strict=True)
        },
    }
