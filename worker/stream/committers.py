"""How published work becomes committed offsets: one committer per delivery mode, behind one interface.

Both keep the worker's rule: an offset is committed only after the broker acknowledged everything its
input produced, and per partition in input order.

- `AtLeastOnceCommitter`: records are published one by one; once acknowledged, their contiguous offsets
  are stored and librdkafka's auto-commit commits them; revoke and stop commit synchronously.
- `ExactlyOnceCommitter`: each window's records and its consumed offsets commit in one transaction; an
  abortable error aborts it and the caller reads those partitions again; a fatal one (fenced by a newer
  instance) is raised and stops the worker.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from confluent_kafka import KafkaException

from worker.config import WorkerSettings
from worker.metrics import WorkerMetrics
from worker.stream import startup
from worker.stream.authorization import is_authorization_error, publish_refusal
from worker.stream.consumer import ReviewConsumer
from worker.stream.partitions import PartitionBook, PartitionKey, format_offsets, format_partitions
from worker.stream.producer import OutboundRecord, ResultPublisher

__all__ = ["AtLeastOnceCommitter", "Committer", "ExactlyOnceCommitter", "committer_for"]

log = logging.getLogger(__name__)


class Committer(ABC):
    """Publishes windows and commits what they consumed, the way one delivery mode does.

    `acknowledge` takes the producer's delivery reports into the partition book (the caller's, since it
    also counts and measures them); the committer decides when and how the offsets that became
    committable are committed.
    """

    transactional: ClassVar[bool] = False
    """The consumer leaves commits to the producer's transactions (no auto-commit)."""

    def __init__(
        self,
        settings: WorkerSettings,
        consumer: ReviewConsumer,
        publisher: ResultPublisher,
        book: PartitionBook,
        metrics: WorkerMetrics,
        acknowledge: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._consumer = consumer
        self._publisher = publisher
        self._book = book
        self._metrics = metrics
        self._acknowledge = acknowledge

    @classmethod
    @abstractmethod
    def prepare(cls, publisher: ResultPublisher, settings: WorkerSettings) -> None:
        """Readies `publisher` before anything is consumed (at start-up: a StartupError when refused)."""

    @abstractmethod
    def publish(self, records: list[OutboundRecord]) -> list[PartitionKey]:
        """Publishes one window's records (in input order); returns the partitions whose inputs must be
        read again from their committed offsets (an aborted transaction), usually none."""

    @abstractmethod
    def settle(self) -> None:
        """Takes the delivery reports in and commits (or stores for the next commit) what became
        committable."""

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
    def prepare(cls, publisher: ResultPublisher, settings: WorkerSettings) -> None:
        """Nothing to ready: the idempotent producer needs no registration."""

    def publish(self, records: list[OutboundRecord]) -> list[PartitionKey]:
        for record in records:
            self._publisher.publish(record)
        return []

    def settle(self) -> None:
        self._acknowledge()
        committable = self._book.offsets.committable()
        if committable:
            # Stored, not committed: auto-commit commits stored offsets every commit_interval_ms.
            self._consumer.store(committable)

    def revoked(self, partitions: list[PartitionKey]) -> str:
        # Everything published for them is flushed and acknowledged first, so the next owner does not
        # redo it; what is still unacknowledged after the shutdown time stays uncommitted (redone, no loss).
        remaining = self._publisher.flush(self._settings.shutdown_timeout_s)
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
        wait_s = max(deadline - clock(), self._settings.session_timeout_ms / 1000)
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

    @classmethod
    def prepare(cls, publisher: ResultPublisher, settings: WorkerSettings) -> None:
        """Registers the transactional id, fencing an older instance that used it."""
        startup.init_transactions(publisher, settings)

    def publish(self, records: list[OutboundRecord]) -> list[PartitionKey]:
        """An abortable error aborts the transaction: the caller rewinds the returned partitions to their
        committed offsets, so the window is consumed and labelled again. A fatal one (e.g. fenced by a
        newer instance) is raised and stops the worker."""
        if not records:
            return []
        timeout_s = self._settings.transaction_timeout_ms / 1000.0
        group_metadata = self._consumer.group_metadata()
        aborted = self._publisher.publish_transaction(records, group_metadata, timeout_s)
        if aborted is not None:
            if is_authorization_error(aborted):  # aborted, nothing visible; rewinding would only loop
                raise publish_refusal(self._settings, aborted, [r.topic for r in records])
            partitions = sorted({(r.source.topic, r.source.partition) for r in records})
            log.warning(
                "transaction aborted (%s): rewinding %s", aborted.str(), format_partitions(partitions)
            )
            self._metrics.transactions.labels("aborted").inc()
            return partitions
        self._metrics.transactions.labels("committed").inc()
        self.settle()
        return []

    def settle(self) -> None:
        # The offsets were committed in the transaction; acknowledgements only advance the book.
        self._acknowledge()

    def revoked(self, partitions: list[PartitionKey]) -> str:
        # Every published window already committed with its offsets; a position is acknowledged only once
        # its transaction committed.
        return f"committed {format_offsets(self._book.positions(partitions))} in transactions"

    def commit_final(self, deadline: float, clock: Callable[[], float]) -> None:
        """Nothing left: every transaction committed its offsets."""


def committer_for(settings: WorkerSettings) -> type[Committer]:
    """The committer of `settings.delivery`."""
    return ExactlyOnceCommitter if settings.delivery == "exactly_once" else AtLeastOnceCommitter
