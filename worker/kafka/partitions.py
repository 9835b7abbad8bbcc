"""Per-partition bookkeeping of the run loop, in one place: which partitions this member owns (and in which
assignment epoch), which are paused, which offsets are consumed but not yet acknowledged, and how old the
oldest unfinished message of each is.

Pure bookkeeping (no Kafka calls), owned by the poll thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from worker.kafka.lag_clock import LagClock
from worker.kafka.offsets import OffsetTracker, PartitionKey

__all__ = ["NOT_OWNED", "PartitionBook", "PartitionKey", "format_offsets", "format_partitions"]

NOT_OWNED = -1


@dataclass(frozen=True)
class _Progress:
    """Where a partition's work stood when last seen moving: its frontier (the oldest offset whose output is
    awaited, else the next offset to consume), since when (the caller's clock), and whether inputs waited."""

    frontier: int
    since: float
    waiting: bool


class PartitionBook:
    """Epochs, paused set, offset tracker and lag clock of the partitions this member works on.

    An epoch is bumped per assignment (and per rewind): work tagged with an older epoch is stale and never
    published, so a partition revoked and assigned again does not publish twice.
    """

    def __init__(self) -> None:
        self.offsets = OffsetTracker()
        self.lag_clock = LagClock()
        self._paused: set[PartitionKey] = set()
        self._epochs: dict[PartitionKey, int] = {}
        self._epoch_counter = 0
        self._progress: dict[PartitionKey, _Progress] = {}

    def assigned(self, partitions: Iterable[PartitionKey]) -> None:
        """New ownership: each partition starts a new epoch."""
        for key in partitions:
            self._epochs[key] = self._next_epoch()

    @property
    def owned(self) -> frozenset[PartitionKey]:
        """The partitions this member holds now (assigned and not revoked or lost)."""
        return frozenset(self._epochs)

    @property
    def paused(self) -> frozenset[PartitionKey]:
        """The partitions this member paused (backpressure) and still owns."""
        return frozenset(self._paused)

    def pause(self, assignment: Iterable[PartitionKey]) -> set[PartitionKey]:
        """Marks every partition of `assignment` paused; returns those not paused yet (to pause in the
        consumer)."""
        newly = set(assignment) - self._paused
        self._paused |= newly
        return newly

    def resume(self, assignment: Iterable[PartitionKey]) -> set[PartitionKey]:
        """Clears the paused set; returns its partitions still in `assignment` (to resume in the consumer)."""
        again = self._paused & set(assignment)
        self._paused.clear()
        return again

    def epoch(self, key: PartitionKey) -> int:
        """The current epoch of `key`, NOT_OWNED when it is not assigned."""
        return self._epochs.get(key, NOT_OWNED)

    def owns(self, key: PartitionKey, epoch: int) -> bool:
        """Work tagged (`key`, `epoch`) is still ours to publish."""
        return self._epochs.get(key) == epoch

    def consumed(self, key: PartitionKey, offset: int, timestamp_ms: int | None) -> int:
        """Tracks a consumed message; returns the epoch to tag its work with."""
        self.offsets.track(key[0], key[1], offset)
        self.lag_clock.consumed(key, offset, timestamp_ms)
        return self.epoch(key)

    def acknowledged(self, key: PartitionKey, offset: int, timestamp_ms: int | None) -> None:
        """The one record an input produced was delivered."""
        self.offsets.ack(key[0], key[1], offset)
        if timestamp_ms is not None:
            self.lag_clock.done(key, timestamp_ms)

    def positions(self, partitions: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        """Committable positions (next offset to consume) of `partitions` that have one."""
        positions = {key: self.offsets.position(*key) for key in partitions}
        return {key: position for key, position in positions.items() if position is not None}

    def rewind(self, partitions: Iterable[PartitionKey]) -> None:
        """Forget what was consumed from `partitions`; windows still in the pipeline for them become stale."""
        keys = list(partitions)
        self.offsets.forget(keys)
        for key in keys:
            self.lag_clock.forget(key)
            if key in self._epochs:
                self._epochs[key] = self._next_epoch()

    def forget(self, partitions: Iterable[PartitionKey]) -> None:
        """No longer ours (revoked or lost): drop every trace of them."""
        keys = list(partitions)
        self.offsets.forget(keys)
        self._paused.difference_update(keys)
        for key in keys:
            self._epochs.pop(key, None)
            self._progress.pop(key, None)
            self.lag_clock.forget(key)

    def lag_seconds(self, key: PartitionKey, lag_messages: int, now_ms: float) -> float | None:
        """Age of the oldest unfinished message of `key` (0 when caught up), None when unknown."""
        return self.lag_clock.lag_seconds(
            key, lag_messages=lag_messages, done_below=self.offsets.position(*key), now_ms=now_ms
        )

    def stalled(self, now: float) -> dict[PartitionKey, float]:
        """Seconds each owned partition has made no progress while inputs of it wait (consumed, output not
        acknowledged), 0 when it moves or nothing waits. Progress is its frontier (the oldest awaited offset,
        else the committable position) moving; a rewind (an aborted transaction reads the same offsets
        again) is not progress. `now` is the caller's clock; call it regularly (each gauge refresh)."""
        stalled: dict[PartitionKey, float] = {}
        for key in self._epochs:
            oldest = self.offsets.oldest(*key)
            frontier = oldest if oldest is not None else self.offsets.position(*key)
            seen = self._progress.get(key)
            if frontier is None:  # nothing consumed since the assignment or the last rewind: as last seen
                stalled[key] = now - seen.since if seen is not None and seen.waiting else 0.0
                continue
            waiting = oldest is not None
            if seen is None or seen.frontier != frontier or (waiting and not seen.waiting):
                seen = self._progress[key] = _Progress(frontier, now, waiting)
            elif seen.waiting != waiting:
                seen = self._progress[key] = _Progress(frontier, seen.since, waiting)
            stalled[key] = now - seen.since if waiting else 0.0
        return stalled

    def _next_epoch(self) -> int:
        self._epoch_counter += 1
        return self._epoch_counter


def format_partitions(partitions: Iterable[PartitionKey]) -> str:
    """`reviews[0], reviews[1]` (for log lines)."""
    return ", ".join(f"{t}[{p}]" for t, p in sorted(partitions)) or "nothing"


def format_assignment_change(verb: str, changed: Iterable[PartitionKey], held: Iterable[PartitionKey]) -> str:
    """`assigned reviews[2]; holds reviews[0], reviews[2]` (a log line). Under cooperative rebalancing an
    assignment adds to what the member holds, and a rebalance may add nothing while it keeps working:
    `assigned no more partitions; holds reviews[0], reviews[1]`."""
    changed = list(changed)
    what = format_partitions(changed) if changed else "no more partitions" if verb == "assigned" else "none"
    return f"{verb} {what}; holds {format_partitions(held)}"


def format_offsets(offsets: dict[PartitionKey, int]) -> str:
    """`reviews[0]=8, reviews[1]=15`: the next offset each partition's group reads (for log lines)."""
    return ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(offsets.items())) or "nothing"
