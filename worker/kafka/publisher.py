"""The publisher: sends a window's records and takes their delivery reports in.

It sends each record (one too large for its topic replaced by its stand-in, decided in
`OutboundRecords.replacement`) through the producer, and accounts for the delivery reports: acknowledged →
the partition book, the run's counts, the metrics; refused as too large → the stand-in sent instead; any
other failure → the first one stored, and raised by `raise_for_error()`: before the next produce, and by the
caller after a flush once what was acknowledged is committed. What may be committed is the checkpoint's to
decide (`worker.kafka.checkpoint`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import KafkaError

from worker.errors import OperationError
from worker.kafka.authorization import is_authorization_error
from worker.kafka.loop_context import LoopContext
from worker.kafka.producer import (
    AbortedTransaction,
    Delivery,
    GiveUp,
    OnWait,
    OutboundRecord,
    ResultProducer,
    record_size,
)
from worker.kafka.records import OutboundRecords
from worker.metrics import observe_all

__all__ = ["DeliveryFailedError", "Publisher", "delivery_failure"]


class DeliveryFailedError(OperationError):
    """The broker did not take a record; its input offset must not be committed."""

    def __init__(self, message: str, topic: str, error: KafkaError | None) -> None:
        super().__init__(message)
        self.topic = topic
        self.error = error


def delivery_failure(record: OutboundRecord, error: KafkaError | None) -> DeliveryFailedError:
    """The error that stops the worker when the broker refused `record` for good, saying what happened."""
    src = record.source
    where = f"for topic {record.topic!r} (input {src.topic}/{src.partition}/{src.offset})"
    if error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        advice = (
            f"it was refused as too large ({record_size(record)} bytes estimated) even as a dead letter "
            f"without key and value; raise the topic's max.message.bytes (kafka-configs --alter "
            f"--entity-type topics --entity-name {record.topic} --add-config max.message.bytes=...)"
        )
    else:
        advice = "check that the topic exists and this worker may write to it"
    return DeliveryFailedError(
        f"the broker refused a record {where}: {error}. Its offset was not committed; {advice}.",
        record.topic,
        error,
    )


class Publisher:
    """Produces windows' records (in input order) and accounts for their delivery reports."""

    def __init__(
        self,
        producer: ResultProducer,
        records: OutboundRecords,
        context: LoopContext,
        refusal: Callable[[KafkaError, list[str]], Exception],
    ) -> None:
        """`refusal` turns a refusal by the broker's authorizer into the error that names the missing ACL.
        Acknowledgements advance `context.book` and count in `context.run` and `context.metrics`."""
        self.producer = producer
        self._records = records
        self._book, self._run, self._metrics = context.book, context.run, context.metrics
        self._refusal = refusal
        self._first_failure: Delivery | None = None

    def publish(self, records: list[OutboundRecord]) -> None:
        """Queues one window's records, each too large for its topic replaced by its stand-in; first raises
        a delivery that failed for good (nothing is produced past it)."""
        self.raise_for_error()
        for record in self._replaced(records):
            self.producer.publish(record)

    def publish_transaction(
        self,
        records: list[OutboundRecord],
        group_metadata: object,
        timeout_s: float,
        *,
        give_up: GiveUp,
        on_wait: OnWait,
    ) -> AbortedTransaction | None:
        """Produces one window's records (replaced as in `publish`) and the offsets after them in one
        transaction (`ResultProducer.publish_transaction`): None once committed (the stand-ins owed for
        its inputs are then done with), else what was aborted."""
        self.raise_for_error()
        aborted = self.producer.publish_transaction(
            self._replaced(records), group_metadata, timeout_s, give_up=give_up, on_wait=on_wait
        )
        if aborted is None:
            self._records.committed(records)
        return aborted

    def refused_in_aborted_transaction(self, record: OutboundRecord) -> None:
        """`record` was refused as too large in an aborted transaction: its stand-in goes next time."""
        self._records.refused_in_aborted_transaction(record)

    def flush(self, timeout_s: float) -> int:
        """Waits up to `timeout_s` for every queued record; returns how many are still unacknowledged."""
        return self.producer.flush(timeout_s)

    def raise_for_error(self) -> None:
        """Raises the first delivery that failed for good, so the worker stops before going past it (its
        offset is never committed); a refusal by the authorizer says which ACL is missing."""
        failed = self._first_failure
        if failed is None:
            return
        if failed.error is not None and is_authorization_error(failed.error):
            raise self._refusal(failed.error, [failed.record.topic])
        raise delivery_failure(failed.record, failed.error)

    def take_deliveries(self) -> None:
        """The delivery reports since the last call: acknowledged records advance the partition book and
        are counted; a record refused as too large is replaced by its stand-in (acked when delivered); any
        other failure is kept for `raise_for_error` (never acked: its offset and everything after it in the
        partition stay uncommitted)."""
        deliveries = self.producer.take_deliveries()
        if not deliveries:
            return
        now_ms = time.time() * 1000.0
        done: dict[str, int] = {}  # per kind ("result" or a dead-letter kind)
        results: dict[str, int] = {}  # per topic
        labels: dict[tuple[str, str], int] = {}  # per label and model version
        confidences: dict[str, list[float]] = {}  # per model version
        latencies: list[float] = []
        for delivery in deliveries:
            record, src = delivery.record, delivery.record.source
            if delivery.error is not None:
                self._refused(delivery)
                continue
            self._book.acknowledged((src.topic, src.partition), src.offset, src.timestamp_ms)
            done[record.kind] = done.get(record.kind, 0) + 1
            if record.kind == "result":
                results[record.topic] = results.get(record.topic, 0) + 1
                if record.label is not None and record.confidence is not None:
                    version = record.model_version or ""
                    labels[record.label, version] = labels.get((record.label, version), 0) + 1
                    confidences.setdefault(version, []).append(record.confidence)
            if src.timestamp_ms is not None:
                latencies.append(max(0.0, (now_ms - src.timestamp_ms) / 1000.0))
        # The metrics and the run's counts once per turn, not once per record.
        for kind, count in done.items():
            self._run.finished(kind, count)
            if kind != "result":
                self._metrics.dead_letters.labels(kind).inc(count)
        for topic, count in results.items():
            self._metrics.results_published.labels(topic).inc(count)
        for version, version_confidences in confidences.items():
            counts = {label: n for (label, of), n in labels.items() if of == version}
            self._metrics.observe_predictions(counts, version_confidences, version)
        observe_all(self._metrics.end_to_end_latency_seconds, latencies)

    def _refused(self, delivery: Delivery) -> None:
        """A record the broker refused: its stand-in sent when it was too large, else the failure kept."""
        stand_in = self._records.replacement(delivery.record, delivery.error)
        if stand_in is not None:
            self.producer.publish(stand_in)
            return
        self._metrics.delivery_failures.labels(delivery.record.topic).inc()
        if self._first_failure is None:
            self._first_failure = delivery

    def _replaced(self, records: list[OutboundRecord]) -> list[OutboundRecord]:
        return [self._records.replacement(record) or record for record in records]
