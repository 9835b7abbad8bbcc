"""The committers per delivery mode, against stand-ins for the consumer and the producer: at-least-once
stores offsets only once acknowledged and commits revoked partitions after flushing; exactly-once commits in
transactions, hands an aborted window's partitions back for a rewind, and raises a refusal.

The real-broker evidence is tests/integration/test_exactly_once*.py, tests/faults/test_rebalance_storm.py and
tests/faults/test_kill9.py.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from confluent_kafka import KafkaError
from prometheus_client import CollectorRegistry

from worker.config import WorkerSettings
from worker.metrics import create_metrics
from worker.stream.authorization import AuthorizationError
from worker.stream.committers import AtLeastOnceCommitter, Committer, ExactlyOnceCommitter, committer_for
from worker.stream.consumer import ReviewConsumer
from worker.stream.partitions import PartitionBook, PartitionKey
from worker.stream.producer import OutboundRecord, ResultPublisher, SourcePosition

T = "reviews"


class FakeConsumer:
    def __init__(self) -> None:
        self.stored: list[dict[PartitionKey, int]] = []
        self.commits: list[dict[PartitionKey, int]] = []

    def store(self, offsets: dict[PartitionKey, int]) -> None:
        self.stored.append(dict(offsets))

    def commit_now(self, offsets: dict[PartitionKey, int]) -> None:
        self.commits.append(dict(offsets))

    def group_metadata(self) -> str:
        return "group-metadata"


class FakePublisher:
    def __init__(self, abort_with: KafkaError | None = None) -> None:
        self.published: list[OutboundRecord] = []
        self.transactions: list[list[OutboundRecord]] = []
        self.abort_with = abort_with
        self.flushes = 0

    def publish(self, record: OutboundRecord) -> None:
        self.published.append(record)

    def publish_transaction(
        self, records: list[OutboundRecord], metadata: Any, _t: float
    ) -> KafkaError | None:
        assert metadata == "group-metadata"
        if self.abort_with is not None:
            return self.abort_with
        self.transactions.append(list(records))
        return None

    def flush(self, _timeout_s: float) -> int:
        self.flushes += 1
        return 0


def record(partition: int, offset: int) -> OutboundRecord:
    source = SourcePosition(T, partition, offset, None)
    return OutboundRecord("results", b"{}", None, None, None, source, "result")


def make(
    mode: str, publisher: FakePublisher | None = None
) -> tuple[Committer, FakeConsumer, FakePublisher, PartitionBook, list[int]]:
    settings = WorkerSettings(delivery=mode)
    consumer, publisher = FakeConsumer(), publisher or FakePublisher()
    book = PartitionBook()
    book.assigned([(T, 0), (T, 1)])
    acks: list[int] = []

    def acknowledge() -> None:  # the worker's: acks what was published (here: everything, in order)
        for rec in publisher.published + [r for txn in publisher.transactions for r in txn]:
            book.acknowledged((T, rec.source.partition), rec.source.offset, None)
        acks.append(1)

    committer = committer_for(settings)(
        settings,
        cast(ReviewConsumer, consumer),
        cast(ResultPublisher, publisher),
        book,
        create_metrics(CollectorRegistry()),
        acknowledge,
    )
    return committer, consumer, publisher, book, acks


def test_the_delivery_mode_picks_the_committer() -> None:
    assert committer_for(WorkerSettings(delivery="at_least_once")) is AtLeastOnceCommitter
    assert committer_for(WorkerSettings(delivery="exactly_once")) is ExactlyOnceCommitter
    assert ExactlyOnceCommitter.transactional and not AtLeastOnceCommitter.transactional


def test_at_least_once_stores_only_acknowledged_offsets_and_commits_revoked_partitions() -> None:
    committer, consumer, publisher, book, _ = make("at_least_once")
    for offset in range(3):
        book.consumed((T, 0), offset, None)
    book.consumed((T, 1), 5, None)
    assert committer.publish([record(0, 0), record(0, 1)]) == []
    assert consumer.stored == []  # published is not acknowledged
    committer.settle()
    assert consumer.stored == [{(T, 0): 2}]  # offset 2 is not done: the position stops before it
    committer.settle()
    assert consumer.stored == [{(T, 0): 2}]  # each advance is stored once
    said = committer.revoked([(T, 0), (T, 1)])
    assert publisher.flushes == 1 and consumer.commits == [{(T, 0): 2}]  # nothing done of t[1]: not committed
    assert said == "committed reviews[0]=2; 0 outputs still unacknowledged"


def test_exactly_once_commits_in_transactions_and_never_stores() -> None:
    committer, consumer, publisher, book, acks = make("exactly_once")
    book.consumed((T, 0), 0, None)
    assert committer.publish([]) == [] and publisher.transactions == []  # no empty transactions
    assert committer.publish([record(0, 0)]) == []
    assert publisher.transactions == [[record(0, 0)]] and acks == [1]  # acknowledged once committed
    committer.settle()
    assert consumer.stored == [] and consumer.commits == []  # offsets went with the transaction
    assert committer.revoked([(T, 0)]) == "committed reviews[0]=1 in transactions"
    assert publisher.flushes == 0


def test_exactly_once_hands_an_aborted_windows_partitions_back_for_a_rewind() -> None:
    aborted = KafkaError(KafkaError._STATE)
    committer, _, _, _, acks = make("exactly_once", FakePublisher(abort_with=aborted))
    assert committer.publish([record(1, 4), record(0, 9), record(1, 5)]) == [(T, 0), (T, 1)]
    assert acks == []


def test_exactly_once_raises_a_refused_transaction() -> None:
    refused = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    committer, *_ = make("exactly_once", FakePublisher(abort_with=refused))
    with pytest.raises(AuthorizationError):
        committer.publish([record(0, 0)])
