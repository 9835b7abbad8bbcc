"""Per-partition offset tracking: commit only what has been fully acknowledged.

An offset becomes committable only when it and every earlier tracked offset of the same partition have
been acknowledged (the one record it produced, result or dead letter, was delivered). Committed positions
follow Kafka semantics: the committed offset is the NEXT offset to consume, i.e. last released offset + 1.
Pure logic, O(1) amortised per message.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from worker.config import BatchingSettings, DeliverySettings

PartitionKey = tuple[str, int]
"""(topic, partition): the one name for a partition key in the worker (confluent-kafka's PartitionKey is
the client's class, used only at the Kafka calls)."""


class _PartitionState:
    """Offsets of one partition: tracked in consume order, and which of them still await an ack."""

    __slots__ = ("order", "unacked", "last_tracked", "position", "advanced")

    def __init__(self) -> None:
        self.order: deque[int] = deque()  # tracked, not yet released, increasing
        self.unacked: set[int] = set()  # subset of `order` still waiting for an ack
        self.last_tracked = -1
        self.position: int | None = None  # next offset to consume, once anything was released
        self.advanced = False  # position moved since the last `committable()`


class OffsetTracker:
    """Tracks consumed offsets and releases contiguous acknowledged prefixes per partition."""

    def __init__(self) -> None:
        self._partitions: dict[PartitionKey, _PartitionState] = {}
        self._ignored_acks = 0

    @property
    def ignored_acks(self) -> int:
        """Acks that matched nothing: unknown or forgotten partition, untracked or already-acked offset."""
        return self._ignored_acks

    def track(self, topic: str, partition: int, offset: int) -> None:
        """Record a consumed offset. Call in consume order: offsets must increase per partition (gaps are
        fine: compacted topics and transaction markers skip offsets). Raises ValueError otherwise."""
        key = (topic, partition)
        state = self._partitions.get(key)
        if state is None:
            state = self._partitions[key] = _PartitionState()
        if offset <= state.last_tracked:
            raise ValueError(
                f"offset {offset} of {topic}[{partition}] tracked after {state.last_tracked}: offsets must "
                "increase per partition (call forget() before re-consuming a partition)"
            )
        state.last_tracked = offset
        state.order.append(offset)
        state.unacked.add(offset)

    def ack(self, topic: str, partition: int, offset: int) -> None:
        """Acknowledge delivery of the record produced for `offset`; releases any contiguous acked prefix.

        Acks for unknown/forgotten partitions or offsets not awaiting an ack are ignored and counted in
        `ignored_acks` (late delivery reports after a revoke are normal).
        """
        state = self._partitions.get((topic, partition))
        if state is None or offset not in state.unacked:
            self._ignored_acks += 1
            return
        state.unacked.remove(offset)
        order = state.order
        released = None
        while order and order[0] not in state.unacked:
            released = order.popleft()
        if released is not None:
            state.position = released + 1
            state.advanced = True

    def committable(self) -> dict[PartitionKey, int]:
        """Positions to commit: for each partition whose position advanced since the last call, the next
        offset to consume (last contiguous acknowledged offset + 1). Each advance is reported once."""
        result: dict[PartitionKey, int] = {}
        for key, state in self._partitions.items():
            if state.advanced and state.position is not None:
                result[key] = state.position
                state.advanced = False
        return result

    def position(self, topic: str, partition: int) -> int | None:
        """The latest committable position of a partition (reported or not); None if nothing released yet."""
        state = self._partitions.get((topic, partition))
        return None if state is None else state.position

    def oldest(self, topic: str, partition: int) -> int | None:
        """The oldest tracked offset of a partition not yet released (its output is awaited), None if none."""
        state = self._partitions.get((topic, partition))
        return state.order[0] if state is not None and state.order else None

    def outstanding(self, topic: str | None = None, partition: int | None = None) -> int:
        """Tracked offsets not yet released, over all partitions or those matching `topic`/`partition`."""
        if topic is not None and partition is not None:
            state = self._partitions.get((topic, partition))
            return 0 if state is None else len(state.order)
        return sum(
            len(state.order)
            for (t, p), state in self._partitions.items()
            if (topic is None or t == topic) and (partition is None or p == partition)
        )

    def unacknowledged(self) -> int:
        """Tracked offsets still waiting for an ack, over all partitions: the inputs in progress."""
        return sum(len(state.unacked) for state in self._partitions.values())

    def forget(self, partitions: Iterable[PartitionKey]) -> None:
        """Drop all state of `partitions` (after the final commit on revoke, or on lost: never commit)."""
        for key in partitions:
            self._partitions.pop(key, None)


def crash_duplicate_bound(
    batching: BatchingSettings,
    delivery: DeliverySettings,
    labelled_per_s: float,
    largest_window: int | None = None,
) -> int:
    """The most outputs a kill -9 of one at-least-once worker can repeat (the README's bound).

    What a crash repeats is what was published after the last offset commit; everything else was either
    committed (never redone) or never published (redone, not repeated). That is:
    1. the windows published but not yet acknowledged: at most the inference pipeline's windows, the
       `max_queued_windows` queued or labelled plus the one being gathered, of `max_window_messages` each;
    2. the outputs acknowledged (offsets stored) since the last commit: what the worker labels in one
       `commit_interval_ms`, plus one more interval for a commit still in flight, at least a window each.
    `labelled_per_s` is the rate at which the worker labels: its input rate once caught up (its throughput
    while it works through a backlog). `largest_window`: the most messages a window holds, when windows
    grow past `max_window_messages` (on a GPU: about one token budget's worth of reviews). Exactly-once has
    no such tail (0 duplicates for read_committed).
    """
    window = max(batching.max_window_messages, largest_window or 0)
    in_pipeline = (batching.max_queued_windows + 1) * window
    per_commit = math.ceil(labelled_per_s * delivery.commit_interval_ms / 1000.0)
    return in_pipeline + 2 * max(window, per_commit)
