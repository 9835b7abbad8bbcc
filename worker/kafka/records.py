"""Building the outbound records: a result for a labelled review, a dead letter for anything else."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any, NamedTuple

import numpy as np
from confluent_kafka import KafkaError, Message

from schemas.dead_letter import HEADER_PREFIX, MAX_REASON_CHARS, DeadLetterKind, build_dead_letter_headers
from schemas.review_input import Review
from schemas.sentiment_result import ModelRef, SentimentResult, SourceRef
from worker.inference.label_fields import LabelFields, label_fields
from worker.kafka.producer import OutboundRecord, SourcePosition, record_size
from worker.kafka.result_encoding import ResultEncoder

log = logging.getLogger(__name__)


class InputMessage(NamedTuple):
    """The parts of a consumed Kafka message the worker uses (decoupled from confluent-kafka's Message)."""

    position: SourcePosition
    key: bytes | None
    value: bytes | None
    consumed_at: float  # time.monotonic() when it was consumed
    epoch: int = 0  # the partition's assignment epoch when consumed; stale epochs are never published
    headers: list[tuple[str, bytes | None]] | None = None  # the input's own, carried into its dead letter
    unreadable: str | None = None  # an offset of a record batch the consumer could not read: why (no value)

    @property
    def default_id(self) -> str:
        p = self.position
        return f"{p.topic}/{p.partition}/{p.offset}"


def headers_of(message: Message) -> list[tuple[str, bytes | None]] | None:
    """A consumed message's headers as `InputMessage` keeps them (confluent-kafka gives a list of pairs)."""
    headers = message.headers()
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, dict) else headers
    return [(name, value.encode() if isinstance(value, str) else value) for name, value in pairs]


_to_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


class ResultWriter:
    """Writes `SentimentResult` values. JSON (`encode` None) directly, its fields in the schema's order: the
    fields are correct by construction, so no record is validated again on the poll thread (the tests check
    what this writes against the schema's model), and what every result of a worker shares is encoded once
    (the labels, each model's identity, each source topic). A registry format (`encode`: its
    `ResultEncoder`) from the validated model."""

    def __init__(self, labels: list[str], encode: ResultEncoder | None = None) -> None:
        self._labels = labels
        self._encode = encode
        self._label_json = [encode_basestring(label) for label in labels]
        self._label_keys = [label + ":" for label in self._label_json]
        self._models: dict[ModelRef, str] = {}  # each model's JSON, encoded once
        self._topics: dict[str, str] = {}

    def value(
        self,
        review_id: str,
        probabilities: np.ndarray,
        model: ModelRef,
        source: SourcePosition,
        processing_time_ms: float,
        processed_at_ms: int,
        metadata: dict[str, Any],
    ) -> tuple[bytes, LabelFields]:
        """One result's JSON value, and its label fields."""
        fields = label_fields(probabilities, self._labels)
        model_json = self._models.get(model)
        if model_json is None:
            model_json = self._models[model] = model.model_dump_json()
        topic = self._topics.get(source.topic)
        if topic is None:
            topic = self._topics[source.topic] = encode_basestring(source.topic)
        probabilities_json = ",".join(
            [key + repr(p) for key, p in zip(self._label_keys, fields["probabilities"].values(), strict=True)]
        )
        timestamp_ms = "null" if source.timestamp_ms is None else source.timestamp_ms
        value = (
            f'{{"schema_name":"sentiment-result","schema_version":1,"id":{encode_basestring(review_id)},'
            f'"label":{self._label_json[fields["label_id"]]},"label_id":{fields["label_id"]},'
            f'"confidence":{fields["confidence"]!r},"probabilities":{{{probabilities_json}}},'
            f'"model":{model_json},"source":{{"topic":{topic},"partition":{source.partition},'
            f'"offset":{source.offset},"timestamp_ms":{timestamp_ms}}},'
            f'"processing_time_ms":{processing_time_ms!r},"processed_at_ms":{processed_at_ms},'
            f'"metadata":{_to_json(metadata) if metadata else "{}"}}}'
        )
        return value.encode("utf-8"), fields

    def record(
        self,
        message: InputMessage,
        review: Review,
        probabilities: np.ndarray,
        model: ModelRef,
        *,
        topic: str,
        partition: int | None,
        now: float,
    ) -> OutboundRecord:
        """The result record of one review, labelled by `model`; its key is the input key. `now` is
        time.monotonic()."""
        processing_time_ms = round(max(0.0, now - message.consumed_at) * 1000.0, 3)
        processed_at_ms = int(time.time() * 1000)
        if self._encode is None:
            value, fields = self.value(
                review.id,
                probabilities,
                model,
                message.position,
                processing_time_ms,
                processed_at_ms,
                review.metadata,
            )
        else:
            fields = label_fields(probabilities, self._labels)
            src = message.position
            value = self._encode(
                SentimentResult(
                    id=review.id,
                    **fields,
                    model=model,
                    source=SourceRef(
                        topic=src.topic,
                        partition=src.partition,
                        offset=src.offset,
                        timestamp_ms=src.timestamp_ms,
                    ),
                    processing_time_ms=processing_time_ms,
                    processed_at_ms=processed_at_ms,
                    metadata=review.metadata,
                )
            )
        return OutboundRecord(
            topic=topic,
            value=value,
            key=message.key,
            partition=partition,
            headers=None,
            source=message.position,
            kind="result",
            label=fields["label"],
            confidence=fields["confidence"],
            model_version=model.version,
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
    """The dead letter of one input: original key, value and headers untouched, the why in headers of its
    own (`sentiment.*`; an input header of that prefix is replaced by the worker's, never duplicated)."""
    src = message.position
    kept = [(name, value) for name, value in message.headers or () if not name.startswith(HEADER_PREFIX)]
    headers: list[tuple[str, bytes | None]] = kept
    headers += build_dead_letter_headers(
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


def dead_letter_overhead_bytes(source_topic: str, worker_id: str) -> int:
    """The most bytes a dead letter of an input from `source_topic` adds to the input's key and value, as
    `record_size` counts them: its headers with the longest reason (4-byte characters) and framing."""
    longest = max(DeadLetterKind, key=lambda kind: len(kind.value))
    headers = build_dead_letter_headers(
        longest, "\U0010ffff" * MAX_REASON_CHARS, source_topic, 2**31 - 1, 2**63 - 1, 2**63 - 1, worker_id
    )
    source = SourcePosition(source_topic, 0, 0, None)
    return record_size(OutboundRecord("", None, None, None, list(headers), source, longest.value))


class OutboundRecords:
    """The worker's outbound records: a result (`encode`d in the output format) or dead letter per input,
    sent to the output partition that keeps input order, and a dead letter without key and value standing in
    for a record too large for its topic.

    ``partition_counts`` and ``max_message_bytes`` hold the output and dead-letter topics' figures, read
    from the broker at start-up.
    """

    def __init__(
        self,
        *,
        labels: list[str],
        output_topic: str,
        dlq_topic: str,
        worker_id: str,
        partitioning: str,
        partition_counts: dict[str, int],
        max_message_bytes: dict[str, int],
        clock: Callable[[], float] = time.monotonic,
        encode: ResultEncoder | None = None,
    ) -> None:
        self._results = ResultWriter(labels, encode)
        self._output_topic = output_topic
        self._dlq_topic = dlq_topic
        self._worker_id = worker_id
        self._partitioning = partitioning
        self._partition_counts = dict(partition_counts)
        self._max_message_bytes = dict(max_message_bytes)
        self._clock = clock
        self._refused: set[tuple[str, SourcePosition]] = set()  # see refused_in_aborted_transaction

    def result(
        self, item: InputMessage, review: Review, probs: np.ndarray, model: ModelRef, now: float
    ) -> OutboundRecord:
        return self._results.record(
            item,
            review,
            probs,
            model,
            topic=self._output_topic,
            partition=self.partition(self._output_topic, item.position.partition),
            now=now,
        )

    def dead_letter(self, item: InputMessage, kind: DeadLetterKind, reason: str) -> OutboundRecord:
        return dead_letter_record(
            item,
            kind,
            reason,
            topic=self._dlq_topic,
            partition=self.partition(self._dlq_topic, item.position.partition),
            worker_id=self._worker_id,
        )

    def replacement(self, record: OutboundRecord, refusal: KafkaError | None = None) -> OutboundRecord | None:
        """The one decision on size: the stand-in for `record` when it is larger than its topic accepts
        (estimated before sending: the broker would refuse it and, in a transaction, abort it on every
        retry), when the broker refused it as too large (`refusal`), or when a transaction it was in was
        aborted for that (`refused_in_aborted_transaction`). None when `record` may go as it is, or when it
        is a stand-in already (no key, no value: nothing left to drop, its failure is a failure)."""
        if record.value is None and record.key is None:
            return None
        if refusal is not None:
            return self.too_large(record) if refusal.code() == KafkaError.MSG_SIZE_TOO_LARGE else None
        if (record.topic, record.source) in self._refused:
            return self.too_large(record)
        if record_size(record) <= self._max_message_bytes[record.topic]:
            return None
        return self.too_large(record)

    def refused_in_aborted_transaction(self, record: OutboundRecord) -> None:
        """exactly_once: the broker refused `record` as too large (its size was estimated wrong) and the
        transaction was aborted; when its window is published again, its stand-in goes instead. So each
        such record costs one abort, never an endless abort-and-rewind loop. It is remembered until a
        transaction holding its stand-in commits (`committed`): another abort before that (librdkafka may
        abort the next transaction too, to bump its epoch) sends the stand-in again, not the record."""
        self._refused.add((record.topic, record.source))

    def committed(self, records: list[OutboundRecord]) -> None:
        """exactly_once: a transaction of `records` committed; the refusals of their inputs are done with."""
        if self._refused:
            sources = {r.source for r in records}
            self._refused = {refused for refused in self._refused if refused[1] not in sources}

    def too_large(self, record: OutboundRecord) -> OutboundRecord:
        """Stands in for a result or dead letter too large for its topic: a dead letter with no key and no
        value (both may be what is too large), only headers: kind value_too_large, the source topic,
        partition and offset where the input stays, and a reason giving the sizes. It fits any topic the
        worker starts with (the dead-letter headers are bounded)."""
        src = record.source
        key_bytes, value_bytes = len(record.key or b""), len(record.value or b"")
        what = "result" if record.kind == "result" else "dead letter"
        reason = (
            f"the {what} for this input is {key_bytes + value_bytes} bytes (key {key_bytes} bytes, value "
            f"{value_bytes} bytes), more than topic {record.topic!r} accepts (max.message.bytes "
            f"{self._max_message_bytes.get(record.topic, 0)}); the input's key and value stay in {src.topic} "
            f"partition {src.partition} at offset {src.offset}. Send smaller keys and values or raise the "
            "topic's max.message.bytes."
        )
        if record.kind not in ("result", DeadLetterKind.VALUE_TOO_LARGE.value):
            reason += f" It was dead-lettered as {record.kind}."
        log.warning("replacing an oversized record by a dead letter without key and value: %s", reason)
        return self.dead_letter(
            InputMessage(src, None, None, self._clock()), DeadLetterKind.VALUE_TOO_LARGE, reason
        )

    def partition(self, topic: str, source_partition: int) -> int | None:
        if self._partitioning == "key":
            return None
        # Same partition number as the input (modulo): one input partition → one output partition, so the
        # idempotent producer's per-partition ordering keeps input order end to end.
        return source_partition % self._partition_counts[topic]
