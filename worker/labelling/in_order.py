"""Items submitted to the Labeller and handed back with their predictions in submission order, a bounded
number at a time: the Kafka worker's windows (publish order), `predict`'s chunks (output order), `bench`'s
windows.

The bound is what keeps memory bounded: a caller checks `has_room()` before it submits (the worker pauses
its partitions when there is none), or lets `pipeline()` do it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_futures
from typing import Generic, TypeVar

from schemas.review_input import Review
from worker.labelling.labeller import Labeller, Predictions

T = TypeVar("T")


class InOrder(Generic[T]):
    """At most `capacity` items in flight on `labeller`; `collect` returns them labelled, in order."""

    def __init__(self, labeller: Labeller, *, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._labeller = labeller
        self._capacity = capacity
        self._queue: deque[tuple[T, Future[Predictions]]] = deque()

    @property
    def in_flight(self) -> int:
        """Submitted items not yet collected (queued, being labelled, or labelled and waiting)."""
        return len(self._queue)

    def has_room(self) -> bool:
        return len(self._queue) < self._capacity

    def submit(self, item: T, reviews: Sequence[Review]) -> None:
        """Submits `item`'s reviews (gathered already: due at once); check `has_room()` first."""
        if not self.has_room():
            raise RuntimeError("too many items in flight: check has_room() before submitting")
        self._queue.append((item, self._labeller.label(reviews)))

    def collect(self, timeout_s: float = 0.0) -> list[tuple[T, Predictions]]:
        """The items labelled so far, in submission order (up to the first one still being labelled); waits
        up to `timeout_s` for the first one. Re-raises a failure of the Labeller on the caller's thread."""
        if self._queue and timeout_s > 0:
            wait_for_futures([self._queue[0][1]], timeout_s)
        ready: list[tuple[T, Predictions]] = []
        while self._queue and self._queue[0][1].done():
            item, future = self._queue.popleft()
            error = future.exception()
            if error is not None:
                raise RuntimeError(f"inference failed: {error}") from error
            ready.append((item, future.result()))
        return ready

    def pipeline(self, items: Iterable[tuple[T, Sequence[Review]]]) -> Iterator[tuple[T, Predictions]]:
        """Submits `items` (each with its reviews) as room allows and yields them labelled, in order. `items`
        is drawn on the caller's thread while the Labeller labels the earlier ones, so a lazy iterable that
        prepares each item overlaps that work with inference."""
        pending = iter(items)
        exhausted = False
        while True:
            while not exhausted and self.has_room():
                nxt = next(pending, None)
                if nxt is None:
                    exhausted = True
                    break
                self.submit(*nxt)
            if exhausted and not self._queue:
                return
            yield from self.collect(timeout_s=1.0)
