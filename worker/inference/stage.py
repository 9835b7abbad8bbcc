"""The inference thread: windows go in, labelled windows come out in the same order.

The poll loop keeps fetching, decoding and tokenizing the next window while the model labels the current
one. The queue in front of the model is bounded (`max_queued_windows`); when it is full the poll loop
pauses its partitions instead of buffering more input.

A window's work is begun on the submitting thread (`begin`: its batches are queued on the model lanes at
once) and the inference thread only waits for it, in order: the next window's batches are queued while
this one runs, so the lanes go from one window to the next without idling at the boundary.

A second lane, `call()`, runs other work on the same thread (the HTTP request batches): FIFO with the
windows, its result in a future of its own, so the model is used by one thread and the poll loop's
`collect()` only ever sees its windows.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

In = TypeVar("In")
Out = TypeVar("Out")
R = TypeVar("R")


@dataclass(frozen=True)
class _Failed:
    error: BaseException


@dataclass(frozen=True)
class _Begun(Generic[Out]):
    finish: Callable[[], Out]


@dataclass(frozen=True)
class _Call:
    work: Callable[[], Any]
    future: Future[Any]


_STOP = object()


class InferenceStage(Generic[In, Out]):
    """Begins submitted items on the caller's thread and finishes them in one background thread, FIFO;
    results are collected in order."""

    def __init__(
        self,
        begin: Callable[[In], Callable[[], Out]] | None,
        *,
        max_queued_windows: int,
        name: str = "inference",
    ) -> None:
        """`begin` starts labelling a submitted window (on the submitting thread) and returns the function
        the inference thread calls for its result; None for a stage that only runs `call()`s (serve)."""
        if max_queued_windows < 1:
            raise ValueError("max_queued_windows must be >= 1")
        self._begin = begin
        self._capacity = max_queued_windows
        self._inbox: queue.Queue[object] = queue.Queue()
        self._done: deque[Out | _Failed] = deque()
        self._submitted = 0
        self._collected = 0
        self._closed = False
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def in_flight(self) -> int:
        """Submitted windows not yet collected (queued, running, or done and waiting)."""
        return self._submitted - self._collected

    def has_room(self) -> bool:
        return self.in_flight < self._capacity

    def submit(self, item: In) -> None:
        """Begins `item` here and queues its finish; callers check `has_room()` first (the bound is what
        pauses the consumer)."""
        if self._begin is None:
            raise RuntimeError("this inference stage takes calls only")
        if not self.has_room():
            raise RuntimeError("inference queue is full: check has_room() before submitting")
        self._submitted += 1
        try:
            finish = self._begin(item)
        except BaseException as exc:  # noqa: BLE001 - collected in its place, like a failed finish
            finish = _raising(exc)
        self._inbox.put(_Begun(finish))

    def collect(self, timeout_s: float = 0.0) -> list[Out]:
        """Finished results in submission order; waits up to `timeout_s` for the first one.

        Re-raises, on the caller's thread, an exception the work raised.
        """
        with self._finished:
            if not self._done and timeout_s > 0 and self.in_flight:
                self._finished.wait(timeout_s)
            ready = list(self._done)
            self._done.clear()
        self._collected += len(ready)
        results: list[Out] = []
        for entry in ready:
            if isinstance(entry, _Failed):
                raise RuntimeError(f"inference failed: {entry.error}") from entry.error
            results.append(entry)
        return results

    def pipeline(self, items: Iterable[In]) -> Iterator[Out]:
        """Submits `items` as room allows and yields their results in order. `items` is drawn on the
        caller's thread while this stage works on the earlier ones, so a lazy iterable that prepares
        (tokenizes) each item overlaps that work with inference (`predict`, `bench`'s model-only phase)."""
        pending = iter(items)
        exhausted = False
        while True:
            while not exhausted and self.has_room():
                item = next(pending, _STOP)
                if item is _STOP:
                    exhausted = True
                    break
                self.submit(item)  # type: ignore[arg-type]
            if exhausted and self.in_flight == 0:
                return
            yield from self.collect(timeout_s=1.0)

    def call(self, work: Callable[[], R]) -> Future[R]:
        """Runs `work` on the inference thread after everything submitted before it; thread-safe.

        Its result (or exception) goes to the returned future, never to `collect()`; it does not count
        against `max_queued_windows` (the caller bounds its own calls). A call still queued at `close()`
        is cancelled."""
        future: Future[R] = Future()
        with self._lock:
            if self._closed:
                future.cancel()
            else:
                self._inbox.put(_Call(work, future))
        return future

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops the thread once it has done what was queued before (calls made later are cancelled)."""
        with self._lock:
            self._closed = True
            self._inbox.put(_STOP)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("inference thread still busy after %.0f s; leaving it (daemon)", timeout_s)

    def _run(self) -> None:
        while True:
            item = self._inbox.get()
            if item is _STOP:
                self._cancel_queued_calls()
                return
            if isinstance(item, _Call):
                if item.future.set_running_or_notify_cancel():
                    try:
                        item.future.set_result(item.work())
                    except BaseException as exc:  # noqa: BLE001 - the caller's future carries it
                        item.future.set_exception(exc)
                continue
            assert isinstance(item, _Begun)
            try:
                result: Out | _Failed = item.finish()
            except BaseException as exc:  # noqa: BLE001 - handed to the poll loop, which stops the worker
                log.error("inference thread failed", exc_info=True)
                result = _Failed(exc)
            with self._finished:
                self._done.append(result)
                self._finished.notify_all()

    def _cancel_queued_calls(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Call):
                item.future.cancel()


def _raising(error: BaseException) -> Callable[[], Any]:
    def finish() -> Any:
        raise error

    return finish
