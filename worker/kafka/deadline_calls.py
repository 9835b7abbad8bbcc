"""Client calls that may block past their own timeout, made so that the caller stops waiting at a deadline.

librdkafka's transaction calls take a timeout, but not every one keeps it: `send_offsets_to_transaction`
waits for its broker's answer for ever while the broker is away (measured: still waiting 30 s into a 10 s
timeout, returning only once the broker was back; issue 50: over 5 minutes after a broker restart, signals
unanswered). A call here runs on a helper thread of its own; the calling thread waits in slices of
`SLICE_S`, so it gives up at the deadline, or earlier when `give_up()` says so (a stop whose time is up), and
runs Python between slices. A call given up on may still be running: the client it was made on must not be
used again (`CallAbandoned`); its thread is a daemon and never holds the process's exit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from worker.errors import OperationError

__all__ = ["SLICE_S", "CallAbandoned", "DeadlineCalls"]

T = TypeVar("T")
SLICE_S = 0.1


def _never() -> bool:
    return False


class CallAbandoned(OperationError):
    """A call did not return by its deadline (or was given up on for a stop); it may still be running, so
    the client it was made on is not to be used again."""


class DeadlineCalls:
    """Runs calls on helper threads named `name` and waits for each at most until its deadline; counts the
    calls given up on that have not returned since (`stuck`)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._abandoned: list[Future[Any]] = []

    @property
    def stuck(self) -> int:
        """Calls given up on that are still running."""
        self._abandoned = [future for future in self._abandoned if not future.done()]
        return len(self._abandoned)

    def call(
        self,
        fn: Callable[..., T],
        *args: Any,
        timeout_s: float,
        what: str,
        give_up: Callable[[], bool] = _never,
        on_wait: Callable[[float], None] | None = None,
    ) -> T:
        """`fn(*args)`'s result or exception, or CallAbandoned once `timeout_s` passed (or `give_up()` turned
        true) without it. `on_wait(seconds)` is called between slices while it waits."""
        future: Future[T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                future.set_exception(exc)

        threading.Thread(target=run, name=self._name, daemon=True).start()
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or give_up():
                break
            try:
                return future.result(timeout=min(SLICE_S, left))
            except FutureTimeout:
                if on_wait is not None:
                    on_wait(time.monotonic() - started)
        if future.done():
            return future.result()
        self._abandoned.append(future)
        waited = time.monotonic() - started
        raise CallAbandoned(f"{what} did not return within {waited:.1f} s")
