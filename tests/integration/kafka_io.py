"""Small real-broker helpers for the integration tests: produce, read back, committed offsets."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from worker.bench import topic_io


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes | None]],
    *,
    partition: int | None = None,
) -> None:
    """Produces (key, value) records in order and waits until every one is acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Message) -> None:
        if err is not None:
            errors.append(str(err))

    for key, value in records:
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        producer.produce(topic, **kwargs)
        producer.poll(0)
    assert producer.flush(30) == 0, "test producer could not deliver everything"
    assert not errors, errors


def review_records(reviews: Sequence[dict[str, Any]]) -> list[tuple[bytes | None, bytes | None]]:
    """JSON reviews keyed by their id."""
    return [(str(r["id"]).encode(), json.dumps(r, ensure_ascii=False).encode()) for r in reviews]


def read_topic(
    bootstrap: str, topic: str, *, expected: int, timeout_s: float = 60.0, settle_s: float = 1.0
) -> list[Message]:
    """Reads a topic from the beginning until `expected` records arrived (then `settle_s` more, to catch
    extras) or `timeout_s` passed. Read-committed, commits nothing."""
    return topic_io.read_topic(
        {"bootstrap.servers": bootstrap}, topic, expected=expected, timeout_s=timeout_s, settle_s=settle_s
    )


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition (-1001 = nothing committed)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "end-offsets", "enable.auto.commit": False}
    )
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def assert_all_committed(bootstrap: str, names: dict[str, str], partitions: int) -> None:
    """The group of `names` has committed every offset of its reviews topic: nothing is left to redo."""
    committed = committed_offsets(bootstrap, names["group"], names["reviews"], partitions)
    assert committed == end_offsets(bootstrap, names["reviews"], partitions), committed


def assert_nothing_committed(bootstrap: str, names: dict[str, str], partitions: int) -> None:
    """The group of `names` has committed no offset of its reviews topic: it did no work."""
    committed = committed_offsets(bootstrap, names["group"], names["reviews"], partitions)
    assert all(o < 0 for o in committed.values()), committed


def results_of(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return [json.loads(m.value()) for m in messages]
