"""ReviewConsumer.commit_through_rebalance: retry logic only, against a scripted stand-in for librdkafka.

The real-broker evidence is tests/integration/test_consumer_rebalance.py (a commit refused with
ILLEGAL_GENERATION in the second cooperative round goes through after the retry) and the rebalance-storm
fault scenario (tests/faults/test_rebalance_storm.py: no duplicates in the default mode).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

import worker.kafka.consumer as consumer_module
from worker.kafka.consumer import PartitionKey, ReviewConsumer

T = "reviews"


class ScriptedKafkaConsumer:
    """Stands in for confluent_kafka.Consumer: commits fail with the scripted error codes, in order; a
    consume() call runs the scripted rebalance (revoking partitions through the registered callback)."""

    script: list[int] = []
    revoke_on_consume: list[list[int]] = []

    def __init__(self, _conf: dict[str, Any]) -> None:
        self.commits: list[dict[PartitionKey, int]] = []
        self.failures = list(type(self).script)
        self.rebalances = list(type(self).revoke_on_consume)
        self.consumes = 0
        self.paused: list[PartitionKey] = []
        self.on_revoke: Any = None

    def subscribe(self, _topics: list[str], **callbacks: Any) -> None:
        self.on_revoke = callbacks["on_revoke"]

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert asynchronous is False
        if self.failures:
            raise KafkaException(KafkaError(self.failures.pop(0)))
        self.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused.extend((tp.topic, tp.partition) for tp in partitions)

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        self.consumes += 1
        time.sleep(timeout)
        if self.rebalances:
            self.on_revoke(self, [TopicPartition(T, p) for p in self.rebalances.pop(0)])
        return []


def make_consumer(
    monkeypatch: pytest.MonkeyPatch, failures: list[int], revoke_on_consume: list[list[int]] | None = None
) -> tuple[ReviewConsumer, ScriptedKafkaConsumer, list[list[PartitionKey]]]:
    monkeypatch.setattr(ScriptedKafkaConsumer, "script", failures)
    monkeypatch.setattr(ScriptedKafkaConsumer, "revoke_on_consume", revoke_on_consume or [])
    monkeypatch.setattr(consumer_module, "Consumer", ScriptedKafkaConsumer)
    revoked: list[list[PartitionKey]] = []
    review_consumer = ReviewConsumer(
        {},
        group_id="g",
        topic=T,
        commit_interval_ms=1000,
        max_poll_interval_ms=10_000,
        on_assign=lambda keys: None,
        on_revoke=revoked.append,
        on_lost=lambda keys: None,
    )
    review_consumer.subscribe()
    fake = review_consumer._consumer
    assert isinstance(fake, ScriptedKafkaConsumer)
    review_consumer._assigned(fake, [TopicPartition(T, 0), TopicPartition(T, 1)])  # type: ignore[arg-type]
    return review_consumer, fake, revoked


DONE = {(T, 0): 40, (T, 1): 17}


def offsets_for(owned: frozenset[PartitionKey]) -> dict[PartitionKey, int]:
    return {key: offset for key, offset in DONE.items() if key in owned}


def test_commits_at_once_when_the_group_is_stable(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer, fake, _ = make_consumer(monkeypatch, [])
    assert consumer.commit_through_rebalance(offsets_for, timeout_s=5) == 0
    assert fake.commits == [DONE] and fake.consumes == 0


@pytest.mark.parametrize("code", [KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS])
def test_a_commit_refused_by_a_rebalance_is_retried_after_polling_with_partitions_paused(
    monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    consumer, fake, _ = make_consumer(monkeypatch, [code, code])
    assert consumer.commit_through_rebalance(offsets_for, timeout_s=5, poll_s=0.0) == 2
    assert fake.commits == [DONE]
    assert fake.consumes == 2
    assert set(fake.paused) == set(DONE)


def test_after_the_rebalance_only_partitions_still_owned_are_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The rebalance revokes partition 1 (the app's revoke callback commits it); the retry commits 0 only.
    consumer, fake, revoked = make_consumer(monkeypatch, [KafkaError.ILLEGAL_GENERATION], [[1]])
    assert consumer.commit_through_rebalance(offsets_for, timeout_s=5, poll_s=0.0) == 1
    assert revoked == [[(T, 1)]]
    assert fake.commits == [{(T, 0): 40}]


def test_other_commit_errors_are_raised_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer, fake, _ = make_consumer(monkeypatch, [KafkaError.UNKNOWN_MEMBER_ID])
    with pytest.raises(KafkaException) as raised:
        consumer.commit_through_rebalance(offsets_for, timeout_s=5)
    assert raised.value.args[0].code() == KafkaError.UNKNOWN_MEMBER_ID
    assert fake.consumes == 0 and fake.commits == []


def test_gives_up_with_the_refusal_when_the_rebalance_outlasts_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer, fake, _ = make_consumer(monkeypatch, [KafkaError.REBALANCE_IN_PROGRESS] * 100)
    with pytest.raises(KafkaException) as raised:
        consumer.commit_through_rebalance(offsets_for, timeout_s=0.05, poll_s=0.02)
    assert raised.value.args[0].code() == KafkaError.REBALANCE_IN_PROGRESS
    assert fake.commits == [] and fake.consumes >= 1
