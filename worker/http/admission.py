"""HTTP requests into the Labeller: each request's reviews are one submission that waits for a free model lane
(gathering the requests that arrive meanwhile into the same token-budget batches) and, while the model is
idle, at most `max_wait_ms` for company. This module only bounds what is accepted and turns the Labeller's
answer into the request's outcome; the batching is the engine's (the same queue the Kafka windows use).

    handler ─ submit(reviews) ─► bounded (Overloaded) ─► Labeller.label(reviews, gather_ms=max_wait_ms)
       ▲                                                              │
       └──────────── Future[RequestOutcome], one per request, in its text order ◄──┘
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from schemas.review_input import Review
from schemas.sentiment_result import ModelRef
from worker.errors import OperationError
from worker.inference.classifier import Output
from worker.inference.engine import EngineClosed
from worker.labelling.labeller import Labeller, Predictions
from worker.metrics import HttpMetrics

log = logging.getLogger(__name__)


class Overloaded(OperationError):
    """The request would pass `max_queued_texts`: answer 503 and ask the client to retry later."""

    def __init__(self, queued_texts: int, retry_after_s: int) -> None:
        super().__init__(
            f"{queued_texts} texts are already waiting for the model; retry in {retry_after_s} s"
        )
        self.retry_after_s = retry_after_s


class AdmissionClosed(OperationError):
    """The server is stopping (or stopped): it accepts nothing new."""


@dataclass(frozen=True)
class RequestOutcome:
    """One request's outputs (one per text, in its order), the model that made them, and where its time
    went."""

    outputs: list[Output]
    model: ModelRef | None
    queue_seconds: float
    labelling_seconds: float
    batch_texts: int


class RequestAdmission:
    """Admits requests to the Labeller while fewer than `max_queued_texts` texts wait for an answer.

    `submit` is thread-safe and never blocks; `close` stops accepting and waits until every accepted
    request is answered (the Labeller labels them)."""

    def __init__(
        self,
        labeller: Labeller,
        *,
        max_wait_ms: float,
        max_queued_texts: int,
        http_metrics: HttpMetrics,
        retry_after_s: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._labeller = labeller
        self._max_wait_ms = max_wait_ms
        self._max_queued_texts = max_queued_texts
        self._retry_after_s = retry_after_s
        self._http_metrics = http_metrics
        self._clock = clock
        self._queued_texts = 0  # accepted and not yet answered
        self._closing = False
        self._cond = threading.Condition()

    @property
    def model(self) -> ModelRef:
        """The Labeller's primary model."""
        return self._labeller.primary

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

    def submit(self, reviews: Sequence[Review]) -> Future[RequestOutcome]:
        """Accepts one request's reviews; its future gets one output per review, in order.

        Raises Overloaded when the accepted texts would pass `max_queued_texts`, AdmissionClosed when
        stopping. Cancelling the future before its texts are taken drops the request."""
        if not reviews:
            raise ValueError("a request needs at least one text")
        n = len(reviews)
        with self._cond:
            if self._closing:
                raise AdmissionClosed("the server is stopping")
            if self._queued_texts + n > self._max_queued_texts:
                raise Overloaded(self._queued_texts, self._retry_after_s)
            self._queued_texts += n
            self._http_metrics.queued_texts.set(self._queued_texts)
        try:
            labelling = self._labeller.label(reviews, gather_ms=self._max_wait_ms)
        except EngineClosed as exc:
            self._answered(n)
            raise AdmissionClosed(f"the server is stopping: {exc}") from exc
        outcome: Future[RequestOutcome] = Future()
        outcome.add_done_callback(lambda done: labelling.cancel() if done.cancelled() else None)
        labelling.add_done_callback(lambda done: self._answer(done, outcome, n))
        return outcome

    def close(self, timeout_s: float = 30.0) -> None:
        """Stops accepting; waits until every accepted request is answered (within `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._closing = True
            while self._queued_texts and time.monotonic() < deadline:
                self._cond.wait(max(0.001, deadline - time.monotonic()))
            if self._queued_texts:
                log.warning("HTTP requests still unanswered after %.0f s of stopping", timeout_s)

    def _answer(self, labelling: Future[Predictions], outcome: Future[RequestOutcome], n_texts: int) -> None:
        """On the engine's lane (or the canceller's thread): the request's outcome from the Labeller's."""
        self._answered(n_texts)
        if labelling.cancelled():
            outcome.cancel()
            return
        if not outcome.set_running_or_notify_cancel():
            return  # the client went away
        error = labelling.exception()
        if isinstance(error, EngineClosed):
            outcome.set_exception(AdmissionClosed(f"the server stopped before labelling it: {error}"))
        elif error is not None:
            outcome.set_exception(error)
        else:
            predictions = labelling.result()
            batches = predictions.stats.batches
            outcome.set_result(
                RequestOutcome(
                    outputs=predictions.outputs,
                    model=predictions.model,
                    queue_seconds=predictions.queued_seconds,
                    labelling_seconds=predictions.labelling_seconds,
                    batch_texts=sum(batch.size for batch in batches),
                )
            )

    def _answered(self, n_texts: int) -> None:
        with self._cond:
            self._queued_texts -= n_texts
            self._http_metrics.queued_texts.set(self._queued_texts)
            self._cond.notify_all()
