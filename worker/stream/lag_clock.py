"""Lag in seconds per partition: the age of the oldest message consumed but not yet done."""

from __future__ import annotations

from collections import deque

from worker.stream.offsets import PartitionKey


class LagClock:
    """Remembers (offset, timestamp) of consumed messages per partition until they are done.

    Pure bookkeeping, owned by the poll thread: `consumed` per message, `done` per acknowledged output,
    `lag_seconds` when the gauges refresh (it trims what became committable).
    """

    def __init__(self) -> None:
        self._unfinished: dict[PartitionKey, deque[tuple[int, int | None]]] = {}
        self._last_done_ms: dict[PartitionKey, int] = {}

    def consumed(self, key: PartitionKey, offset: int, timestamp_ms: int | None) -> None:
        self._unfinished.setdefault(key, deque()).append((offset, timestamp_ms))

    def done(self, key: PartitionKey, timestamp_ms: int) -> None:
        self._last_done_ms[key] = timestamp_ms

    def forget(self, key: PartitionKey) -> None:
        self._unfinished.pop(key, None)
        self._last_done_ms.pop(key, None)

    def lag_seconds(
        self, key: PartitionKey, *, lag_messages: int, done_below: int | None, now_ms: float
    ) -> float | None:
        """Seconds the partition is behind, or None while unknown.

        `done_below`: every offset below it is done (the tracker's committable position); `lag_messages`:
        messages on the broker not consumed yet. Consumed-but-unfinished messages give their age; with
        none, a caught-up partition is 0 behind, and one with unfetched messages at most as old as the last
        done message (the next one was written after it).
        """
        unfinished = self._unfinished.get(key)
        if unfinished and done_below is not None:
            while unfinished and unfinished[0][0] < done_below:
                unfinished.popleft()
        oldest_ms = unfinished[0][1] if unfinished else None
        if oldest_ms is not None:
            return max(0.0, (now_ms - oldest_ms) / 1000.0)
        if lag_messages == 0:
            return 0.0
        last_done_ms = self._last_done_ms.get(key)
        return None if last_done_ms is None else max(0.0, (now_ms - last_done_ms) / 1000.0)
