"""The worker end to end on the real broker: every input offset yields exactly one record."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Producer

from schemas.dead_letter import DeadLetterKind, parse_dead_letter_headers
from schemas.sentiment_result import SentimentResult
from tests.integration.helpers import (
    assert_partition_order,
    make_settings,
    produce_samples,
    run_worker,
    sample_reviews,
)
from tests.integration.kafka_io import (
    assert_all_committed,
    assert_nothing_committed,
    committed_offsets,
    produce,
    read_topic,
    results_of,
    review_records,
)
from tests.labellers import labeller_for
from worker.inference.token_budget import StartupError

pytestmark = pytest.mark.integration


def test_happy_path_every_review_labelled_once_in_order(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics()
    reviews = produce_samples(kafka_bootstrap, names["reviews"], 90)
    settings = make_settings(kafka_bootstrap, names, max_batch_size=8, max_window_messages=40)

    summary = run_worker(settings, tiny_classifier, max_messages=len(reviews))

    assert (summary.consumed, summary.results, summary.dead_letters) == (90, 90, 0)
    out = read_topic(kafka_bootstrap, names["results"], expected=90)
    results = results_of(out)
    assert sorted(r["id"] for r in results) == sorted(r["id"] for r in reviews)  # each id exactly once
    for message, result in zip(out, results, strict=True):
        SentimentResult.model_validate(result)  # the published contract
        assert message.key() == result["id"].encode()  # result key = input key
        assert message.partition() == result["source"]["partition"]  # source partitioning
    by_id = {r["id"]: r for r in results}
    expected_probs = tiny_classifier.predict_texts([r["text"] for r in reviews])
    for review, probs in zip(reviews, expected_probs, strict=True):
        got = by_id[review["id"]]
        assert got["label"] == tiny_classifier.labels[int(np.argmax(probs))]
        assert got["confidence"] == pytest.approx(float(np.max(probs)), abs=1e-4)
        assert got["metadata"] == {
            "domain": review["domain"],
            "expected": review["expected"],
            "seq": review["seq"],
        }
        assert got["model"] == {"name": tiny_classifier.name, "version": tiny_classifier.version}
    assert_partition_order(out)
    # Everything was acknowledged, so everything is committed: the group's lag is zero.
    assert_all_committed(kafka_bootstrap, names, 3)


def test_malformed_mix_results_plus_dead_letters_equal_inputs(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics(input_partitions=1, output_partitions=1)
    bad: list[tuple[bytes | None, bytes | None, DeadLetterKind]] = [
        (b"k1", b"\xff\xfe not utf-8", DeadLetterKind.INVALID_UTF8),
        (b"k2", b"this is not json", DeadLetterKind.INVALID_JSON),
        (b"k3", b'{"id": "x3", "comment": "no text field"}', DeadLetterKind.MISSING_TEXT),
        (b"k4", b'{"id": "x4", "text": 42}', DeadLetterKind.WRONG_TYPE),
        (b"k5", b'{"id": "x5", "text": "   "}', DeadLetterKind.EMPTY_TEXT),
        (b"k6", json.dumps({"id": "x6", "text": "很好" * 200}).encode(), DeadLetterKind.TEXT_TOO_LONG),
        (b"k7", None, DeadLetterKind.EMPTY_VALUE),
        (b"k8", b'["text", "an array"]', DeadLetterKind.NOT_AN_OBJECT),
        (None, b"[" * 5000, DeadLetterKind.INVALID_JSON),
    ]
    good = sample_reviews(12)
    records: list[tuple[bytes | None, bytes | None]] = []
    expected_kinds: dict[int, DeadLetterKind] = {}
    good_iter = iter(review_records(good))
    for key, value, kind in bad:  # interleave: good, bad, good, bad ...
        records.append(next(good_iter))
        expected_kinds[len(records)] = kind
        records.append((key, value))
    records.extend(good_iter)
    produce(kafka_bootstrap, names["reviews"], records, partition=0)
    settings = make_settings(kafka_bootstrap, names, max_text_chars=100)

    summary = run_worker(settings, tiny_classifier, max_messages=len(records))

    assert summary.results + summary.dead_letters == len(records) == 21
    out = read_topic(kafka_bootstrap, names["results"], expected=len(good))
    dlq = read_topic(kafka_bootstrap, names["dlq"], expected=len(bad))
    assert sorted(r["id"] for r in results_of(out)) == sorted(r["id"] for r in good)
    assert len(dlq) == len(bad)
    for message in dlq:
        info = parse_dead_letter_headers(message.headers())
        offset = info.source_offset
        assert info.kind == expected_kinds[offset], (offset, info.reason)
        assert info.reason and info.worker_id == "test-worker" and info.source_topic == names["reviews"]
        assert (message.key(), message.value()) == records[offset]  # original bytes untouched
    offsets_seen = sorted(
        [json.loads(m.value())["source"]["offset"] for m in out]
        + [parse_dead_letter_headers(m.headers()).source_offset for m in dlq]
    )
    assert offsets_seen == list(range(len(records)))  # every input offset: exactly one record
    assert_partition_order(out)


def test_restart_resumes_from_committed_offsets(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics()
    reviews = produce_samples(kafka_bootstrap, names["reviews"], 60)
    settings = make_settings(kafka_bootstrap, names, max_window_messages=10)

    first = run_worker(settings, tiny_classifier, max_messages=25)
    assert first.results == 25
    assert (
        sum(
            max(0, o)
            for o in committed_offsets(kafka_bootstrap, names["group"], names["reviews"], 3).values()
        )
        == 25
    )

    second = run_worker(settings, tiny_classifier, idle_exit_s=3)
    assert second.results == 35  # the rest, nothing twice

    out = read_topic(kafka_bootstrap, names["results"], expected=60)
    ids = [r["id"] for r in results_of(out)]
    assert sorted(ids) == sorted(r["id"] for r in reviews)  # nothing lost, no duplicate
    assert_partition_order(out)


def test_missing_output_topic_refuses_to_start_and_commits_nothing(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics()
    produce_samples(kafka_bootstrap, names["reviews"], 5)
    settings = make_settings(kafka_bootstrap, {**names, "results": names["results"] + "-missing"})
    with pytest.raises(StartupError, match="create it"):
        run_worker(settings, tiny_classifier, idle_exit_s=2)
    assert_nothing_committed(kafka_bootstrap, names, 3)


def test_a_missing_input_topic_refuses_to_start_naming_the_setting(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    """Issue 40: `run --input-topic no-such-topic` logged one ERROR and idled (the README says exit 2)."""
    names = topics()
    settings = make_settings(kafka_bootstrap, {**names, "reviews": names["reviews"] + "-missing"})
    with pytest.raises(StartupError, match="SENTIMENT_INPUT_TOPIC") as refused:
        run_worker(settings, tiny_classifier, idle_exit_s=30)
    assert names["reviews"] + "-missing" in str(refused.value) and "topics create" in str(refused.value)


class SlowedClassifier:
    """The real tiny model, slowed down to a large model's pace (a fixed delay per batch)."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self._inner, self._delay_s = inner, delay_s
        self.labels, self.name, self.version = inner.labels, inner.name, inner.version
        self.call_overhead_tokens = inner.call_overhead_tokens
        self.parallel_calls = 1  # the delays add up, one call at a time

    def token_ids(self, texts: Any) -> Any:
        return self._inner.token_ids(texts)

    def predict_ids(self, batch: Any) -> Any:
        import time

        time.sleep(self._delay_s)
        return self._inner.predict_ids(batch)


def test_a_window_longer_than_max_poll_interval_keeps_the_partitions(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    from prometheus_client import CollectorRegistry

    from schemas.sentiment_result import ModelRef
    from worker.kafka.app import SentimentWorker

    names = topics(input_partitions=1, output_partitions=1)
    reviews = produce_samples(kafka_bootstrap, names["reviews"], 14, partition=0)
    # 14 single-review batches of 1 s each: one window takes ~14 s, beyond max.poll.interval.ms = 10 s.
    settings = make_settings(
        kafka_bootstrap,
        names,
        max_batch_size=1,
        max_window_messages=14,
        max_wait_ms=2000,
        max_poll_interval_ms=10_000,
    )
    registry = CollectorRegistry()
    slow = SlowedClassifier(tiny_classifier, delay_s=1.0)
    worker = SentimentWorker(
        settings.sections, labeller_for(slow, settings, ModelRef(name="slow", version="1")), registry=registry
    )

    summary = worker.run(max_messages=len(reviews))

    assert summary.results == 14
    # One revoke, when the worker left the group at the end; none while labelling.
    assert registry.get_sample_value("sentiment_rebalances_total", {"event": "revoked"}) == 1
    assert registry.get_sample_value("sentiment_rebalances_total", {"event": "lost"}) is None
    out = read_topic(kafka_bootstrap, names["results"], expected=14)
    assert sorted(r["id"] for r in results_of(out)) == sorted(r["id"] for r in reviews)
    assert committed_offsets(kafka_bootstrap, names["group"], names["reviews"], 1) == {0: 14}


def test_lag_seconds_is_the_age_of_the_oldest_unfinished_message(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    import threading
    import time

    from confluent_kafka import Producer
    from prometheus_client import CollectorRegistry

    from schemas.sentiment_result import ModelRef
    from worker.kafka.app import SentimentWorker

    names = topics(input_partitions=1, output_partitions=1)
    settings = make_settings(kafka_bootstrap, names, max_batch_size=1, max_window_messages=1)
    registry = CollectorRegistry()
    worker = SentimentWorker(
        settings.sections,
        labeller_for(SlowedClassifier(tiny_classifier, 0.8), settings, ModelRef(name="slow", version="1")),
        registry=registry,
    )
    thread = threading.Thread(target=worker.run, kwargs={"idle_exit_s": 60})
    thread.start()

    def done() -> float:
        return (
            registry.get_sample_value("sentiment_results_published_total", {"topic": names["results"]}) or 0
        )

    def watch_lag_until(results: float) -> float:
        """Highest lag-seconds gauge value seen until `results` results are out."""
        highest, deadline = 0.0, time.monotonic() + 60
        while done() < results and time.monotonic() < deadline:
            value = registry.get_sample_value(
                "sentiment_consumer_lag_seconds", {"topic": names["reviews"], "partition": "0"}
            )
            highest = max(highest, value or 0.0)
            time.sleep(0.1)
        assert done() >= results, "the worker did not finish in time"
        return highest

    try:
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        hour_ago_ms = int(time.time() * 1000) - 3_600_000
        for i, (key, value) in enumerate(review_records(sample_reviews(3))):
            producer.produce(names["reviews"], key=key, value=value, timestamp=hour_ago_ms + i)
        producer.flush(10)
        assert watch_lag_until(3) >= 3500  # an hour-old backlog is an hour behind

        def lag_seconds() -> float | None:
            labels = {"topic": names["reviews"], "partition": "0"}
            return registry.get_sample_value("sentiment_consumer_lag_seconds", labels)

        # Idle, caught up: the gauge (refreshed every second) falls to 0; polled with a deadline.
        deadline = time.monotonic() + 30
        while lag_seconds() != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lag_seconds() == 0
        produce_samples(kafka_bootstrap, names["reviews"], 1)
        assert watch_lag_until(4) < 30  # a fresh message is seconds behind, not an hour
    finally:
        worker.request_stop()
        thread.join(60)


def test_auto_token_budget_is_calibrated_at_start_up_then_read_from_the_cache(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any, tmp_path: Any
) -> None:
    import json as json_module

    from prometheus_client import CollectorRegistry

    from schemas.sentiment_result import ModelRef
    from worker.kafka.app import SentimentWorker

    names = topics()
    produce_samples(kafka_bootstrap, names["reviews"], 10)
    settings = make_settings(kafka_bootstrap, names, max_batch_tokens_auto=True, tuning_cache_dir=tmp_path)
    budgets = []
    for _ in range(2):
        registry = CollectorRegistry()
        worker = SentimentWorker(
            settings.sections,
            labeller_for(tiny_classifier, settings, ModelRef(name="t", version="1")),
            registry=registry,
        )
        worker.run(max_messages=5)
        budgets.append(registry.get_sample_value("sentiment_token_budget_tokens"))
    cached = [json_module.loads(p.read_text()) for p in tmp_path.rglob("*.json")]
    assert len(cached) == 1  # measured once, reused the second time
    assert budgets == [cached[0]["result"]["max_batch_tokens"]] * 2


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_outputs_too_large_for_their_topic_become_dead_letters_without_value(
    kafka_bootstrap: str, unique_name: Any, tiny_classifier: Any, delivery: str
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    names = {k: unique_name(k) for k in ("reviews", "results", "dlq", "group")}
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    small = {"max.message.bytes": "3000"}  # the output topics accept less than some inputs are
    topics = [NewTopic(names["reviews"], 1, 1), NewTopic(names["results"], 1, 1, config=small)]
    topics.append(NewTopic(names["dlq"], 1, 1, config=small))
    for future in admin.create_topics(topics).values():
        future.result(30)
    try:
        records: list[tuple[bytes | None, bytes | None]] = [
            (b"ok-1", json.dumps({"id": "ok-1", "text": "很好"}).encode()),
            (b"big-result", json.dumps({"id": "big-result", "text": "好评", "blob": "x" * 5000}).encode()),
            (b"big-dead", b"\xff" * 5000),  # invalid UTF-8: its dead letter would carry 5000 bytes
            (b"ok-2", json.dumps({"id": "ok-2", "text": "太差了"}).encode()),
        ]
        produce(kafka_bootstrap, names["reviews"], records, partition=0)
        # The dead-letter topic is smaller than the input topic: the start-up check would refuse it.
        settings = make_settings(kafka_bootstrap, names, delivery=delivery, dlq_size_check=False)

        summary = run_worker(settings, tiny_classifier, max_messages=4)

        assert (summary.results, summary.dead_letters) == (2, 2)
        out = read_topic(kafka_bootstrap, names["results"], expected=2)
        dlq = read_topic(kafka_bootstrap, names["dlq"], expected=2)
        assert sorted(m.key() for m in out) == [b"ok-1", b"ok-2"]
        assert sorted(parse_dead_letter_headers(m.headers()).source_offset for m in dlq) == [1, 2]
        for message in dlq:
            info = parse_dead_letter_headers(message.headers())
            assert (message.key(), message.value(), info.kind.value) == (None, None, "value_too_large")
            assert f"at offset {info.source_offset}" in info.reason  # where the original still is
        assert committed_offsets(kafka_bootstrap, names["group"], names["reviews"], 1) == {0: 4}
    finally:
        admin.delete_topics(list(names.values())[:3])


def test_a_dead_letter_carries_the_input_s_own_headers(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics(input_partitions=1, output_partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    headers = [
        ("trace-id", b"abc-123"),
        ("tenant", b"shop-7"),
        ("empty", None),
        ("sentiment.error.kind", b"forged"),
    ]
    producer.produce(names["reviews"], key=b"k1", value=b"not json", headers=headers, partition=0)
    producer.produce(names["reviews"], key=b"k2", value=review_records(sample_reviews(1))[0][1], partition=0)
    assert producer.flush(30) == 0

    summary = run_worker(make_settings(kafka_bootstrap, names), tiny_classifier, max_messages=2)

    assert (summary.results, summary.dead_letters) == (1, 1)
    (dead,) = read_topic(kafka_bootstrap, names["dlq"], expected=1)
    got = dead.headers() or []
    assert got[:3] == [("trace-id", b"abc-123"), ("tenant", b"shop-7"), ("empty", None)]  # kept, in order
    assert [value for name, value in got if name == "sentiment.error.kind"] == [b"invalid_json"]  # not forged
    assert parse_dead_letter_headers(got).kind == DeadLetterKind.INVALID_JSON
