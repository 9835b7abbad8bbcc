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
    # Plain Python floats, not numpy calls: numpy releases the GIL inside argmax, and on the poll thread,
    # beside an inference thread that holds it, each release costs a wait to get it back (0.57 ms a result,
    # 16 % of the poll thread's time, in a profile of the fast model's drain).
    values = (
        probabilities.tolist() if isinstance(probabilities, np.ndarray) else [float(p) for p in probabilities]
    )
    if len(values) != len(labels):
        raise ValueError(f"{len(values)} probabilities for {len(labels)} labels")
    label_id = values.index(max(values))  # the first of tied maxima, as np.argmax
    rounded = [round(p, PROBABILITY_DIGITS) for p in values]
    return {
        "label": labels[label_id],
        "label_id": label_id,
        "confidence": rounded[label_id],
        "probabilities": dict(zip(labels, rounded, strict=True)),
    }
