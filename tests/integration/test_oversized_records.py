"""No record wedges a partition, on topics an admin made at the broker's default max.message.bytes: a review
whose key is near 1 MB (it fits the input topic, its result fits nowhere) becomes a dead letter with no key
and no value, the reviews after it are labelled, and the worker goes on, in both delivery modes; the
exactly-once worker gets there even when its size estimate is wrong and the broker refuses the record inside
a transaction. And `run` refuses to start when the dead-letter topic cannot hold the input's largest record.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from typing import Any

import pytest
from confluent_kafka import Message, Producer

from schemas.dead_letter import DeadLetterKind, parse_dead_letter_headers
from schemas.sentiment_result import ModelRef
from tests.integration.helpers import make_settings
from tests.integration.kafka_io import committed_offsets, read_topic
from tests.labellers import labeller_for
from worker.config import WorkerSettings
from worker.inference.token_budget import StartupError
from worker.kafka.app import SentimentWorker
from worker.kafka.producer import ResultProducer
from worker.kafka.run_tracker import RunSummary

pytestmark = pytest.mark.integration

BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
HUGE_KEY_BYTES = 1_048_350  # with a small value, the largest key a default-limit topic takes
# A worker that cannot move past the huge key never gets here; the bound only keeps such a run from hanging.
RUN_BOUND_S = 240.0


@pytest.fixture
def default_topics(unique_name: Any, create_topics: Any) -> dict[str, str]:
    """Input, output and dead-letter topics with the broker's default limits (no topic config)."""
    names = {k: unique_name(k) for k in ("reviews", "results", "dlq", "group")}
    create_topics([names["reviews"], names["results"], names["dlq"]], partitions=1)
    return names


def produce_huge_key_then_good_review(bootstrap: str, topic: str) -> bytes:
    """Offset 0: a review keyed by HUGE_KEY_BYTES random (incompressible) bytes; offset 1: a good review.
    Returns the huge key."""
    key = random.Random(41).randbytes(HUGE_KEY_BYTES)
    # The client's own limit (1,000,000 by default) is lifted: the broker's topic limit decides.
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 2_000_000})
    delivered: list[tuple[str | None, int]] = []

    def on_delivery(err: Any, msg: Message) -> None:
        delivered.append((None if err is None else str(err), msg.offset()))

    for k, review in (
        (key, {"id": "huge-key", "text": "好评"}),
        (b"good", {"id": "good", "text": "很好，满意"}),
    ):
        producer.produce(
            topic, key=k, value=json.dumps(review).encode(), partition=0, on_delivery=on_delivery
        )
        # One at a time: two in flight may be stored the other way round when the first is retried.
        assert producer.flush(30) == 0
    assert delivered == [(None, 0), (None, 1)], delivered
    return key


def run_bounded(settings: WorkerSettings, classifier: Any) -> tuple[RunSummary, SentimentWorker]:
    """Runs the worker until both inputs are done; a worker stuck past RUN_BOUND_S is stopped and fails."""
    stop = threading.Event()
    worker = SentimentWorker(
        settings.sections,
        labeller_for(classifier, settings, ModelRef(name=classifier.name, version=classifier.version)),
        stop=stop,
    )
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["summary"] = worker.run(max_messages=2, idle_exit_s=60)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="worker-under-test")
    thread.start()
    thread.join(RUN_BOUND_S)
    stuck = thread.is_alive()
    if stuck:
        stop.set()
        thread.join(60)
    assert "error" not in outcome, f"the worker stopped: {outcome.get('error')!r}"
    assert not stuck, f"no progress in {RUN_BOUND_S:.0f} s: the partition is wedged"
    summary: RunSummary = outcome["summary"]
    return summary, worker


def assert_huge_key_dead_lettered_and_good_review_labelled(bootstrap: str, names: dict[str, str]) -> None:
    (result,) = read_topic(bootstrap, names["results"], expected=1)
    assert (result.key(), json.loads(result.value())["id"]) == (b"good", "good")
    (dead,) = read_topic(bootstrap, names["dlq"], expected=1)
    assert (dead.key(), dead.value()) == (None, None)
    info = parse_dead_letter_headers(dead.headers())
    assert info.kind is DeadLetterKind.VALUE_TOO_LARGE
    assert (info.source_topic, info.source_partition, info.source_offset) == (names["reviews"], 0, 0)
    assert f"(key {HUGE_KEY_BYTES} bytes, value " in info.reason
    assert f"more than topic {names['results']!r} accepts" in info.reason
    assert committed_offsets(bootstrap, names["group"], names["reviews"], 1) == {0: 2}


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_a_key_near_one_megabyte_on_default_limit_topics_is_dead_lettered_without_key_and_the_worker_goes_on(
    kafka_bootstrap: str, default_topics: dict[str, str], tiny_classifier: Any, delivery: str
) -> None:
    names = default_topics
    produce_huge_key_then_good_review(kafka_bootstrap, names["reviews"])
    # Every topic at the broker's default: the dead-letter topic cannot hold the largest input, so the
    # start-up check is turned off to run on them (the test below shows it refusing).
    settings = make_settings(kafka_bootstrap, names, delivery=delivery, dlq_size_check=False)

    summary, _ = run_bounded(settings, tiny_classifier)

    assert (summary.results, summary.dead_letters) == (1, 1)
    assert summary.stop_reason == "processed 2 messages (--max-messages)"
    assert_huge_key_dead_lettered_and_good_review_labelled(kafka_bootstrap, names)


def test_exactly_once_a_record_the_broker_refuses_in_a_transaction_costs_one_abort_not_a_loop(
    kafka_bootstrap: str,
    default_topics: dict[str, str],
    tiny_classifier: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    names = default_topics
    real = ResultProducer.topic_max_message_bytes

    def overstated(self: ResultProducer, topic: str, timeout_s: float = 10.0) -> int:
        # The worker's estimate is wrong: it believes the output topics take 4 MiB; the broker says no.
        return real(self, topic, timeout_s) if topic == names["reviews"] else 4 * 1024 * 1024

    monkeypatch.setattr(ResultProducer, "topic_max_message_bytes", overstated)
    produce_huge_key_then_good_review(kafka_bootstrap, names["reviews"])
    settings = make_settings(kafka_bootstrap, names, delivery="exactly_once")

    with caplog.at_level(logging.WARNING, logger="worker.kafka.checkpoint"):
        summary, worker = run_bounded(settings, tiny_classifier)

    assert (summary.results, summary.dead_letters) == (1, 1)
    aborts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("transaction aborted")]
    refusals = [m for m in aborts if "refused as too large" in m]
    assert len(refusals) == 1, aborts  # the record itself went once; then only its stand-in
    # librdkafka may abort the stand-in's transaction once more to bump its epoch (the refused record left
    # a gap in its sequence numbers): a second abort, never a third, and the record is not sent again.
    assert len(aborts) in (1, 2) and all("sequence" in m for m in aborts if m not in refusals), aborts
    aborted = worker.registry.get_sample_value("sentiment_transactions_total", {"outcome": "aborted"})
    assert aborted == len(aborts)
    assert_huge_key_dead_lettered_and_good_review_labelled(kafka_bootstrap, names)


def test_run_refuses_to_start_when_asked_and_the_dead_letter_topic_cannot_hold_the_largest_input(
    kafka_bootstrap: str, default_topics: dict[str, str], tiny_classifier: Any
) -> None:
    names = default_topics
    settings = make_settings(kafka_bootstrap, names, dlq_size_check="refuse")  # the default warns
    worker = SentimentWorker(
        settings.sections,
        labeller_for(
            tiny_classifier, settings, ModelRef(name=tiny_classifier.name, version=tiny_classifier.version)
        ),
    )
    with pytest.raises(StartupError) as refused:
        worker.run(max_messages=1, idle_exit_s=5)
    said = str(refused.value)
    limit = BROKER_DEFAULT_MAX_MESSAGE_BYTES
    assert f"dead-letter topic {names['dlq']!r} accepts records of up to {limit} bytes" in said
    assert f"input topic {names['reviews']!r} accepts {limit}" in said
    assert f"`sentiment-worker topics create --fix --bootstrap-servers {kafka_bootstrap}` sets " in said
    assert committed_offsets(kafka_bootstrap, names["group"], names["reviews"], 1) == {0: -1001}
