"""Exactly-once mode on the real broker: results, dead letters and offsets commit together."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest
from confluent_kafka import Consumer

from schemas.dead_letter import parse_dead_letter_headers
from tests.integration.helpers import (
    assert_partition_order,
    make_settings,
    produce_samples,
    run_worker,
    sample_reviews,
)
from tests.integration.kafka_io import (
    assert_all_committed,
    committed_offsets,
    produce,
    read_topic,
    results_of,
    review_records,
)

pytestmark = pytest.mark.integration


def test_exactly_once_publishes_each_input_once_and_commits_offsets_in_the_transaction(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any, caplog: pytest.LogCaptureFixture
) -> None:
    names = topics()
    reviews = sample_reviews(60)
    records = review_records(reviews)
    records[10] = (b"bad", b"not json at all")
    produce(kafka_bootstrap, names["reviews"], records)
    settings = make_settings(kafka_bootstrap, names, delivery="exactly_once", max_window_messages=16)

    with caplog.at_level(logging.INFO, logger="worker.kafka"):
        first = run_worker(settings, tiny_classifier, max_messages=30)
    after_first = committed_offsets(kafka_bootstrap, names["group"], names["reviews"], 3)
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("consuming ")]
    revoked = [r for r in caplog.records if r.getMessage().startswith("revoked ")]
    second = run_worker(settings, tiny_classifier, idle_exit_s=3)

    # The log says the delivery mode, and what leaving the group committed (as at_least_once does).
    assert len(started) == 1 and "delivery exactly_once" in started[0]
    assert f"sentiment-worker.{names['group']}." in started[0]  # the transactional id
    assert revoked and "committed" in revoked[-1].getMessage()
    logged: dict[int, int] = {}
    for record in revoked:  # "revoked t[0], t[1] (committed t[0]=8, t[1]=15 in transactions)"
        committed = record.getMessage().split("(committed ", 1)[1]
        logged.update({int(p): int(o) for p, o in re.findall(r"\[(\d+)\]=(\d+)", committed)})
    assert logged == {p: o for p, o in after_first.items() if o >= 0} and sum(logged.values()) == 30

    assert first.results + first.dead_letters == 30
    assert second.results + second.dead_letters == 30
    out = read_topic(kafka_bootstrap, names["results"], expected=59)  # read_committed
    dlq = read_topic(kafka_bootstrap, names["dlq"], expected=1)
    ids = [r["id"] for r in results_of(out)]
    assert len(ids) == 59 and set(ids) == {r["id"] for r in reviews} - {reviews[10]["id"]}
    assert [parse_dead_letter_headers(m.headers()).kind.value for m in dlq] == ["invalid_json"]
    assert_partition_order(out)
    # The consumer never committed by itself: the transactions carried the offsets.
    assert_all_committed(kafka_bootstrap, names, 3)


def test_records_of_an_unfinished_transaction_are_invisible_to_read_committed_readers(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    """The read_committed contract downstream relies on: a transaction that never commits shows nothing."""
    from confluent_kafka import Producer

    names = topics(input_partitions=1, output_partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": names["group"] + "-probe"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(names["results"], value=json.dumps({"id": "ghost"}).encode())
    producer.flush(10)
    producer.abort_transaction(30)
    produce_samples(kafka_bootstrap, names["reviews"], 3)
    run_worker(
        make_settings(kafka_bootstrap, names, delivery="exactly_once"), tiny_classifier, max_messages=3
    )

    out = read_topic(kafka_bootstrap, names["results"], expected=3)
    assert sorted(r["id"] for r in results_of(out)) == ["r-0000", "r-0001", "r-0002"]
    uncommitted = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": names["group"] + "-ru",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_uncommitted",
        }
    )
    uncommitted.subscribe([names["results"]])
    seen = []
    for _ in range(30):
        seen += [m for m in uncommitted.consume(100, 0.3) if m.error() is None]
        if len(seen) >= 4:
            break
    uncommitted.close()
    assert b'{"id": "ghost"}' in [m.value() for m in seen]  # it is in the log, only hidden
