"""A window of consumed messages on its way through the stages: prepared (decoded + tokenized, on the poll
thread), labelled (its batches queued on the model lanes by the poll thread, awaited by the inference
thread), then turned into one outbound record per input."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from schemas.dead_letter import DeadLetterKind
from worker.config import WorkerSettings
from worker.inference.labelling import (
    Classifier,
    InferenceFailure,
    TokenBudget,
    WindowStats,
    begin_label_ids,
    sequences_for,
)
from worker.stream.decode import DecodedReview, DecodeFailure, decode_review
from worker.stream.producer import OutboundRecord
from worker.stream.records import InputMessage


@dataclass(frozen=True)
class PreparedWindow:
    """Messages in consume order, each decoded; token ids for the valid ones (in the same order).

    With long_text=chunk, a long review has several sequences: `chunk_counts[i]` is the number of
    sequences of the i-th valid review (None: one each)."""

    items: list[InputMessage]
    decoded: list[DecodedReview | DecodeFailure]
    token_ids: list[list[int]]
    tokenize_seconds: float
    chunk_counts: list[int] | None = None


@dataclass(frozen=True)
class LabelledWindow:
    prepared: PreparedWindow
    outputs: list[np.ndarray | InferenceFailure]  # one per valid review, in order
    stats: WindowStats


def prepare_window(
    items: list[InputMessage], classifier: Classifier, settings: WorkerSettings
) -> PreparedWindow:
    """Decodes every message and tokenizes the valid reviews (runs on the poll thread)."""
    decoded: list[DecodedReview | DecodeFailure] = [
        decode_review(
            item.value,
            input_format=settings.input_format,
            max_value_bytes=settings.max_value_bytes,
            max_text_chars=settings.max_text_chars,
            max_json_depth=settings.max_json_depth,
            default_id=item.default_id,
        )
        for item in items
    ]
    texts = [d.text for d in decoded if isinstance(d, DecodedReview)]
    started = time.perf_counter()
    token_ids, counts = sequences_for(classifier, texts)
    return PreparedWindow(items, decoded, token_ids, time.perf_counter() - started, counts)


def begin_label_window(
    prepared: PreparedWindow, classifier: Classifier, *, max_batch_size: int, budget: TokenBudget
) -> Callable[[], LabelledWindow]:
    """Queues a prepared window's batches on the model lanes (on the poll thread) and returns the function
    that waits for them (on the inference thread): one output per valid review, in order — chunked
    reviews' windows are batched like any sequence, then averaged back."""
    finish = begin_label_ids(
        classifier,
        prepared.token_ids,
        counts=prepared.chunk_counts,
        max_batch_size=max_batch_size,
        budget=budget,
    )

    def labelled() -> LabelledWindow:
        outputs, stats = finish()
        stats.tokenize_seconds = prepared.tokenize_seconds
        return LabelledWindow(prepared, outputs, stats)

    return labelled


ResultBuilder = Callable[[InputMessage, DecodedReview, np.ndarray], OutboundRecord]
DeadLetterBuilder = Callable[[InputMessage, DeadLetterKind, str], OutboundRecord]


def window_records(
    labelled: LabelledWindow,
    *,
    owned: Callable[[InputMessage], bool],
    result: ResultBuilder,
    dead_letter: DeadLetterBuilder,
) -> list[OutboundRecord]:
    """One record per input still `owned`, in input order: its result, or its dead letter."""
    records: list[OutboundRecord] = []
    predictions = iter(labelled.outputs)
    for item, review in zip(labelled.prepared.items, labelled.prepared.decoded, strict=True):
        output = next(predictions) if isinstance(review, DecodedReview) else None
        if not owned(item):
            continue  # its partition was revoked meanwhile: uncommitted, so the new owner labels it
        if isinstance(review, DecodeFailure):
            records.append(dead_letter(item, review.kind, review.reason))
        elif isinstance(output, InferenceFailure):
            records.append(dead_letter(item, output.kind, output.reason))
        else:
            assert output is not None
            records.append(result(item, review, output))
    return records
