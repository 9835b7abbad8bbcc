"""Lag in seconds per partition: the age of the oldest message not yet done."""

from __future__ import annotations

from collections import deque

from worker.kafka.offsets import PartitionKey


class LagClock:
    """Remembers (offset, timestamp) of consumed messages per partition until they are done, and the
    timestamp of the next message of a partition nothing has been fetched from yet.

    Pure bookkeeping, owned by the poll thread: `consumed` per message, `done` per acknowledged output,
    `waiting` when the first unfetched message was read from the broker, `lag_seconds` when the gauges
    refresh (it trims what became committable).
    """

    def __init__(self) -> None:
        self._unfinished: dict[PartitionKey, deque[tuple[int, int | None]]] = {}
        self._last_done_ms: dict[PartitionKey, int] = {}
        self._waiting: dict[PartitionKey, tuple[int, int | None]] = {}

    def consumed(self, key: PartitionKey, offset: int, timestamp_ms: int | None) -> None:
        self._unfinished.setdefault(key, deque()).append((offset, timestamp_ms))

    def done(self, key: PartitionKey, timestamp_ms: int) -> None:
        self._last_done_ms[key] = timestamp_ms

    def waiting(self, key: PartitionKey, offset: int, timestamp_ms: int | None) -> None:
        """The message at `offset`, the next to consume of a partition not fetched yet, was written at
        `timestamp_ms` (None: it could not be read; not asked again for the same offset)."""
        self._waiting[key] = (offset, timestamp_ms)

    def knows_waiting(self, key: PartitionKey, offset: int) -> bool:
        """`waiting` was already told about `offset` of `key`."""
        known = self._waiting.get(key)
        return known is not None and known[0] == offset

    def forget(self, key: PartitionKey) -> None:
        self._unfinished.pop(key, None)
        self._last_done_ms.pop(key, None)
        self._waiting.pop(key, None)

    def lag_seconds(
        self, key: PartitionKey, *, lag_messages: int, done_below: int | None, now_ms: float
    ) -> float | None:
        """Seconds the partition is behind, or None while unknown.

        `done_below`: every offset below it is done (the tracker's committable position; None before
        anything was consumed); `lag_messages`: messages on the broker not consumed yet. Consumed-but-
        unfinished messages give their age; with none, a caught-up partition is 0 behind; a partition not
        consumed from yet, the age of its first waiting message (`waiting`); one with unfetched messages
        after done ones, at most the age of the last done message (the next one was written after it).
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
        offset, waiting_ms = self._waiting.get(key, (-1, None))
        if waiting_ms is not None and (done_below is None or offset >= done_below):
            return max(0.0, (now_ms - waiting_ms) / 1000.0)
        last_done_ms = self._last_done_ms.get(key)
        return None if last_done_ms is None else max(0.0, (now_ms - last_done_ms) / 1000.0)
