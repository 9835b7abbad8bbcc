"""Micro-batching: a bounded window of consumed items, and token-budget, length-sorted inference batches.

Pure logic (no Kafka, no Paddle). The window decides *when* to run inference; `plan_batches` decides *how*
to split the window's items into model calls so that padding is small and each call fits a token budget.
Grouping by length reorders items only inside the window: the caller emits results in window input order,
so publishing order within a partition is never changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


def plan_batches(
    token_counts: Sequence[int], *, max_batch_size: int, max_batch_tokens: int
) -> list[list[int]]:
    """Group item indices into inference batches.

    Items are sorted by token count (stable, so equal lengths keep input order) and packed greedily so that
    each batch has at most `max_batch_size` items and at most `max_batch_tokens` padded tokens
    (`len(batch) * max(token_count in batch)`, what the model actually computes on). An item that alone
    exceeds `max_batch_tokens` gets a batch of its own; the caller decides what to do with it (truncate,
    chunk, or dead-letter). Every index appears exactly once. Batches come out shortest first; the caller
    restores window input order when it publishes results.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    order = sorted(range(len(token_counts)), key=token_counts.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        n_tokens = token_counts[index]
        if n_tokens < 0:
            raise ValueError(f"token count must be >= 0, got {n_tokens} at index {index}")
        # Ascending order: this item is the longest in the batch, so it sets the padded length.
        size = len(current) + 1
        if current and (size > max_batch_size or size * n_tokens > max_batch_tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def padded_tokens(batch: Sequence[int], token_counts: Sequence[int]) -> int:
    """Tokens the model computes for `batch` (indices into `token_counts`) padded to its longest item."""
    if not batch:
        return 0
    return len(batch) * max(token_counts[i] for i in batch)


def padding_efficiency(batches: Sequence[Sequence[int]], token_counts: Sequence[int]) -> float:
    """Real tokens / padded tokens over all `batches`, in (0, 1]; 1.0 when there is nothing to pad."""
    padded = sum(padded_tokens(batch, token_counts) for batch in batches)
    if padded == 0:
        return 1.0
    real = sum(token_counts[i] for batch in batches for i in batch)
    return real / padded


class BatchWindow(Generic[T]):
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
