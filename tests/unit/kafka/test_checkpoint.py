"""The checkpoints per delivery mode and the publisher they share, against stand-ins for the consumer and the
producer: at-least-once stores offsets only once acknowledged and commits revoked partitions after flushing;
exactly-once commits in transactions, hands an aborted window's partitions back for a rewind, and raises a
refusal; the publisher replaces records too large and raises the first failure before the next produce.

The real-broker evidence is tests/integration/test_exactly_once*.py, tests/faults/test_rebalance_storm.py and
tests/faults/test_kill9.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry

from worker.config import WorkerSettings
from worker.health import HealthState
from worker.kafka.authorization import AuthorizationError
from worker.kafka.checkpoint import (
    MAX_STUCK_CALLS,
    AtLeastOnceCheckpoint,
    Checkpoint,
    CommitOptions,
    ExactlyOnceCheckpoint,
    TransactionsStuckError,
    checkpoint_for,
)
from worker.kafka.consume_window import ConsumeWindow
from worker.kafka.consumer import ReviewConsumer
from worker.kafka.deadline_calls import CallAbandoned
from worker.kafka.loop_context import LoopContext
from worker.kafka.partitions import PartitionBook, PartitionKey
from worker.kafka.producer import (
    AbortedTransaction,
    Delivery,
    OutboundRecord,
    ResultProducer,
    SourcePosition,
)
from worker.kafka.publisher import DeliveryFailedError, Publisher
from worker.kafka.records import OutboundRecords
from worker.kafka.run_tracker import RunTracker
from worker.kafka.undecodable import UndecodableBatches
from worker.metrics import create_metrics

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
        self, records: list[OutboundRecord], metadata: Any, _t: float, **_waits: Any
    ) -> AbortedTransaction | None:
        assert metadata == "group-metadata"
        if self.abort_with is not None:
            return AbortedTransaction(self.abort_with)
        self.transactions.append(list(records))
        return None

    def flush(self, _timeout_s: float) -> int:
        self.flushes += 1
        return 0


def record(partition: int, offset: int) -> OutboundRecord:
    source = SourcePosition(T, partition, offset, None)
    return OutboundRecord("results", b"{}", None, None, None, source, "result")


class FakeDeliveringPublisher(FakePublisher):
    """FakePublisher whose records are all acknowledged, in order, at the next `take_deliveries`."""

    def __init__(self, abort_with: KafkaError | None = None) -> None:
        super().__init__(abort_with)
        self.taken = 0

    def take_deliveries(self) -> list[Delivery]:
        sent = self.published + [r for txn in self.transactions for r in txn]
        new, self.taken = sent[self.taken :], len(sent)
        return [Delivery(record, None) for record in new]


def make(
    mode: str, publisher: FakePublisher | None = None, report: Callable[[str | None], None] | None = None
) -> tuple[Checkpoint, FakeConsumer, FakePublisher, PartitionBook, RunTracker]:
    settings = WorkerSettings(delivery=mode)
    consumer, publisher = FakeConsumer(), publisher or FakeDeliveringPublisher()
    book = PartitionBook()
    book.assigned([(T, 0), (T, 1)])
    run = RunTracker(lambda: 0.0)
    records = OutboundRecords(
        labels=["negative", "positive"],
        output_topic="results",
        dlq_topic="dlq",
        worker_id="w",
        partitioning="same",
        partition_counts={"results": 2, "dlq": 2},
        max_message_bytes={"results": 1_000_000, "dlq": 1_000_000},
    )
    s = settings.sections
    options = CommitOptions.from_settings(
        s.kafka, s.security, s.delivery, report=report or (lambda _problem: None)
    )
    context = LoopContext(
        cast(ReviewConsumer, consumer),
        ConsumeWindow(max_messages=16, max_wait_ms=10, max_bytes=1 << 20, clock=lambda: 0.0),
        book,
        UndecodableBatches(0, lambda _key: 0),
        run,
        HealthState(30.0, lambda: 0.0),
        create_metrics(CollectorRegistry()),
        lambda: 0.0,
    )
    sender = Publisher(cast(ResultProducer, publisher), records, context, options.refusal)
    checkpoint = checkpoint_for(s.delivery.delivery)(options, sender, context)
    return checkpoint, consumer, publisher, book, run


def test_the_delivery_mode_picks_the_checkpoint() -> None:
    assert checkpoint_for("at_least_once") is AtLeastOnceCheckpoint
    assert checkpoint_for("exactly_once") is ExactlyOnceCheckpoint
    assert ExactlyOnceCheckpoint.transactional and not AtLeastOnceCheckpoint.transactional


def test_at_least_once_stores_only_acknowledged_offsets_and_commits_revoked_partitions() -> None:
    checkpoint, consumer, publisher, book, _ = make("at_least_once")
    for offset in range(3):
        book.consumed((T, 0), offset, None)
    book.consumed((T, 1), 5, None)
    assert checkpoint.publish([record(0, 0), record(0, 1)]) == []
    assert consumer.stored == []  # published is not acknowledged
    checkpoint.commit()
    assert consumer.stored == [{(T, 0): 2}]  # offset 2 is not done: the position stops before it
    checkpoint.commit()
    assert consumer.stored == [{(T, 0): 2}]  # each advance is stored once
    said = checkpoint.revoked([(T, 0), (T, 1)])
    assert publisher.flushes == 1 and consumer.commits == [{(T, 0): 2}]  # nothing done of t[1]: not committed
    assert said == "committed reviews[0]=2; 0 outputs still unacknowledged"


def test_exactly_once_commits_in_transactions_and_never_stores() -> None:
    checkpoint, consumer, publisher, book, run = make("exactly_once")
    book.consumed((T, 0), 0, None)
    assert checkpoint.publish([]) == [] and publisher.transactions == []  # no empty transactions
    assert checkpoint.publish([record(0, 0)]) == []
    assert publisher.transactions == [[record(0, 0)]]
    assert run.summary.results == 1  # acknowledged once committed
    checkpoint.commit()
    assert consumer.stored == [] and consumer.commits == []  # offsets went with the transaction
    assert checkpoint.revoked([(T, 0)]) == "committed reviews[0]=1 in transactions"
    assert publisher.flushes == 0


def test_exactly_once_hands_an_aborted_windows_partitions_back_for_a_rewind() -> None:
    aborted = KafkaError(KafkaError._STATE)
    checkpoint, _, _, _, run = make("exactly_once", FakeDeliveringPublisher(abort_with=aborted))
    assert checkpoint.publish([record(1, 4), record(0, 9), record(1, 5)]) == [(T, 0), (T, 1)]
    checkpoint.commit()
    assert run.summary.results == 0


def test_exactly_once_raises_a_refused_transaction() -> None:
    refused = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    checkpoint, *_ = make("exactly_once", FakeDeliveringPublisher(abort_with=refused))
    with pytest.raises(AuthorizationError):
        checkpoint.publish([record(0, 0)])


class FakeRefusingPublisher(FakePublisher):
    """FakePublisher whose broker refuses some records: `refusals` maps an input offset to the error of its
    first record; everything else is acknowledged at the next `take_deliveries`."""

    def __init__(self, refusals: dict[int, KafkaError]) -> None:
        super().__init__()
        self.refusals = dict(refusals)
        self.taken = 0

    def take_deliveries(self) -> list[Delivery]:
        new, self.taken = self.published[self.taken :], len(self.published)
        out = []
        for rec in new:
            error = self.refusals.pop(rec.source.offset, None) if rec.value is not None else None
            out.append(Delivery(rec, error))
        return out


def three_published_one_refused(
    refusal: KafkaError,
) -> tuple[Checkpoint, FakeConsumer, FakeRefusingPublisher, PartitionBook, RunTracker]:
    """At-least-once: offsets 0-2 of partition 0 consumed, published and their reports taken in; the broker
    refuses offset 1 with `refusal`."""
    publisher = FakeRefusingPublisher({1: refusal})
    checkpoint, consumer, _, book, run = make("at_least_once", publisher)
    for offset in range(3):
        book.consumed((T, 0), offset, None)
    checkpoint.publish([record(0, 0), record(0, 1), record(0, 2)])
    checkpoint.commit()
    return checkpoint, consumer, publisher, book, run


def test_a_record_the_broker_refuses_as_too_large_is_replaced_and_its_stand_in_acked() -> None:
    refusal = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    checkpoint, consumer, publisher, _, run = three_published_one_refused(refusal)
    # Offsets 0 and 2 acked; 1 refused: its stand-in sent.
    assert [(r.source.offset, r.kind, r.value) for r in publisher.published[3:]] == [
        (1, "value_too_large", None)
    ]
    assert consumer.stored == [{(T, 0): 1}]  # nothing past the refused one yet
    checkpoint.commit()  # the stand-in is acknowledged
    assert consumer.stored[-1] == {(T, 0): 3}
    assert (run.summary.results, run.summary.dead_letters_by_kind) == (2, {"value_too_large": 1})
    assert checkpoint.publish([]) == []  # a replaced record is not a failure: nothing raised


def test_any_other_refusal_is_never_acked_and_is_raised_before_the_worker_goes_on() -> None:
    refusal = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    checkpoint, consumer, publisher, book, run = three_published_one_refused(refusal)
    assert (
        consumer.stored == [{(T, 0): 1}] and run.summary.results == 2
    )  # the failed offset blocks its partition
    book.consumed((T, 0), 3, None)
    with pytest.raises(DeliveryFailedError, match=r"input reviews/0/1") as failed:
        checkpoint.publish([record(0, 3)])  # raised before the next produce
    assert failed.value.topic == "results"
    assert [r.source.offset for r in publisher.published] == [0, 1, 2]  # offset 3 was not produced
    assert "check that the topic exists" in str(failed.value)


class FakeSizeRefusingPublisher(FakeDeliveringPublisher):
    """A transactional FakePublisher whose broker refuses records of more than `limit` bytes of key and value
    (as if the worker's estimate were wrong): the transaction holding one is aborted, naming it."""

    def __init__(self, limit: int, bumps_after_refusal: int = 0) -> None:
        super().__init__()
        self.limit = limit
        self.aborts = 0
        self.bumps_after_refusal = bumps_after_refusal  # transactions aborted after a refusal (epoch bumps)
        self._bumps_due = 0

    def publish_transaction(
        self, records: list[OutboundRecord], metadata: Any, _t: float, **_waits: Any
    ) -> AbortedTransaction | None:
        too_large = tuple(r for r in records if len(r.key or b"") + len(r.value or b"") > self.limit)
        if too_large:
            self.aborts += 1
            self._bumps_due = self.bumps_after_refusal
            return AbortedTransaction(KafkaError(KafkaError._STATE), too_large)
        if self._bumps_due:  # as librdkafka after a refused record: OUT_OF_ORDER_SEQUENCE_NUMBER, abort
            self._bumps_due -= 1
            self.aborts += 1
            return AbortedTransaction(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER))
        return super().publish_transaction(records, metadata, _t)


def test_exactly_once_a_window_aborted_for_a_too_large_record_sends_its_stand_in_next_time() -> None:
    publisher = FakeSizeRefusingPublisher(limit=1000)
    checkpoint, _, _, book, run = make("exactly_once", publisher)
    source = SourcePosition(T, 0, 1, None)
    huge_key = OutboundRecord("results", b"{}", b"k" * 5000, None, None, source, "result")
    window = [record(0, 0), huge_key, record(0, 2)]
    for offset in range(3):
        book.consumed((T, 0), offset, None)
    assert checkpoint.publish(window) == [(T, 0)]  # aborted: read again
    book.rewind([(T, 0)])
    for offset in range(3):
        book.consumed((T, 0), offset, None)
    assert checkpoint.publish(window) == []  # the same window again: its stand-in goes instead
    committed = publisher.transactions[0]
    assert [(r.source.offset, r.kind, r.key, r.value) for r in committed] == [
        (0, "result", None, b"{}"),
        (1, "value_too_large", None, None),
        (2, "result", None, b"{}"),
    ]
    assert publisher.aborts == 1 and book.positions([(T, 0)]) == {(T, 0): 3}
    assert (run.summary.results, run.summary.dead_letters_by_kind) == (2, {"value_too_large": 1})


def test_exactly_once_a_refused_record_is_sent_once_even_when_its_stand_in_s_transaction_aborts_too() -> None:
    publisher = FakeSizeRefusingPublisher(limit=1000, bumps_after_refusal=2)
    checkpoint, _, _, book, run = make("exactly_once", publisher)
    source = SourcePosition(T, 0, 1, None)
    huge_key = OutboundRecord("results", b"{}", b"k" * 5000, None, None, source, "result")
    window = [record(0, 0), huge_key, record(0, 2)]
    outcomes = []
    for _attempt in range(4):
        for offset in range(3):
            book.consumed((T, 0), offset, None)
        outcomes.append(checkpoint.publish(window))
        book.rewind(outcomes[-1])
    # Refused once; two aborts of the stand-in's transaction; committed; then nothing is owed any more.
    assert outcomes == [[(T, 0)], [(T, 0)], [(T, 0)], []]
    assert publisher.aborts == 3 and len(publisher.transactions) == 1
    assert [r.kind for r in publisher.transactions[0]] == ["result", "value_too_large", "result"]
    assert (run.summary.results, run.summary.dead_letters_by_kind) == (2, {"value_too_large": 1})


def test_exactly_once_a_stand_in_refused_as_too_large_stops_the_worker_saying_what_to_raise() -> None:
    publisher = FakeSizeRefusingPublisher(limit=-1)  # refuses everything, even a record of headers only
    checkpoint, *_ = make("exactly_once", publisher)
    source = SourcePosition(T, 0, 1, None)
    checkpoint.publish([OutboundRecord("results", b"{}", b"k", None, None, source, "result")])
    with pytest.raises(
        DeliveryFailedError, match=r"too large .* even as a dead letter without key"
    ) as failed:
        checkpoint.publish([OutboundRecord("results", b"{}", b"k", None, None, source, "result")])
    assert "max.message.bytes" in str(failed.value) and "topic exists" not in str(failed.value)
    assert publisher.aborts == 2


def test_a_record_larger_than_its_topic_is_replaced_before_it_is_sent() -> None:
    checkpoint, _, publisher, book, _ = make("at_least_once")
    book.consumed((T, 0), 0, None)
    huge = OutboundRecord(
        "results", b"x" * 2_000_000, b"k", None, None, SourcePosition(T, 0, 0, None), "result"
    )
    checkpoint.publish([huge])
    assert [(r.topic, r.kind, r.value) for r in publisher.published] == [("dlq", "value_too_large", None)]


class FakeStuckPublisher(FakeDeliveringPublisher):
    """A transactional FakePublisher whose next `stuck` transactions have a call that does not return, and
    whose producer, once renewed, needs `init_timeouts` + 1 tries of init_transactions (the broker away)."""

    def __init__(self, stuck: int, init_timeouts: int) -> None:
        super().__init__()
        self.stuck, self.init_timeouts = stuck, init_timeouts
        self.renewed = 0
        self.inits = 0

    def publish_transaction(
        self, records: list[OutboundRecord], metadata: Any, _t: float, **_waits: Any
    ) -> AbortedTransaction | None:
        if self.stuck:
            self.stuck -= 1
            raise CallAbandoned("send_offsets_to_transaction did not return within 21.0 s")
        return super().publish_transaction(records, metadata, _t)

    def renew(self) -> None:
        self.renewed += 1

    @property
    def stuck_calls(self) -> int:
        return self.renewed

    def init_transactions(self, timeout_s: float, give_up: Any = None) -> None:
        self.inits += 1
        if self.inits <= self.init_timeouts:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Timed out", retriable=True))


def test_exactly_once_a_transaction_call_past_its_deadline_is_given_up_until_init_works_again() -> None:
    publisher = FakeStuckPublisher(stuck=1, init_timeouts=2)
    reports: list[str | None] = []
    checkpoint, _, _, book, _ = make("exactly_once", publisher, report=reports.append)
    assert checkpoint.publish([record(0, 0), record(0, 1)]) == []
    assert publisher.renewed == 1 and publisher.transactions == []
    assert (
        checkpoint.recovering is not None
        and "send_offsets_to_transaction did not return" in checkpoint.recovering
    )
    # Nothing goes out while recovering, and readiness says why.
    assert checkpoint.publish([record(1, 0)]) == [] and publisher.transactions == []
    assert reports[-1] == checkpoint.recovering
    assert [checkpoint.recover(), checkpoint.recover()] == [False, False]
    assert "re-initialising" in str(reports[-1])
    assert checkpoint.recover() and checkpoint.recovering is None and reports[-1] is None
    for offset in (0, 1):
        book.consumed((T, 0), offset, None)
    assert checkpoint.publish([record(0, 0), record(0, 1)]) == []
    assert len(publisher.transactions) == 1


def test_exactly_once_stops_once_too_many_calls_are_stuck() -> None:
    publisher = FakeStuckPublisher(stuck=MAX_STUCK_CALLS, init_timeouts=0)
    checkpoint, _, _, _, _ = make("exactly_once", publisher)
    for _ in range(MAX_STUCK_CALLS - 1):
        checkpoint.publish([record(0, 0)])
        assert checkpoint.recover()
    with pytest.raises(TransactionsStuckError, match=f"{MAX_STUCK_CALLS} transaction calls did not return"):
        checkpoint.publish([record(0, 0)])
