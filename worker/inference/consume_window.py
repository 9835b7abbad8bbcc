"""The consume window: consumed items gathered until there are enough, or the first has waited long enough.

Pure logic (no Kafka, no Paddle): it decides *when* a window is labelled; `batch_plan.py` decides how.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ConsumeWindow(Generic[T]):
    """Accumulates consumed items until the window is full or has waited long enough.

    Bounds: `max_messages` items, `max_tokens` summed token counts, and `max_wait_ms` milliseconds measured
    from the window's first item (so a quiet topic still gets timely results). `clock` returns monotonic
    seconds (injectable for tests). Items are returned by `take()` in insertion order.
    """

    def __init__(
        self,
        *,
        max_messages: int,
        max_wait_ms: float,
        max_tokens: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {max_messages}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self._max_messages = max_messages
        self._max_wait_s = max_wait_ms / 1000.0
        self._max_tokens = max_tokens
        self._clock = clock
        self._items: list[T] = []
        self._tokens = 0
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
    def tokens(self) -> int:
        """Sum of the token counts of the items in the window."""
        return self._tokens

    def add(self, item: T, n_tokens: int) -> None:
        """Append `item` (with its token count); the first item starts the wait clock.

        Adding to a full window is allowed (the bounds are checked by `is_full`); use `fits` first to keep
        the token bound strict.
        """
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        if not self._items:
            self._deadline = self._clock() + self._max_wait_s
        self._items.append(item)
        self._tokens += n_tokens

    def fits(self, n_tokens: int) -> bool:
        """True if an item of `n_tokens` can be added without exceeding a bound (always true when empty)."""
        if not self._items:
            return True
        return len(self._items) < self._max_messages and self._tokens + n_tokens <= self._max_tokens

    def is_full(self) -> bool:
        """True when the window holds `max_messages` items or `max_tokens` tokens (or more)."""
        return len(self._items) >= self._max_messages or self._tokens >= self._max_tokens

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
        self._tokens = 0
        self._deadline = 0.0
        return items
