"""What may be committed: one checkpoint per delivery mode, behind one interface.

A checkpoint decides when consumed offsets become committed, through the `Publisher` that sends the records
and takes their delivery reports in. Both keep the worker's rule: an offset is committed only after the
broker acknowledged everything its input produced, and per partition in input order.

- `AtLeastOnceCheckpoint`: records are published one by one; once acknowledged, their contiguous offsets
  are stored and librdkafka's auto-commit commits them; revoke and stop commit synchronously.
- `ExactlyOnceCheckpoint`: each window's records and its consumed offsets commit in one transaction; an
  abortable error aborts it and the caller reads those partitions again; a fatal one (fenced by a newer
  instance) is raised and stops the worker. Every transaction call has a deadline
  (`transaction_call_timeout_s`; a stop out of time cuts it): a call past it is given up, the producer
  replaced, and the checkpoint is `recovering` until the new producer is initialised (which fences the old
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
from worker.kafka.deadline_calls import CallAbandoned
from worker.kafka.loop_context import LoopContext
from worker.kafka.partitions import PartitionKey, format_offsets, format_partitions
from worker.kafka.producer import AbortedTransaction, OutboundRecord, ResultProducer
from worker.kafka.publisher import Publisher, delivery_failure
from worker.kafka.run_tracker import drain_budget_s

__all__ = [
    "AtLeastOnceCheckpoint",
    "Checkpoint",
    "CommitOptions",
    "ExactlyOnceCheckpoint",
    "TransactionsStuckError",
    "checkpoint_for",
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


@dataclass(frozen=True)
class CommitOptions:
    """What a checkpoint needs of the settings: its timeouts (seconds), and how a refusal by the broker's
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


class Checkpoint(ABC):
    """Publishes windows through the publisher and commits what they consumed, the way one delivery mode
    does (see the module docstring)."""

    transactional: ClassVar[bool] = False
    """The consumer leaves commits to the producer's transactions (no auto-commit)."""
    recovering: str | None = None
    """Why nothing can be published until `recover()` succeeds (exactly_once only), else None."""

    def __init__(self, options: CommitOptions, publisher: Publisher, context: LoopContext) -> None:
        """Commits through `context.consumer` what `context.book` says is committable."""
        self._options = options
        self._publisher = publisher
        self._consumer, self._book = context.consumer, context.book
        self._run, self._metrics = context.run, context.metrics

    @classmethod
    def prepare(
        cls,
        producer: ResultProducer,
        kafka: KafkaSettings,
        security: SecuritySettings,
        delivery: DeliverySettings,
    ) -> None:
        """Readies `producer` before anything is consumed: exactly_once registers the transactional id,
        fencing an older instance that used it (a StartupError when refused); the idempotent producer of
        at_least_once needs no registration."""
        if cls.transactional:
            kafka_clients.init_transactions(producer, kafka, security, delivery)

    @abstractmethod
    def publish(self, records: list[OutboundRecord]) -> list[PartitionKey]:
        """Publishes one window's records (in input order); returns the partitions whose inputs must be read
        again from their committed offsets (an aborted transaction), usually none."""

    @abstractmethod
    def commit(self) -> None:
        """Takes the delivery reports in, then commits (or stores for the next commit) what became
        committable."""

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


class AtLeastOnceCheckpoint(Checkpoint):
    """Idempotent producer; offsets stored after acknowledgement and committed by librdkafka."""

    def publish(self, records: list[OutboundRecord]) -> list[PartitionKey]:
        self._publisher.publish(records)
        return []

    def commit(self) -> None:
        """Commits what the acknowledgements made committable.

        1. Take the delivery reports in: acknowledged offsets advance the partition book.
        2. Store each partition's contiguous acknowledged offsets (librdkafka's auto-commit commits them).
        """
        # Step 1.
        self._publisher.take_deliveries()
        # Step 2.
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
        self.commit()
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


class ExactlyOnceCheckpoint(Checkpoint):
    """Transactional producer: each window's records and offsets commit together or not at all."""

    transactional = True
    _recovering_since = 0.0
    _reported = False  # a problem was reported to /readyz and not yet cleared

    def publish(self, records: list[OutboundRecord]) -> list[PartitionKey]:
        """Commits one window as a transaction.

        1. Nothing while recovering (every partition is read again once it is over), nor for no records.
        2. The records and, per partition, the offset after its last one, in one transaction.
        3. A call past its deadline: the transaction is given up and the checkpoint recovers.
        4. Aborted (an abortable error): the caller rewinds the returned partitions to their committed
           offsets, so the window is consumed and labelled again; a refusal is raised instead.
        5. Committed: the delivery reports taken in (they advance the partition book and the counts).
        A fatal error (e.g. fenced by a newer instance) is raised and stops the worker.
        """
        # Step 1.
        if not records or self.recovering is not None:
            return []
        # Step 2.
        try:
            aborted = self._publisher.publish_transaction(
                records,
                self._consumer.group_metadata(),
                self._options.transaction_call_timeout_s,
                give_up=self._out_of_time,
                on_wait=self._waiting,
            )
        except CallAbandoned as exc:
            # Step 3.
            self._give_up(f"{exc}; {len(records)} records of inputs of {_partitions_of(records)}")
            return []
        if aborted is not None:
            # Step 4.
            return self._aborted(aborted, records)
        # Step 5.
        self._metrics.transactions.labels("committed").inc()
        if self._reported:
            self._reported = False
            self._options.report(None)
        self.commit()
        return []

    def _aborted(self, aborted: AbortedTransaction, records: list[OutboundRecord]) -> list[PartitionKey]:
        """The partitions of an aborted transaction, to read again; its records refused as too large go as
        stand-ins next time (a stand-in refused too stops the worker)."""
        if is_authorization_error(aborted.error):  # aborted, nothing visible; rewinding would only loop
            raise self._options.refusal(aborted.error, [r.topic for r in records])
        for record in aborted.too_large:
            if record.key is None and record.value is None:  # a stand-in: nothing left to drop
                raise delivery_failure(record, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
            # Its stand-in goes when the window comes again: one abort, not an endless loop.
            self._publisher.refused_in_aborted_transaction(record)
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

    def commit(self) -> None:
        """Takes the delivery reports in: they only advance the book (the offsets were committed in the
        transaction)."""
        self._publisher.take_deliveries()

    def recover(self) -> bool:
        """While `recovering`: tries to initialise the replacing producer (up to `_RECOVERY_STEP_S`, resumed
        on the next call), which fences the given-up one and finishes its transaction (committed or aborted,
        as far as it got). True once transactions work again: the caller then reads every partition again from
        its committed offset, which now says whether that transaction counted. A fatal error is raised."""
        if self.recovering is None:
            return True
        seconds = time.monotonic() - self._recovering_since
        try:
            self._publisher.producer.init_transactions(_RECOVERY_STEP_S, give_up=self._out_of_time)
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
        producer = self._publisher.producer
        producer.renew()
        self._metrics.transactions.labels("given_up").inc()
        stuck = producer.stuck_calls
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

    def revoked(self, partitions: list[PartitionKey]) -> str:
        # Every published window already committed with its offsets; a position is acknowledged only once
        # its transaction committed.
        return f"committed {format_offsets(self._book.positions(partitions))} in transactions"

    def commit_final(self, deadline: float, clock: Callable[[], float]) -> None:
        """Nothing left: every transaction committed its offsets."""


def _partitions_of(records: list[OutboundRecord]) -> str:
    return format_partitions({(r.source.topic, r.source.partition) for r in records})


def checkpoint_for(delivery: str) -> type[Checkpoint]:
    """The checkpoint of the `delivery` setting (at_least_once | exactly_once)."""
    return ExactlyOnceCheckpoint if delivery == "exactly_once" else AtLeastOnceCheckpoint
