"""Exactly-once under faults, on the real broker, as the README says: "being fenced (another instance with
the same transactional id) stops the worker", and the instance that fenced it carries on; "an abortable
transaction error aborts, rewinds and carries on" (the broker refuses the results: the output topic's
max.message.bytes lowered under the worker's feet; the refused records go as dead letters without key and
value when their window comes again); a read_committed reader sees every input exactly once.

(A transaction that outlives transaction.timeout.ms is not an abortable error on this broker: the
coordinator aborts it and bumps the epoch, and librdkafka reports the producer fenced, a fatal error.)"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from schemas.dead_letter import DeadLetterKind, parse_dead_letter_headers
from schemas.sentiment_result import ModelRef
from tests.integration.helpers import RunningWorker, make_settings, sample_reviews
from tests.integration.kafka_io import committed_offsets, produce, read_topic, results_of, review_records
from tests.labellers import labeller_for
from tests.polling import wait_until
from worker.kafka.app import SentimentWorker

pytestmark = pytest.mark.integration


def test_a_second_instance_with_the_same_transactional_id_fences_and_stops_the_first(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics(input_partitions=1, output_partitions=1)
    reviews = sample_reviews(20)
    # Same group and worker id: the same transactional id, sentiment-worker.<group>.<worker id>.
    settings = make_settings(kafka_bootstrap, names, delivery="exactly_once", worker_id="replica-0")
    model = ModelRef(name="tiny", version="1")
    first = RunningWorker(SentimentWorker(settings.sections, labeller_for(tiny_classifier, settings, model)))
    second: RunningWorker | None = None
    try:
        produce(kafka_bootstrap, names["reviews"], review_records(reviews[:10]), partition=0)
        assert len(read_topic(kafka_bootstrap, names["results"], expected=10, settle_s=0)) == 10
        second = RunningWorker(
            SentimentWorker(settings.sections, labeller_for(tiny_classifier, settings, model))
        )
        # init_transactions has run once the second instance warms its model: the first is fenced now.
        wait_until(
            lambda: second.worker.health.model_warm or not second.thread.is_alive(), 60, "the second up"
        )
        # The first still owns the partition: its next window's transaction is refused and it stops.
        produce(kafka_bootstrap, names["reviews"], review_records(reviews[10:]), partition=0)
        first.thread.join(120)
        assert not first.thread.is_alive(), "the fenced worker kept running"
        # It left the group on the way out: the second takes the partition and labels the rest.
        out = read_topic(kafka_bootstrap, names["results"], expected=20)
        wait_until(
            lambda: committed_offsets(kafka_bootstrap, names["group"], names["reviews"], 1) == {0: 20},
            60,
            "the second instance's transactions to commit every offset",
        )
    finally:
        first.stop()
        if second is not None:
            second.stop()
    [raised] = first.outcome
    assert isinstance(raised, KafkaException), raised
    assert raised.args[0].fatal() and "fenced" in raised.args[0].str().lower(), raised.args[0]
    assert second is not None and second.outcome and not isinstance(second.outcome[0], BaseException)
    ids = [r["id"] for r in results_of(out)]  # read_committed: the fenced transaction shows nothing
    assert sorted(ids) == sorted(r["id"] for r in reviews)  # every id, exactly once


def _set_max_message_bytes(bootstrap: str, topic: str, value: str | None) -> None:
    """Sets the topic's max.message.bytes (None: back to the broker's default)."""
    op = AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET
    entry = ConfigEntry("max.message.bytes", value or "", incremental_operation=op)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result is in
    admin.incremental_alter_configs([resource])[resource].result(30)


def _aborted(worker: SentimentWorker) -> float:
    return worker.registry.get_sample_value("sentiment_transactions_total", {"outcome": "aborted"}) or 0.0


def test_an_abortable_error_aborts_rewinds_and_the_same_worker_carries_on(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics(input_partitions=1, output_partitions=1)
    reviews = sample_reviews(20)
    settings = make_settings(kafka_bootstrap, names, delivery="exactly_once")
    running = RunningWorker(
        SentimentWorker(
            settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
        )
    )
    try:
        produce(kafka_bootstrap, names["reviews"], review_records(reviews[:10]), partition=0)
        assert len(read_topic(kafka_bootstrap, names["results"], expected=10, settle_s=0)) == 10
        # The broker now refuses every result batch (MSG_SIZE_TOO_LARGE): a delivery failure inside a
        # transaction is an abortable error, and the worker's start-up limit check cannot know of it.
        _set_max_message_bytes(kafka_bootstrap, names["results"], "100")
        produce(kafka_bootstrap, names["reviews"], review_records(reviews[10:]), partition=0)
        # Aborted once; read again, the refused results go as dead letters without key and value.
        dlq = read_topic(kafka_bootstrap, names["dlq"], expected=10)
        wait_until(
            lambda: committed_offsets(kafka_bootstrap, names["group"], names["reviews"], 1) == {0: 20},
            60,
            "the rewound window's transaction to commit every offset",
        )
        assert running.thread.is_alive(), running.outcome  # the same worker throughout
        out = read_topic(kafka_bootstrap, names["results"], expected=10)
    finally:
        _set_max_message_bytes(kafka_bootstrap, names["results"], None)
        running.stop()
    assert running.outcome and not isinstance(running.outcome[0], BaseException), running.outcome
    # read_committed: the aborted transactions show nothing; every input once, as a result or a dead letter
    assert sorted(r["id"] for r in results_of(out)) == sorted(r["id"] for r in reviews[:10])
    stand_ins = [parse_dead_letter_headers(m.headers()) for m in dlq]
    assert sorted(info.source_offset for info in stand_ins) == list(range(10, 20))
    assert {(m.key(), m.value()) for m in dlq} == {(None, None)}
    assert {info.kind for info in stand_ins} == {DeadLetterKind.VALUE_TOO_LARGE}
    assert _aborted(running.worker) >= 1
