"""Carrying out what `UndecodableBatches` decides about a record batch the consumer cannot read: a probe's
seek, or the batch's offsets into the window as dead letters and the partition moved past them."""

from __future__ import annotations

import logging

from confluent_kafka import Message

from worker.kafka.loop_context import LoopContext
from worker.kafka.partitions import PartitionKey
from worker.kafka.producer import SourcePosition
from worker.kafka.records import InputMessage
from worker.kafka.undecodable import DeadLetterRange, Seek

__all__ = ["UndecodableInputs"]

log = logging.getLogger(__name__)


class UndecodableInputs:
    """The poll thread's hands for `UndecodableBatches` (see worker/kafka/undecodable.py). Each call takes
    `moved`: the partitions seeked this turn, whose other messages of this turn are stale."""

    def __init__(self, context: LoopContext, receive_message_max_bytes: int) -> None:
        """`receive_message_max_bytes`: the setting a dead letter's reason names."""
        self._ctx = context
        self._batches = context.undecodable
        self._receive_message_max_bytes = receive_message_max_bytes

    def tick(self, now: float, moved: set[PartitionKey]) -> None:
        """Probes whose time is up, carried out."""
        for action in self._batches.tick(now):
            self._carry_out(action, moved)

    def error(self, message: Message, reason: str, now: float, moved: set[PartitionKey]) -> None:
        """An error event pinning a partition at a record batch the consumer cannot read: retried, then
        probed for its end, then dead-lettered."""
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        if topic is None or partition is None or offset is None or offset < 0 or (topic, partition) in moved:
            return
        action = self._batches.error((topic, partition), offset, reason, now)
        if action is not None:
            self._carry_out(action, moved)

    def skip(self, key: PartitionKey, offset: int, now: float, moved: set[PartitionKey]) -> bool:
        """True when a data message at `offset` of `key` is to be dropped: seeked this turn, or a probe's
        answer while the partition is held by a batch it cannot read."""
        if key in moved:
            return True
        if not self._batches.holds(key):
            return False
        drop, answer = self._batches.data(key, offset, now)
        if answer is not None:
            self._carry_out(answer, moved)
        return drop

    def _carry_out(self, action: Seek | DeadLetterRange, moved: set[PartitionKey]) -> None:
        """A probe's seek; or the batch's offsets into the window as dead letters, the partition past them."""
        ctx = self._ctx
        consumer = ctx.consumer
        moved.add(action.key)
        if isinstance(action, Seek):
            consumer.seek(action.key, action.offset)
            return
        (topic, partition), first, last = action.key, action.first, action.last
        reason = (
            f"the record batch holding offsets {first}-{last} of {topic}[{partition}] could not be read: "
            f"{action.reason} (e.g. it decompresses to more than SENTIMENT_RECEIVE_MESSAGE_MAX_BYTES="
            f"{self._receive_message_max_bytes} bytes, or uses a codec this client lacks); "
            "nothing "
            "of its keys and values is kept"
        )
        log.warning("%s[%d]: offsets %d-%d dead-lettered as undecodable_batch: %s", *action.key, first, last,
                    action.reason)  # fmt: skip
        now = ctx.clock()
        for offset in range(first, last + 1):
            position = SourcePosition(topic, partition, offset, None)
            epoch = ctx.book.consumed(action.key, offset, None)
            ctx.window.add(InputMessage(position, None, None, now, epoch, None, reason), 0)
        ctx.run.consumed(last - first + 1)
        ctx.metrics.messages_consumed.labels(topic).inc(last - first + 1)
        consumer.seek(action.key, last + 1)
