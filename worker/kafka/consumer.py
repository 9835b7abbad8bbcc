"""The Kafka consumer of the input topic: a consumer group member that stores offsets only when told."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from worker.kafka.offsets import PartitionKey

log = logging.getLogger(__name__)


class PartitionBacklog(NamedTuple):
    """What is left to consume of one partition, as this member sees it."""

    lag_messages: int  # high watermark - next_offset
    next_offset: int  # the next offset this member consumes
    fetched: bool  # False: nothing handed over yet; next_offset is the committed (or log start) offset


RebalanceCallback = Callable[[list[PartitionKey]], None]
OffsetsFor = Callable[[frozenset[PartitionKey]], dict[PartitionKey, int]]

# Commit refusals that only mean "the group is rebalancing": the same commit succeeds once this member
# has joined the new generation.
REBALANCING_CODES = frozenset({KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS})


def handle_consume_error(err: KafkaError, input_topic: str) -> bool:
    """Handles an error event from consume(): raises a fatal one, logs the others with what to do. Returns
    True when it means the brokers are unreachable (librdkafka keeps retrying)."""
    if err.code() == KafkaError._PARTITION_EOF:
        return False
    if err.fatal():
        raise KafkaException(err)
    if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
        log.warning("broker unreachable (%s); librdkafka keeps retrying", err.str())
        return True
    if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        log.error(
            "input topic %r does not exist yet (%s): create it with `sentiment-worker topics create`",
            input_topic,
            err.str(),
        )
    else:
        log.warning("consumer error: %s", err.str())
    return False


class ReviewConsumer:
    """Consumes the input topic in a group with cooperative-sticky assignment.

    Offsets are stored explicitly (`store`) after their outputs were acknowledged and committed by
    librdkafka's auto-commit every `commit_interval_ms`, plus synchronously on revoke and close.
    """

    def __init__(
        self,
        common_conf: dict[str, Any],
        *,
        group_id: str,
        topic: str,
        commit_interval_ms: int,
        max_poll_interval_ms: int,
        session_timeout_ms: int = 10_000,
        on_assign: RebalanceCallback,
        on_revoke: RebalanceCallback,
        on_lost: RebalanceCallback,
        transactional: bool = False,
        fetch_limits: dict[str, int] | None = None,
    ) -> None:
        # The fetch limits bound what one fetch brings and decompresses (docs/delivery.md); kafka_extra, in
        # the common properties, may override them.
        conf = {**(fetch_limits or {}), **common_conf}
        conf.update(
            {
                "group.id": group_id,
                # Incremental rebalances: partitions that stay with this member keep flowing.
                "partition.assignment.strategy": "cooperative-sticky",
                # Offsets are stored only after the broker acknowledged their result or dead letter;
                # the automatic store would mark messages as done as soon as they are handed to us.
                "enable.auto.offset.store": False,
                # Commits what was stored, periodically; revoke and close commit synchronously too.
                # Exactly-once: offsets are committed inside the producer's transactions only.
                "enable.auto.commit": not transactional,
                "auto.commit.interval.ms": commit_interval_ms,
                "auto.offset.reset": "earliest",
                "max.poll.interval.ms": max_poll_interval_ms,
                # How soon the group notices a dead member; librdkafka requires it <= max.poll.interval.ms.
                "session.timeout.ms": min(session_timeout_ms, max_poll_interval_ms),
                # Transactional producers upstream: never read aborted records.
                "isolation.level": "read_committed",
            }
        )
        self._topic = topic
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._on_lost = on_lost
        self._consumer = Consumer(conf)
        self._assignment: set[PartitionKey] = set()
        # Where consumption of a partition starts while its position is unknown (see `lag`).
        self._start_offsets: dict[PartitionKey, int] = {}
        self._closed = False

    def subscribe(self) -> None:
        self._consumer.subscribe(
            [self._topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
        )

    # librdkafka calls these from inside consume(), on this thread.
    def _assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self._assignment.update(keys)
        self._forget_start_offsets(keys)
        self._on_assign(keys)

    def _revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self._on_revoke(keys)
        self._assignment.difference_update(keys)
        self._forget_start_offsets(keys)

    def _lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        # Lost (session timed out): another member may already own these; never commit for them.
        self._on_lost(keys)
        self._assignment.difference_update(keys)
        self._forget_start_offsets(keys)

    def _forget_start_offsets(self, keys: Iterable[PartitionKey]) -> None:
        for key in keys:
            self._start_offsets.pop(key, None)

    @property
    def assignment(self) -> frozenset[PartitionKey]:
        return frozenset(self._assignment)

    def consume(self, max_messages: int, timeout_s: float) -> list[Message]:
        """Up to `max_messages` messages (data or errors) within `timeout_s`; serves rebalance callbacks."""
        return self._consumer.consume(num_messages=max(1, max_messages), timeout=max(0.0, timeout_s))

    def store(self, offsets: dict[PartitionKey, int]) -> None:
        """Marks `offsets` (next offset to read, per partition) for the next commit."""
        owned = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if (t, p) in self._assignment]
        if owned:
            self._consumer.store_offsets(offsets=owned)

    def commit_now(self, offsets: dict[PartitionKey, int]) -> None:
        """Commits `offsets` synchronously (revoke and shutdown paths)."""
        if not offsets:
            return
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            self._consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError._NO_OFFSET:
                return
            raise

    def commit_through_rebalance(self, offsets_for: OffsetsFor, timeout_s: float, poll_s: float = 0.5) -> int:
        """Commits ``offsets_for(assignment)``, riding out a rebalance; returns how many retries it took.

        When the broker refuses the commit because the group is rebalancing, this member takes part in the
        rebalance (polling serves the join and the revoke/assign callbacks; its partitions are paused, and
        anything fetched meanwhile is dropped unstored, so its owner reads it again) and then commits again
        what it still owns. Raises the last refusal after ``timeout_s``, or any other commit error at once.
        """
        deadline = time.monotonic() + timeout_s
        retries = 0
        while True:
            try:
                self.commit_now(offsets_for(self.assignment))
                return retries
            except KafkaException as exc:
                if not exc.args or exc.args[0].code() not in REBALANCING_CODES:
                    raise
                if time.monotonic() >= deadline:
                    raise
                if retries == 0:
                    log.info("commit refused while the group rebalances (%s); retrying", exc.args[0].str())
            retries += 1
            self.pause(self._assignment)
            self.consume(100, poll_s)  # dropped: never stored, so never committed

    def group_metadata(self) -> Any:
        """The group's metadata, for send_offsets_to_transaction (fences zombies after a rebalance)."""
        return self._consumer.consumer_group_metadata()

    def rewind_to_committed(self, partitions: Iterable[PartitionKey], timeout_s: float = 10.0) -> None:
        """Seeks `partitions` back to their committed offsets (or the beginning when none is committed)."""
        tps = [TopicPartition(t, p) for t, p in partitions if (t, p) in self._assignment]
        if not tps:
            return
        self._forget_start_offsets((tp.topic, tp.partition) for tp in tps)
        for tp in self._consumer.committed(tps, timeout=timeout_s):
            if tp.offset < 0:
                tp.offset = OFFSET_BEGINNING
            self._consumer.seek(tp)

    def seek(self, key: PartitionKey, offset: int) -> None:
        """The next message of `key` handed over is the one at `offset` (or the first after it)."""
        if key in self._assignment:
            self._start_offsets.pop(key, None)
            self._consumer.seek(TopicPartition(key[0], key[1], offset))

    def pause(self, partitions: Iterable[PartitionKey]) -> None:
        self._consumer.pause([TopicPartition(t, p) for t, p in partitions])

    def resume(self, partitions: Iterable[PartitionKey]) -> None:
        self._consumer.resume([TopicPartition(t, p) for t, p in partitions])

    def lag(self, timeout_s: float = 2.0) -> dict[PartitionKey, PartitionBacklog]:
        """Backlog of every assigned partition: high watermark minus the next offset this member consumes.

        The next offset is the consumer's position once a message of the partition was handed over (or it
        was seeked); before that, the group's committed offset, or the log start when none is committed
        (`auto.offset.reset=earliest`), read from the broker once per assignment. Watermarks are the cached
        ones of the fetcher, asked from the broker while the partition has none. A partition whose offsets
        could not be read within `timeout_s` is left out (asked again next time).
        """
        if not self._assignment:
            return {}
        tps = [TopicPartition(t, p) for t, p in sorted(self._assignment)]
        positions = {(tp.topic, tp.partition): tp.offset for tp in self._consumer.position(tps)}
        unknown = [key for key, offset in positions.items() if offset < 0 and key not in self._start_offsets]
        if unknown:
            self._read_start_offsets(unknown, timeout_s)
        backlog: dict[PartitionKey, PartitionBacklog] = {}
        for key, position in positions.items():
            fetched = position >= 0
            next_offset = position if fetched else self._start_offsets.get(key)
            high = self.high_watermark(key, timeout_s)
            if next_offset is None or high is None:
                continue
            backlog[key] = PartitionBacklog(max(0, high - next_offset), next_offset, fetched)
        return backlog

    def _read_start_offsets(self, keys: list[PartitionKey], timeout_s: float) -> None:
        """The offset consumption of `keys` starts at: committed, else the log start (earliest reset)."""
        try:
            committed = self._consumer.committed([TopicPartition(t, p) for t, p in keys], timeout=timeout_s)
        except KafkaException as exc:
            log.debug("committed offsets unavailable for the lag gauges: %s", exc)
            return
        for tp in committed:
            key = (tp.topic, tp.partition)
            if tp.error is not None:
                continue
            if tp.offset >= 0:
                self._start_offsets[key] = tp.offset
                continue
            try:
                low, _high = self._consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
            except KafkaException as exc:
                log.debug("log start of %s[%d] unavailable for the lag gauges: %s", *key, exc)
                continue
            if low >= 0:
                self._start_offsets[key] = low

    def high_watermark(self, key: PartitionKey, timeout_s: float = 2.0) -> int | None:
        """The partition's high watermark: the fetcher's cached one, else asked from the broker within
        `timeout_s`; None when unknown."""
        tp = TopicPartition(*key)
        try:
            _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if high < 0:  # nothing fetched yet: ask the broker
                _low, high = self._consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
        except KafkaException:
            return None
        return high if high >= 0 else None

    def close(self) -> None:
        """Leaves the group (revoke callbacks run and commit) and closes. Idempotent.

        confluent-kafka's close serves the consumer's queue until it has left the group, so librdkafka's
        log lines queued by then reach the `librdkafka` logger (nothing to poll first, unlike the producer).
        """
        if not self._closed:
            self._closed = True
            self._consumer.close()
