"""What the poll loop reports each second: lag gauges, stalled partitions, the broker check, progress."""

from __future__ import annotations

import logging
import time

from worker.kafka.lag_gauges import LagGauges
from worker.kafka.loop_context import LoopContext
from worker.kafka.producer import ResultProducer

__all__ = ["LoopObserver"]

log = logging.getLogger(__name__)

_METRICS_EVERY_S = 1.0
_BROKER_CHECK_EVERY_S = 10.0


class LoopObserver:
    """Refreshes the gauges every `_METRICS_EVERY_S` (or right after an assignment) and checks the broker
    and says the progress every `_BROKER_CHECK_EVERY_S`, on the poll thread."""

    def __init__(
        self, context: LoopContext, producer: ResultProducer, lag_gauges: LagGauges, stuck_partition_s: float
    ) -> None:
        """`producer` is asked whether a broker answers; `stuck_partition_s` is when a stalled partition fails
        /readyz."""
        self._ctx = context
        self._producer = producer
        self._lag_gauges = lag_gauges
        self._stuck_partition_s = stuck_partition_s
        clock = context.clock
        self._gauges_due = False  # refresh the gauges on the next loop turn (a new assignment)
        self._next_metrics_at = 0.0  # when the loop refreshes the gauges and checks the broker next
        self._next_broker_check_at = clock() + _BROKER_CHECK_EVERY_S
        self._progress_mark = (0, clock())  # inputs done and when, at the last progress line

    def refresh_soon(self) -> None:
        """Measure the gauges on the next turn (a new partition is behind from its first second)."""
        self._gauges_due = True

    def observe(self) -> None:
        """Lag gauges and the broker check, when due."""
        ctx = self._ctx
        now = ctx.clock()
        if now >= self._next_metrics_at or self._gauges_due:
            self._gauges_due = False
            self._update_gauges()
            self._next_metrics_at = now + _METRICS_EVERY_S
        if now >= self._next_broker_check_at:
            ctx.health.broker_reachable = self._producer.broker_answers(timeout_s=2.0)
            self._next_broker_check_at = now + _BROKER_CHECK_EVERY_S
            self._say_progress(now)

    def _say_progress(self, now: float) -> None:
        """Every `_BROKER_CHECK_EVERY_S` while inputs get done: how many, and the rate since the last line."""
        summary, (done_before, at_before) = self._ctx.run.summary, self._progress_mark
        if summary.done > done_before:
            rate = (summary.done - done_before) / max(1e-9, now - at_before)
            log.info(
                "labelled %d (%d results, %d dead letters): %.0f msg/s over the last %.0f s",
                summary.done,
                summary.results,
                summary.dead_letters,
                rate,
                now - at_before,
            )
        self._progress_mark = (summary.done, now)

    def _update_gauges(self) -> None:
        ctx = self._ctx
        started = time.time()
        ctx.metrics.in_flight_messages.set(ctx.book.offsets.outstanding())
        self._watch_progress()
        ctx.metrics.ready.set(1 if ctx.health.readiness()[0] else 0)
        self._lag_gauges.refresh(ctx.consumer)
        # Last: a scrape that sees this turn's time sees lag gauges measured after it.
        ctx.metrics.last_poll_timestamp_seconds.set(started)

    def _watch_progress(self) -> None:
        """Partitions whose work has not moved for longer than stuck_partition_s while inputs wait make
        /readyz fail (each named), and their seconds are exported."""
        ctx = self._ctx
        now = ctx.clock()
        stalled = ctx.book.stalled(now)
        held = ctx.undecodable.held(now)
        for key, (seconds, _why) in held.items():  # held by a batch it cannot read: no progress either
            stalled[key] = max(stalled.get(key, 0.0), seconds)
        ctx.health.undecodable_batches = {f"{t}[{p}]": why for (t, p), (_s, why) in held.items()}
        for (topic, partition), seconds in stalled.items():
            ctx.metrics.partition_stalled_seconds.labels(topic, str(partition)).set(seconds)
        limit_s = self._stuck_partition_s
        stuck = {f"{t}[{p}]": s for (t, p), s in stalled.items() if s > limit_s}
        if stuck.keys() - ctx.health.stuck_partitions.keys():
            log.error(
                "no progress for more than %g s while inputs wait: %s; /readyz fails until they move",
                limit_s,
                ", ".join(f"{name} ({seconds:.0f} s)" for name, seconds in sorted(stuck.items())),
            )
        ctx.health.stuck_partitions = stuck
