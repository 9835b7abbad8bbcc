"""The consume window: consumed items gathered until there are enough, or the first has waited long enough.

Pure logic (no Kafka calls, no Paddle): it decides *when* a window of consumed messages is decoded and
labelled; the engine's batch plan decides how. Its size bound is the messages' value bytes, a bound on the
memory a window holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ConsumeWindow(Generic[T]):
    """Accumulates consumed items until the window is full or has waited long enough.

    Bounds: `max_messages` items, `max_bytes` summed value bytes, and `max_wait_ms` milliseconds measured
    from the window's first item (so a quiet topic still gets timely results). `clock` returns monotonic
    seconds (injectable for tests). Items are returned by `take()` in insertion order.
    """

    def __init__(
        self,
        *,
        max_messages: int,
        max_wait_ms: float,
        max_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {max_messages}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self._max_messages = max_messages
        self._max_wait_s = max_wait_ms / 1000.0
        self._max_bytes = max_bytes
        self._clock = clock
        self._items: list[T] = []
        self._bytes = 0
        self._deadline = 0.0  # monotonic seconds when the current window becomes due

    def __len__(self) -> int:
        return len(self._items)

    @property
    def max_messages(self) -> int:
        """The window's item cap; settable (a GPU window grows with the batch it should fill). Lowering it
        below the items held makes the window full."""
        return self._max_messages

    @max_messages.setter
    def max_messages(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"max_messages must be >= 1, got {value}")
        self._max_messages = value

    @property
    def held_bytes(self) -> int:
        """Sum of the byte sizes of the items in the window."""
        return self._bytes

    def add(self, item: T, size_bytes: int) -> None:
        """Append `item` (with its size in bytes); the first item starts the wait clock.

        Adding to a full window is allowed (the bounds are checked by `is_full`); use `fits` first to keep
        the byte bound strict.
        """
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
        if not self._items:
            self._deadline = self._clock() + self._max_wait_s
        self._items.append(item)
        self._bytes += size_bytes

    def fits(self, size_bytes: int) -> bool:
        """True if an item of `size_bytes` can be added without exceeding a bound (always true when empty)."""
        if not self._items:
            return True
        return len(self._items) < self._max_messages and self._bytes + size_bytes <= self._max_bytes

    def is_full(self) -> bool:
        """True when the window holds `max_messages` items or `max_bytes` bytes (or more)."""
        return len(self._items) >= self._max_messages or self._bytes >= self._max_bytes

    def is_due(self) -> bool:
        """True when the window should be processed now: non-empty and full or waited `max_wait_ms`."""
        if not self._items:
            return False
        return self.is_full() or self._clock() >= self._deadline

    def remaining_wait_s(self) -> float:
        """Seconds until the window is due, for the consumer poll timeout.

        0.0 when due; the full `max_wait_ms` when empty (the wait only starts with the first item).
        """
        if not self._items:
            return self._max_wait_s
        if self.is_full():
            return 0.0
        return max(0.0, self._deadline - self._clock())

    def take(self) -> list[T]:
        """Return the items in insertion order and reset the window to empty."""
        items = self._items
        self._items = []
        self._bytes = 0
        self._deadline = 0.0
        return items
