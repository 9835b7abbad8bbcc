"""The partitions this member owns: the rebalance callbacks, pausing, and dropping a partition's inputs.

The callbacks run inside `consume()`, on the poll thread. A revoked partition's finished work is committed
first (the checkpoint); its inputs not yet labelled are dropped uncommitted, so the next owner reads them
again (no loss, no duplicate). A lost partition may already belong to another member: nothing is committed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import suppress

from worker.kafka.checkpoint import Checkpoint
from worker.kafka.loop_context import LoopContext
from worker.kafka.loop_observer import LoopObserver
from worker.kafka.partitions import PartitionKey, format_assignment_change, format_partitions

__all__ = ["Assignment"]

log = logging.getLogger(__name__)


class Assignment:
    """Keeps the partition book, the consumer's pauses, the window and the gauges in step with what the
    group assigns this member."""

    def __init__(self, context: LoopContext, checkpoint: Checkpoint, observer: LoopObserver) -> None:
        """`checkpoint` commits a revoked partition's work; `observer` measures a new one's lag at once."""
        self._ctx = context
        self._checkpoint = checkpoint
        self._observer = observer

    # ----- rebalance callbacks (run inside consume(), on the loop's thread) -----
    def on_assign(self, partitions: list[PartitionKey]) -> None:
        self._ctx.metrics.rebalances.labels("assigned").inc()
        self._ctx.run.activity()  # the idle timer (--idle-exit-s) restarts with new partitions
        self._ctx.book.assigned(partitions)
        # Both lag series of a new partition are measured right after this callback (same loop turn), not
        # set to 0: a partition whose backlog is not fetched yet is behind from its first second.
        self._observer.refresh_soon()
        log.info("%s", format_assignment_change("assigned", partitions, self._ctx.book.owned))
        self._set_assigned_count(partitions, added=True)

    def on_revoke(self, partitions: list[PartitionKey]) -> None:
        """Finish and commit the work of revoked partitions; their not-yet-labelled messages are dropped
        uncommitted, so the next owner reads them again (no loss, no duplicate)."""
        self._ctx.metrics.rebalances.labels("revoked").inc()
        self.drop_inputs(partitions)
        committed = self._checkpoint.revoked(partitions)
        self._forget(partitions)
        log.info("%s (%s)", format_assignment_change("revoked", partitions, self._ctx.book.owned), committed)
        self._set_assigned_count(partitions, added=False)

    def on_lost(self, partitions: list[PartitionKey]) -> None:
        """Lost partitions may already belong to another member: drop their work, commit nothing."""
        self._ctx.metrics.rebalances.labels("lost").inc()
        self.drop_inputs(partitions)
        self._forget(partitions)
        log.warning("lost %s: dropped their in-flight work without committing", format_partitions(partitions))
        self._set_assigned_count(partitions, added=False)

    # ----- the poll loop's -----
    def set_paused(self, paused: bool) -> None:
        """Pauses (or resumes) every assigned partition, as the book and the consumer both know."""
        consumer = self._ctx.consumer
        if paused:
            newly = self._ctx.book.pause(consumer.assignment)
            if newly:
                consumer.pause(newly)
        else:
            again = self._ctx.book.resume(consumer.assignment)
            if again:
                consumer.resume(again)
        self._ctx.metrics.paused.set(1 if self._ctx.book.paused else 0)

    def drop_inputs(self, partitions: Iterable[PartitionKey]) -> None:
        """Takes the inputs of `partitions` out of the window (they stay uncommitted)."""
        gone = set(partitions)
        kept = [
            item
            for item in self._ctx.window.take()
            if (item.position.topic, item.position.partition) not in gone
        ]
        for item in kept:
            self._ctx.window.add(item, len(item.value or b""))

    def _forget(self, partitions: list[PartitionKey]) -> None:
        # librdkafka keeps a partition paused by the app through its revocation: assigned again, it would
        # fetch nothing, and the book (which forgets it here) would never resume it.
        paused = self._ctx.book.paused & set(partitions)
        if paused:
            self._ctx.consumer.resume(paused)
        self._ctx.book.forget(partitions)
        self._ctx.undecodable.forget(partitions)
        m = self._ctx.metrics
        for key in partitions:
            for gauge in (m.consumer_lag_messages, m.consumer_lag_seconds, m.partition_stalled_seconds):
                with suppress(KeyError):
                    gauge.remove(key[0], str(key[1]))

    def _set_assigned_count(self, partitions: list[PartitionKey], *, added: bool) -> None:
        # The consumer adds assigned partitions before this callback and removes revoked ones after it.
        owned = self._ctx.consumer.assignment if added else self._ctx.consumer.assignment - set(partitions)
        self._ctx.health.assigned_partitions = len(owned)
        self._ctx.metrics.ready.set(1 if self._ctx.health.readiness()[0] else 0)
