"""HTTP requests into the worker's own batching: concurrent requests are gathered into a window (the same
`ConsumeWindow` the poll loop uses), tokenized off the model's thread, and labelled on the inference thread
by `label_ids` (the one token-budget, length-grouped batch planner), then each request gets its slice.

    handler ─ submit(texts) ─► pending (bounded: Overloaded) ─► window ─► tokenize ─► InferenceStage.call
       ▲                                                                               │ label_ids
       └──────────────── Future[RequestOutcome], one per request, in its text order ◄──┘

When to label: when the model has no request batch in flight, once the window's first request has waited
`max_wait_ms` (0: at once) or the window is full; while a batch is in flight, requests gather until it is
done (the next batch holds everything that arrived meanwhile, as continuous batching does), and a window
that already holds `max_batch_size` texts is tokenized and queued early (at most `max_in_flight` batches
queued on the inference thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.inference.consume_window import ConsumeWindow
from worker.inference.labelling import (
    Classifier,
    InferenceFailure,
    TokenBudget,
    label_ids,
    merge_sequences,
    sequences_for,
)
from worker.inference.stage import InferenceStage
from worker.metrics import HttpMetrics, WorkerMetrics

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.1


class Overloaded(Exception):
    """The request would pass `max_queued_texts`: answer 503 and ask the client to retry later."""

    def __init__(self, queued_texts: int, retry_after_s: int) -> None:
        super().__init__(
            f"{queued_texts} texts are already waiting for the model; retry in {retry_after_s} s"
        )
        self.retry_after_s = retry_after_s


class BatcherClosed(Exception):
    """The batcher is stopping (or stopped): it accepts nothing new."""


@dataclass(frozen=True)
class RequestOutcome:
    """One request's outputs (one per text, in its order) and where its time went."""

    outputs: list[np.ndarray | InferenceFailure]
    queue_seconds: float
    inference_seconds: float
    batch_texts: int


@dataclass
class _Request:
    texts: Sequence[str]
    future: Future[RequestOutcome]
    accepted_at: float


@dataclass(frozen=True)
class _Batch:
    requests: list[_Request]
    token_ids: list[list[int]]
    chunk_counts: list[int] | None
    tokenize_seconds: float


class RequestBatcher:
    """Gathers concurrent requests into token-budget batches on the shared inference thread.

    `submit` is thread-safe and never blocks; `close` stops accepting and answers what was accepted.
    `budget` is the inference thread's token budget (shared with the Kafka windows when both run).
    `on_turn` is called on every turn of the gathering loop (serve's liveness).
    """

    def __init__(
        self,
        classifier: Classifier,
        stage: InferenceStage[Any, Any],
        budget: TokenBudget,
        *,
        max_batch_size: int,
        max_window_texts: int,
        max_wait_ms: float,
        max_queued_texts: int,
        metrics: WorkerMetrics,
        http_metrics: HttpMetrics,
        max_in_flight: int = 2,
        retry_after_s: int = 1,
        clock: Callable[[], float] = time.monotonic,
        on_turn: Callable[[], None] | None = None,
    ) -> None:
        self._classifier = classifier
        self._stage = stage
        self._budget = budget
        self._max_batch_size = max_batch_size
        self._max_queued_texts = max_queued_texts
        self._max_in_flight = max_in_flight
        self._retry_after_s = retry_after_s
        self._metrics = metrics
        self._http_metrics = http_metrics
        self._clock = clock
        self._on_turn = on_turn
        self._window: ConsumeWindow[_Request] = ConsumeWindow(
            max_messages=max_window_texts, max_wait_ms=max_wait_ms, max_tokens=max_window_texts, clock=clock
        )
        self._pending: deque[_Request] = deque()
        self._queued_texts = 0  # accepted and not yet answered (pending, in a window, or in inference)
        self._in_flight = 0  # batches handed to the inference thread and not yet labelled
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="http-batcher", daemon=True)
        self._thread.start()

    @property
    def queued_texts(self) -> int:
        return self._queued_texts

    @property
    def is_full(self) -> bool:
        """No request fits now (submit would raise Overloaded)."""
        return self._queued_texts >= self._max_queued_texts

    @property
    def retry_after_s(self) -> int:
        return self._retry_after_s

    @property
    def closing(self) -> bool:
        return self._closing

    def submit(self, texts: Sequence[str]) -> Future[RequestOutcome]:
        """Accepts one request's texts; its future gets one output per text, in order.

        Raises Overloaded when the accepted texts would pass `max_queued_texts`, BatcherClosed when
        stopping. Cancelling the future before its batch starts drops the request."""
        if not texts:
            raise ValueError("a request needs at least one text")
        request = _Request(texts, Future(), self._clock())
        with self._cond:
            if self._closing:
                raise BatcherClosed("the server is stopping")
            if self._queued_texts + len(texts) > self._max_queued_texts:
                raise Overloaded(self._queued_texts, self._retry_after_s)
            self._queued_texts += len(texts)
            self._pending.append(request)
            self._http_metrics.queued_texts.set(self._queued_texts)
            self._cond.notify_all()
        return request.future

    def close(self, timeout_s: float = 30.0) -> None:
        """Stops accepting; labels and answers every accepted request (within `timeout_s`), then returns.

        Requests still unanswered then get BatcherClosed."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("HTTP requests still unanswered after %.0f s of stopping", timeout_s)
        with self._cond:
            left = [*self._pending, *self._window.take()]
            self._pending.clear()
        for request in left:
            if request.future.set_running_or_notify_cancel():
                request.future.set_exception(BatcherClosed("the server stopped before labelling it"))

    # ----- the gathering thread -----
    def _run(self) -> None:
        while True:
            if self._on_turn is not None:
                self._on_turn()
            with self._cond:
                self._fill_window()
                if self._closing and not len(self._window) and not self._pending and not self._in_flight:
                    return
                if not self._is_due():
                    self._cond.wait(self._wait_s())
                    continue
                requests = self._take_window()
                if not requests:
                    continue
                self._in_flight += 1
            self._dispatch(requests)

    def _fill_window(self) -> None:
        while self._pending and self._window.fits(len(self._pending[0].texts)):
            request = self._pending.popleft()
            self._window.add(request, len(request.texts))

    def _is_due(self) -> bool:
        if not len(self._window) or self._in_flight >= self._max_in_flight:
            return False
        if self._in_flight == 0:
            return self._closing or self._window.is_due()
        # Pipelined: a window holding a full model batch cannot gain from waiting; it is tokenized and
        # queued while the model runs the previous one (so the model never waits for the HTTP side).
        return self._window.is_full() or self._window.tokens >= self._max_batch_size

    def _wait_s(self) -> float:
        if len(self._window) and self._in_flight == 0:
            return max(0.0005, self._window.remaining_wait_s())
        return _IDLE_WAIT_S  # woken by submit() and by a finished batch

    def _take_window(self) -> list[_Request]:
        """The window's requests still wanted (a request cancelled by its client is dropped here)."""
        taken = []
        for request in self._window.take():
            if request.future.set_running_or_notify_cancel():
                taken.append(request)
            else:
                self._answered(len(request.texts))
        return taken

    def _dispatch(self, requests: list[_Request]) -> None:
        """Tokenizes the window (on this thread, while the model runs the previous one) and queues it."""
        texts = [text for request in requests for text in request.texts]
        started = time.perf_counter()
        try:
            token_ids, counts = sequences_for(self._classifier, texts)
        except Exception as exc:  # noqa: BLE001 - a tokenizer failure fails these requests, not the server
            self._fail(requests, exc)
            return
        batch = _Batch(requests, token_ids, counts, time.perf_counter() - started)
        call = self._stage.call(lambda: self._label(batch))
        if call.cancelled():  # the inference thread is closed
            self._fail(requests, BatcherClosed("the inference thread stopped"))

    def _fail(self, requests: list[_Request], exc: BaseException) -> None:
        for request in requests:
            request.future.set_exception(exc)
        with self._cond:
            self._in_flight -= 1
            self._answered(sum(len(r.texts) for r in requests))
            self._cond.notify_all()

    # ----- on the inference thread -----
    def _label(self, batch: _Batch) -> None:
        """Labels one window of requests (the inference thread's work) and answers each request."""
        started = self._clock()
        try:
            outputs, stats = label_ids(
                self._classifier, batch.token_ids, max_batch_size=self._max_batch_size, budget=self._budget
            )
            merged = merge_sequences(outputs, batch.chunk_counts)
        except BaseException as exc:  # noqa: BLE001 - a bug in labelling fails these requests, not the server
            log.error("labelling an HTTP batch failed", exc_info=True)
            self._fail(batch.requests, exc)
            return
        stats.tokenize_seconds = batch.tokenize_seconds
        self._metrics.observe_window(stats, self._budget.current)
        inference_seconds = sum(b.seconds for b in stats.batches)
        position = 0
        for request in batch.requests:
            n = len(request.texts)
            request.future.set_result(
                RequestOutcome(
                    outputs=merged[position : position + n],
                    queue_seconds=max(0.0, started - request.accepted_at),
                    inference_seconds=inference_seconds,
                    batch_texts=len(merged),
                )
            )
            position += n
        with self._cond:
            self._in_flight -= 1
            self._answered(position)
            self._cond.notify_all()

    def _answered(self, n_texts: int) -> None:
        """Called with the lock held."""
        self._queued_texts -= n_texts
        self._http_metrics.queued_texts.set(self._queued_texts)
