"""What the poll loop's helpers share, built once the consumer is in the group (like quix-streams'
`ProcessingContext`): the consumer, the consume window, the per-partition books, the run, health and
metrics. Each helper (publisher, checkpoint, assignment, recovery, observer, undecodable inputs) takes it
with only what is its own besides."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from worker.health import HealthState
from worker.kafka.consume_window import ConsumeWindow
from worker.kafka.consumer import ReviewConsumer
from worker.kafka.partitions import PartitionBook
from worker.kafka.records import InputMessage
from worker.kafka.run_tracker import RunTracker
from worker.kafka.undecodable import UndecodableBatches
from worker.metrics import WorkerMetrics

__all__ = ["LoopContext"]


@dataclass(frozen=True)
class LoopContext:
    """The poll thread's shared parts; none of them is thread-safe beyond what its own class says."""

    consumer: ReviewConsumer
    window: ConsumeWindow[InputMessage]  # consumed inputs not yet submitted to the Labeller
    book: PartitionBook  # epochs, paused set, offset tracker, lag clock
    undecodable: UndecodableBatches  # partitions held by a record batch the consumer cannot read
    run: RunTracker  # stop conditions and the run's summary
    health: HealthState
    metrics: WorkerMetrics
    clock: Callable[[], float]  # monotonic seconds
