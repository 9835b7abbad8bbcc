"""Building the outbound records: a result for a labelled review, a dead letter for anything else."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from schemas.dead_letter import DeadLetterKind, build_dead_letter_headers
from schemas.sentiment_result import ModelRef, SentimentResult, SourceRef
from worker.decode import DecodedReview
from worker.producer import OutboundRecord, SourcePosition


@dataclass(frozen=True)
class InputMessage:
    """The parts of a consumed Kafka message the worker uses (decoupled from confluent-kafka's Message)."""

    position: SourcePosition
    key: bytes | None
    value: bytes | None
    consumed_at: float  # time.monotonic() when it was consumed
    epoch: int = 0  # the partition's assignment epoch when consumed; stale epochs are never published

    @property
    def default_id(self) -> str:
        p = self.position
        return f"{p.topic}/{p.partition}/{p.offset}"


def result_record(
    message: InputMessage,
    review: DecodedReview,
    probabilities: np.ndarray,
    *,
    labels: list[str],
    model: ModelRef,
    topic: str,
    partition: int | None,
    now: float,
) -> OutboundRecord:
    """The result record of one review; its key is the input key. `now` is time.monotonic()."""
    label_id = int(np.argmax(probabilities))
    src = message.position
    result = SentimentResult(
        id=review.id,
        label=labels[label_id],
        label_id=label_id,
        confidence=round(float(probabilities[label_id]), 6),
        probabilities={label: round(float(p), 6) for label, p in zip(labels, probabilities, strict=True)},
        model=model,
        source=SourceRef(
            topic=src.topic, partition=src.partition, offset=src.offset, timestamp_ms=src.timestamp_ms
        ),
        processing_time_ms=round(max(0.0, now - message.consumed_at) * 1000.0, 3),
        processed_at_ms=int(time.time() * 1000),
        metadata=review.metadata,
    )
    return OutboundRecord(
        topic=topic,
        value=result.model_dump_json().encode("utf-8"),
        key=message.key,
        partition=partition,
        headers=None,
        source=src,
        kind="result",
    )


def dead_letter_record(
    message: InputMessage,
    kind: DeadLetterKind,
    reason: str,
    *,
    topic: str,
    partition: int | None,
    worker_id: str,
) -> OutboundRecord:
    """The dead letter of one input: original key and value bytes untouched, the why in headers."""
    src = message.position
    headers = build_dead_letter_headers(
        kind, reason, src.topic, src.partition, src.offset, src.timestamp_ms, worker_id
    )
    return OutboundRecord(
        topic=topic,
        value=message.value,
        key=message.key,
        partition=partition,
        headers=headers,
        source=src,
        kind=DeadLetterKind(kind).value,
    )
