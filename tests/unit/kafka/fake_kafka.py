"""Stand-ins for the worker's Kafka clients (`ReviewConsumer`, `ResultProducer`), in memory: the poll loop's
unit tests run on them through `KafkaClients`. The real-broker evidence is tests/integration and tests/faults.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from worker.config import DeliverySettings, KafkaSettings, SecuritySettings
from worker.kafka.consumer import OffsetsFor, PartitionBacklog
from worker.kafka.kafka_clients import KafkaClients, Rebalance
from worker.kafka.partitions import PartitionKey
from worker.kafka.producer import Delivery, OutboundRecord


class FakeMessage:
    """What the worker reads of a confluent_kafka.Message."""

    def __init__(
        self, topic: str, partition: int, offset: int, value: bytes | None, key: bytes | None
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._value, self._key = value, key

    def error(self) -> KafkaError | None:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_700_000_000_000 + self._offset  # CREATE_TIME

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[tuple[str, bytes]] | None:
        return None


class FakeConsumer:
    """A group member owning every partition of `log` (partition -> values) from offset 0, handing out up
    to `max_messages` a call in partition-interleaved order; records what it was told to store and commit."""

    def __init__(self, topic: str, log: dict[int, list[bytes | None]], rebalance: Rebalance) -> None:
        self.topic = topic
        self.log = log
        self.rebalance = rebalance
        self.next: dict[int, int] = {}
        self.assignment: frozenset[PartitionKey] = frozenset()
        self.paused: set[PartitionKey] = set()
        self.stored: dict[PartitionKey, int] = {}
        self.commits: list[dict[PartitionKey, int]] = []
        self.pause_calls = 0
        self.closed = False

    def subscribe(self) -> None:
        keys = [(self.topic, p) for p in sorted(self.log)]
        self.assignment = frozenset(keys)
        self.next = dict.fromkeys(self.log, 0)
        self.rebalance.on_assign(keys)

    def consume(self, max_messages: int, timeout_s: float) -> list[Any]:
        out: list[Any] = []
        while len(out) < max_messages:
            progressed = False
            for partition in sorted(self.next):
                key = (self.topic, partition)
                offset = self.next[partition]
                if key in self.paused or offset >= len(self.log[partition]) or len(out) >= max_messages:
                    continue
                out.append(FakeMessage(self.topic, partition, offset, self.log[partition][offset], b"k"))
                self.next[partition] = offset + 1
                progressed = True
            if not progressed:
                break
        if not out:
            time.sleep(min(timeout_s, 0.005))
        return out

    def store(self, offsets: dict[PartitionKey, int]) -> None:
        self.stored.update(offsets)

    def commit_now(self, offsets: dict[PartitionKey, int]) -> None:
        self.commits.append(dict(offsets))

    def commit_through_rebalance(self, offsets_for: OffsetsFor, timeout_s: float, poll_s: float = 0.5) -> int:
        self.commit_now(offsets_for(self.assignment))
        return 0

    def group_metadata(self) -> str:
        return "group-metadata"

    def rewind_to_committed(self, partitions: Any, timeout_s: float = 10.0) -> None:
        for _, partition in partitions:
            self.next[partition] = self.stored.get((self.topic, partition), 0)

    def seek(self, key: PartitionKey, offset: int) -> None:
        self.next[key[1]] = offset

    def high_watermark(self, key: PartitionKey, timeout_s: float = 2.0) -> int | None:
        return len(self.log[key[1]])

    def pause(self, partitions: Any) -> None:
        self.pause_calls += 1
        self.paused.update(partitions)

    def resume(self, partitions: Any) -> None:
        self.paused.difference_update(partitions)

    def lag(self, timeout_s: float = 2.0) -> dict[PartitionKey, PartitionBacklog]:
        return {
            (self.topic, p): PartitionBacklog(len(self.log[p]) - self.next[p], self.next[p], True)
            for p in self.next
        }

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.rebalance.on_revoke(sorted(self.assignment))
            self.assignment = frozenset()


class FakePublisher:
    """A producer whose broker acknowledges every record at the next `poll`/`flush`, except those
    `refuse(record)` answers with an error for; `partitions` per output topic; `max_message_bytes` per
    topic (others: 2 MiB, as `topics create` makes the output and dead-letter topics)."""

    def __init__(
        self,
        *,
        partitions: int = 3,
        refuse: Callable[[OutboundRecord], KafkaError | None] = lambda record: None,
        missing_topics: frozenset[str] = frozenset(),
        max_message_bytes: dict[str, int] | None = None,
        configs: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.partitions = partitions
        self.configs = configs or {}
        self.max_message_bytes = {"reviews": 1_048_588} if max_message_bytes is None else max_message_bytes
        self.refuse = refuse
        self.missing_topics = missing_topics
        self.sent: list[OutboundRecord] = []  # everything produced, in order
        self._in_flight: list[OutboundRecord] = []
        self._deliveries: list[Delivery] = []
        self.closed = False

    def publish(self, record: OutboundRecord) -> None:
        self.sent.append(record)
        self._in_flight.append(record)

    def poll(self, timeout_s: float = 0.0) -> None:
        for record in self._in_flight:
            self._deliveries.append(Delivery(record, self.refuse(record)))
        self._in_flight = []

    def flush(self, timeout_s: float) -> int:
        self.poll()
        return 0

    def take_deliveries(self) -> list[Delivery]:
        taken, self._deliveries = self._deliveries, []
        return taken

    def pending(self) -> int:
        return len(self._in_flight)

    def partition_count(self, topic: str, timeout_s: float = 10.0) -> int:
        if topic in self.missing_topics:
            raise KafkaException(f"topic {topic!r} is not available: create it")
        return self.partitions

    def topic_configs(self, topic: str, timeout_s: float = 10.0) -> dict[str, str]:
        return dict(self.configs.get(topic, {}))

    def topic_max_message_bytes(self, topic: str, timeout_s: float = 10.0) -> int:
        return self.max_message_bytes.get(topic, 2 * 1024 * 1024)

    def broker_answers(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        self.closed = True

    def results(self, topic: str) -> list[OutboundRecord]:
        return [r for r in self.sent if r.topic == topic]


def fake_clients(
    topic: str, log: dict[int, list[bytes | None]], publisher: FakePublisher
) -> tuple[KafkaClients, list[FakeConsumer]]:
    """`KafkaClients` opening `publisher` and a FakeConsumer over `log` (appended to the returned list)."""
    consumers: list[FakeConsumer] = []

    def open_consumer(
        kafka: KafkaSettings,
        security: SecuritySettings,
        delivery: DeliverySettings,
        rebalance: Rebalance,
        *,
        transactional: bool,
    ) -> FakeConsumer:
        consumer = FakeConsumer(topic, log, rebalance)
        consumers.append(consumer)
        return consumer

    return KafkaClients(open_producer=lambda *_sections: publisher, open_consumer=open_consumer), consumers
