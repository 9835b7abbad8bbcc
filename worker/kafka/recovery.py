"""Reading partitions again from their committed offsets: after an aborted transaction (those partitions), or
once exactly-once gave a transaction up (every partition, paused until transactions work again)."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException

from worker.kafka.assignment import Assignment
from worker.kafka.checkpoint import Checkpoint
from worker.kafka.consumer import handle_consume_error
from worker.kafka.loop_context import LoopContext
from worker.kafka.partitions import PartitionKey, format_partitions

__all__ = ["Recovery"]

log = logging.getLogger(__name__)

_POLL_S = 0.01


class Recovery:
    """Rewinds partitions; while `pending` (exactly_once gave a transaction up), the loop calls `turn()`
    instead of consuming."""

    def __init__(
        self, context: LoopContext, checkpoint: Checkpoint, assignment: Assignment, input_topic: str
    ) -> None:
        self._ctx = context
        self._checkpoint = checkpoint
        self._assignment = assignment
        self._input_topic = input_topic
        self.pending = False  # exactly_once gave a transaction up: every partition to read again

    def rewind(self, partitions: list[PartitionKey]) -> None:
        """Forget everything consumed from `partitions` and read them again from their committed offsets (not
        when stopping: nothing more is read, and the broker may be away)."""
        self._assignment.drop_inputs(partitions)
        self._ctx.book.rewind(partitions)  # windows still in the pipeline for them are stale
        self._ctx.undecodable.forget(partitions)
        if not self._ctx.run.stop_requested:
            self._ctx.consumer.rewind_to_committed(partitions)

    def hold(self) -> None:
        """exactly_once gave a transaction up: everything consumed and not committed is forgotten (windows in
        the pipeline are stale), the partitions paused; `turn` reads them again once transactions work."""
        assigned = sorted(self._ctx.consumer.assignment)
        self._assignment.drop_inputs(assigned)
        self._ctx.book.rewind(assigned)
        self._ctx.undecodable.forget(assigned)
        self.pending = True
        self._assignment.set_paused(True)

    def turn(self) -> None:
        """One loop turn of a recovery: partitions paused, polled (rebalances served; what comes is stale and
        dropped), one try at transactions; once they work, every partition is read again from its committed
        offset, which says whether the given-up transaction counted."""
        consumer = self._ctx.consumer
        self._assignment.set_paused(True)
        for message in consumer.consume(100, _POLL_S):
            err = message.error()
            if err is not None and handle_consume_error(err, self._input_topic):
                self._ctx.health.broker_reachable = False
        if not self._checkpoint.recover():
            return
        assigned = sorted(consumer.assignment)
        try:
            consumer.rewind_to_committed(assigned)
        except KafkaException as exc:
            log.warning("cannot read the committed offsets yet (%s); trying again", exc)
            return
        self._ctx.book.rewind(assigned)  # anything consumed meanwhile is stale too
        self.pending = False
        if assigned:
            log.info("exactly_once: reading again from committed offsets: %s", format_partitions(assigned))
