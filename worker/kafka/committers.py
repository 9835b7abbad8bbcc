"""How published work becomes committed offsets: one committer per delivery mode, behind one interface.

A committer is the one owner of what was published and what may be committed: it sends a window's records
(a record too large for its topic replaced by its stand-in, decided in `OutboundRecords.replacement`), takes
the delivery reports in (acknowledged → the partition book, the run's counts, the metrics; refused as too
large → the stand-in sent instead; any other failure → kept, and raised by `raise_for_error()` before the
worker goes further), and commits. Both keep the worker's rule: an offset is committed only after the broker
acknowledged everything its input produced, and per partition in input order.

- `AtLeastOnceCommitter`: records are published one by one; once acknowledged, their contiguous offsets
  are stored and librdkafka's auto-commit commits them; revoke and stop commit synchronously.
- `ExactlyOnceCommitter`: each window's records and its consumed offsets commit in one transaction; an
  abortable error aborts it and the caller reads those partitions again; a fatal one (fenced by a newer
  instance) is raised and stops the worker. Every transaction call has a deadline
  (`transaction_call_timeout_s`; a stop out of time cuts it): a call past it is given up, the producer
  replaced, and the committer is `recovering` until the new producer is initialised (which fences the old
  one and finishes its transaction); meanwhile nothing is published and the caller reads every partition
  again from its committed offset once `recover()` succeeds.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from confluent_kafka import KafkaError, KafkaException

from worker.config import DeliverySettings, KafkaSettings, SecuritySettings
from worker.errors import OperationError
from worker.kafka import kafka_clients
from worker.kafka.authorization import is_authorization_error, publish_refusal
from worker.kafka.consumer import ReviewConsumer
from worker.kafka.deadline_calls import CallAbandoned
from worker.kafka.partitions import PartitionBook, PartitionKey, format_offsets, format_partitions
from worker.kafka.producer import Delivery, OutboundRecord, ResultPublisher, record_size
from worker.kafka.records import OutboundRecords
from worker.kafka.run_tracker import RunTracker, drain_budget_s
from worker.metrics import WorkerMetrics, observe_all

__all__ = [
    "AtLeastOnceCommitter",
    "CommitOptions",
    "Committer",
    "DeliveryFailedError",
    "ExactlyOnceCommitter",
    "TransactionsStuckError",
    "committer_for",
]

log = logging.getLogger(__name__)

_SLOW_CALL_S = 2.0  # a transaction call waiting longer than this makes /readyz say so
_RECOVERY_STEP_S = 1.0  # each loop turn of a recovery waits this long for init_transactions (resumable)
MAX_STUCK_CALLS = 3
"""Transaction calls given up on and still not returned, past which the worker stops (exit 1): each holds a
producer and a thread."""


def _no_report(_problem: str | None) -> None:
    pass


class TransactionsStuckError(OperationError):
    """exactly_once: transaction calls keep not returning; the worker stops rather than pile them up."""


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


@dataclass(frozen=True)
class CommitOptions:
    """What a committer needs of the settings: its timeouts (seconds), and how a refusal by the broker's
    authorizer becomes the error that names the missing ACL."""

    shutdown_timeout_s: float
    session_timeout_s: float
    refusal: Callable[[KafkaError, list[str]], Exception]
    transaction_call_timeout_s: float = 20.0
    report: Callable[[str | None], None] = _no_report
    """Why results cannot be published now (for /readyz), or None once they can again."""

    @property
    def drain_budget_s(self) -> float:
        """How long after a stop publishing may still wait (see `drain_budget_s`)."""
        return drain_budget_s(self.shutdown_timeout_s)

    @classmethod
    def from_settings(
        cls,
        kafka: KafkaSettings,
        security: SecuritySettings,
        delivery: DeliverySettings,
        report: Callable[[str | None], None] = _no_report,
    ) -> CommitOptions:
        return cls(
            shutdown_timeout_s=delivery.shutdown_timeout_s,
            session_timeout_s=kafka.session_timeout_ms / 1000.0,
            refusal=partial(publish_refusal, kafka, security),
            transaction_call_timeout_s=delivery.transaction_call_timeout_s,
            report=report,
        )


class Committer(ABC):
    """Publishes windows, accounts for their deliveries and commits what they consumed, the way one
    delivery mode does (see the module docstring)."""

    transactional: ClassVar[bool] = False
    """The consumer leaves commits to the producer's transactions (no auto-commit)."""
    recovering: str | None = None
    """Why nothing can be published until `recover()` succeeds (exactly_once only), else None."""

    def __init__(
        self,
        options: CommitOptions,
        consumer: ReviewConsumer,
        publisher: ResultPublisher,
        book: PartitionBook,
        records: OutboundRecords,
        run: RunTracker,
        metrics: WorkerMetrics,
    ) -> None:
        self._options = options
        self._consumer = consumer
        self._publisher = publisher
        self._book = book
        self._records = records
        self._run = run
        self._metrics = metrics
        self._first_failure: Delivery | None = None

    @classmethod
    @abstractmethod
    def prepare(
        cls,
        publisher: ResultPublisher,
        kafka: KafkaSettings,
        security: SecuritySettings,
        delivery: DeliverySettings,
    ) -> None:
        """Readies `publisher` before anything is consumed (at start-up: a StartupError when refused)."""

    def publish(self, records: list[OutboundRecord]) -> list[PartitionKey]:
        """Publishes one window's records (in input order), each too large for its topic replaced by its
        stand-in; returns the partitions whose inputs must be read again from their committed offsets (an
        aborted transaction), usually none."""
        return self._publish([self._records.replacement(record) or record for record in records])

    def settle(self) -> None:
        """Takes the delivery reports in, then commits (or stores for the next commit) what became
        committable."""
        self._take_deliveries()
        self._commit_settled()

    def raise_for_error(self) -> None:
        """Raises the first delivery that failed for good, so the worker stops before going past it (its
        offset is never committed); a refusal by the authorizer says which ACL is missing."""
        failed = self._first_failure
        if failed is None:
            return
        if failed.error is not None and is_authorization_error(failed.error):
            raise self._options.refusal(failed.error, [failed.record.topic])
        raise delivery_failure(failed.record, failed.error)

    @abstractmethod
    def _publish(self, records: list[OutboundRecord]) -> list[PartitionKey]:
        """The delivery mode's way of sending a window's records (see `publish`)."""

    @abstractmethod
    def _commit_settled(self) -> None:
        """The delivery mode's way of committing what the acknowledgements made committable."""

    def _take_deliveries(self) -> None:
        """The delivery reports since the last call: acknowledged records advance the partition book and
        are counted; a record refused as too large is replaced by its stand-in (acked when delivered); any
        other failure is kept for `raise_for_error` (never acked: its offset and everything after it in the
        partition stay uncommitted)."""
        deliveries = self._publisher.take_deliveries()
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
                stand_in = self._records.replacement(record, delivery.error)
                if stand_in is not None:
                    self._publisher.publish(stand_in)
                    continue
                self._metrics.delivery_failures.labels(record.topic).inc()
                if self._first_failure is None:
                    self._first_failure = delivery
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

    def recover(self) -> bool:
        """While `recovering`: one more try to publish again; True once it can (then every partition is to be
        read again from its committed offset)."""
        return True

    @abstractmethod
    def revoked(self, partitions: list[PartitionKey]) -> str:
        """Before `partitions` go to another member: commits their finished work. Returns what was
        committed, for the log line."""

    @abstractmethod
    def commit_final(self, deadline: float, clock: Callable[[], float]) -> None:
        """On stop, after the producer was flushed: commits what is acknowledged (`deadline` on `clock`)."""


class AtLeastOnceCommitter(Committer):
    """Idempotent producer; offsets stored after acknowledgement and committed by librdkafka."""

    @classmethod
    def prepare(
        cls,
        publisher: ResultPublisher,
        kafka: KafkaSettings,
        security: SecuritySettings,
        delivery: DeliverySettings,
    ) -> None:
        """Nothing to ready: the idempotent producer needs no registration."""

    def _publish(self, records: list[OutboundRecord]) -> list[PartitionKey]:
        for record in records:
            self._publisher.publish(record)
        return []

    def _commit_settled(self) -> None:
        committable = self._book.offsets.committable()
        if committable:
            # Stored, not committed: auto-commit commits stored offsets every commit_interval_ms.
            self._consumer.store(committable)

    def revoked(self, partitions: list[PartitionKey]) -> str:
        # Everything published for them is flushed and acknowledged first, so the next owner does not
        # redo it; what is still unacknowledged after the shutdown time (what is left of it when stopping)
        # stays uncommitted (redone, no loss).
        left_s = self._run.stop_time_left(self._options.drain_budget_s)
        remaining = self._publisher.flush(self._options.shutdown_timeout_s if left_s is None else left_s)
        self.settle()
        final = self._book.positions(partitions)
        try:
            self._consumer.commit_now(final)
            self._metrics.offsets_committed.inc()
        except KafkaException as exc:
            log.warning("commit on revoke failed (%s); the next owner may redo some work", exc)
        return f"committed {format_offsets(final)}; {remaining} outputs still unacknowledged"

    def commit_final(self, deadline: float, clock: Callable[[], float]) -> None:
        # A member stopping during a rebalance is refused (ILLEGAL_GENERATION / REBALANCE_IN_PROGRESS)
        # until it has joined the new generation: it waits for that, up to a session timeout or what
        # is left of the shutdown time, so the next owner does not redo published work.
        wait_s = max(deadline - clock(), self._options.session_timeout_s)
        try:
            retries = self._consumer.commit_through_rebalance(self._book.positions, wait_s)
            self._metrics.offsets_committed.inc()
            if retries:
                log.info("final commit went through after the rebalance (%d retries)", retries)
        except KafkaException as exc:
            # E.g. evicted from the group: the next owner redoes the uncommitted tail (no loss).
            log.warning("final commit failed (%s); uncommitted inputs will be processed again", exc)


class ExactlyOnceCommitter(Committer):
    """Transactional producer: each window's records and offsets commit together or not at all."""

    transactional = True
    _recovering_since = 0.0
    _reported = False  # a problem was reported to /readyz and not yet cleared

    @classmethod
    def prepare(
        cls,
        publisher: ResultPublisher,
        kafka: KafkaSettings,
        security: SecuritySettings,
        delivery: DeliverySettings,
    ) -> None:
        """Registers the transactional id, fencing an older instance that used it."""
        kafka_clients.init_transactions(publisher, kafka, security, delivery)

    def _publish(self, records: list[OutboundRecord]) -> list[PartitionKey]:
        """An abortable error aborts the transaction: the caller rewinds the returned partitions to their
        committed offsets, so the window is consumed and labelled again. A fatal one (e.g. fenced by a
        newer instance) is raised and stops the worker."""
        if not records or self.recovering is not None:
            return []  # recovering: nothing goes out; every partition is read again once it is over
        group_metadata = self._consumer.group_metadata()
        try:
            aborted = self._publisher.publish_transaction(
                records,
                group_metadata,
                self._options.transaction_call_timeout_s,
                give_up=self._out_of_time,
                on_wait=self._waiting,
            )
        except CallAbandoned as exc:
            self._give_up(f"{exc}; {len(records)} records of inputs of {_partitions_of(records)}")
            return []
        if aborted is not None:
            if is_authorization_error(aborted.error):  # aborted, nothing visible; rewinding would only loop
                raise self._options.refusal(aborted.error, [r.topic for r in records])
            for record in aborted.too_large:
                if record.key is None and record.value is None:  # a stand-in: nothing left to drop
                    raise delivery_failure(record, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
                # Its stand-in goes when the window comes again: one abort, not an endless loop.
                self._records.refused_in_aborted_transaction(record)
            partitions = sorted({(r.source.topic, r.source.partition) for r in records})
            log.warning(
                "transaction aborted (%s): rewinding %s%s",
                aborted.error.str(),
                format_partitions(partitions),
                f"; {len(aborted.too_large)} records refused as too large go as dead letters without key "
                "and value next time"
                if aborted.too_large
                else "",
            )
            self._metrics.transactions.labels("aborted").inc()
            return partitions
        self._metrics.transactions.labels("committed").inc()
        if self._reported:
            self._reported = False
            self._options.report(None)
        self.settle()
        return []

    def recover(self) -> bool:
        """While `recovering`: tries to initialise the replacing producer (up to `_RECOVERY_STEP_S`, resumed
        on the next call), which fences the given-up one and finishes its transaction (committed or aborted,
        as far as it got). True once transactions work again: the caller then reads every partition again from
        its committed offset, which now says whether that transaction counted. A fatal error is raised."""
        if self.recovering is None:
            return True
        seconds = time.monotonic() - self._recovering_since
        try:
            self._publisher.init_transactions(_RECOVERY_STEP_S, give_up=self._out_of_time)
        except CallAbandoned as exc:
            self._give_up(f"{exc} while recovering")
            return False
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is None or error.fatal() or not error.retriable():
                raise
            self._options.report(f"{self.recovering}; re-initialising for {seconds:.0f} s: {error.str()}")
            return False
        log.info("exactly_once: transactions work again after %.1f s", seconds)
        self.recovering = None
        self._reported = False
        self._options.report(None)
        return True

    def _give_up(self, reason: str) -> None:
        """A transaction call did not return in time: the producer is replaced, and nothing is published until
        the new one is initialised (`recover`). Too many calls still stuck: TransactionsStuckError."""
        self._publisher.renew()
        self._metrics.transactions.labels("given_up").inc()
        stuck = self._publisher.stuck_calls
        if stuck >= MAX_STUCK_CALLS:
            raise TransactionsStuckError(
                f"exactly_once: {stuck} transaction calls did not return (last: {reason}); stopping rather "
                "than piling up producers. Nothing of their transactions was committed by this worker's "
                "books: the next instance with this transactional id finishes them. Check the brokers."
            )
        if self.recovering is None:
            self._recovering_since = time.monotonic()
            log.error(
                "exactly_once: a transaction was given up (%s); the producer is replaced, the partitions are "
                "paused and read again from their committed offsets once transactions work again",
                reason,
            )
        self.recovering = f"exactly_once: a transaction was given up ({reason})"
        self._reported = True
        self._options.report(self.recovering)

    def _out_of_time(self) -> bool:
        """A stop whose time for publishing is up: stop waiting for a transaction call."""
        return self._run.stop_overdue(self._options.drain_budget_s)

    def _waiting(self, call: str, seconds: float) -> None:
        if seconds >= _SLOW_CALL_S:
            self._reported = True
            timeout = self._options.transaction_call_timeout_s
            self._options.report(
                f"exactly_once: {call} has waited {seconds:.0f} s for the broker (given up at {timeout:g} s)"
            )

    def _commit_settled(self) -> None:
        """Nothing: the offsets were committed in the transaction; acknowledgements only advance the book."""

    def revoked(self, partitions: list[PartitionKey]) -> str:
        # Every published window already committed with its offsets; a position is acknowledged only once
        # its transaction committed.
        return f"committed {format_offsets(self._book.positions(partitions))} in transactions"

    def commit_final(self, deadline: float, clock: Callable[[], float]) -> None:
        """Nothing left: every transaction committed its offsets."""


def _partitions_of(records: list[OutboundRecord]) -> str:
    return format_partitions({(r.source.topic, r.source.partition) for r in records})


def committer_for(delivery: str) -> type[Committer]:
    """The committer of the `delivery` setting (at_least_once | exactly_once)."""
    return ExactlyOnceCommitter if delivery == "exactly_once" else AtLeastOnceCommitter
