"""What the engine labels with: the classifier protocol a model satisfies, a text's token-id sequences (one,
or a long text's chunks), and one text's outcome (`Output`: its probability row, or the `InferenceFailure`
that replaced it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from schemas.dead_letter import DeadLetterKind
from worker.model.long_text import flatten_chunks

__all__ = ["Classifier", "InferenceFailure", "Output", "sequences_for"]


class Classifier(Protocol):
    """What the engine needs of a model (see worker.model.SentimentClassifier)."""

    labels: list[str]
    call_overhead_tokens: int | None
    """One model call's fixed cost in padded tokens, for the batch planner (None: fewest batches)."""
    parallel_calls: int
    """How many `predict_ids` calls may run side by side: a window's batches run on that many threads."""

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]: ...

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray: ...


@dataclass(frozen=True)
class InferenceFailure:
    """Why one text got no prediction; becomes a dead letter."""

    kind: DeadLetterKind
    reason: str


def sequences_for(classifier: Classifier, texts: Sequence[str]) -> tuple[list[list[int]], list[int] | None]:
    """The token-id sequences to label for `texts`, and how many belong to each text when a classifier in
    long_text=chunk mode splits long texts into windows (None: exactly one per text, in order)."""
    if not texts:
        return [], None
    chunker: Callable[[Sequence[str]], list[list[list[int]]]] | None = getattr(
        classifier, "token_id_chunks", None
    )
    if chunker is None:
        return classifier.token_ids(texts), None
    flat, counts = flatten_chunks(chunker(texts))
    return flat, (counts if len(flat) != len(texts) else None)


Output = np.ndarray | InferenceFailure
"""One text's (or sequence's) outcome: its probability row, or why it has none."""
