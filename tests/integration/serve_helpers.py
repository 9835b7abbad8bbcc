"""Helpers of the HTTP API tests: a real `SentimentApi` (uvicorn on a free port) in a thread, a slowed
model for overload and timeouts, and /metrics parsing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from schemas.sentiment_result import ModelRef
from tests.labellers import labeller_for
from worker.config import WorkerSettings
from worker.http.serving import SentimentApi
from worker.labelling.control import ModelControl
from worker.labelling.labeller import Labeller


@dataclass(frozen=True)
class Served:
    url: str
    registry: CollectorRegistry
    service: SentimentApi


@contextmanager
def serving(
    classifier: Any, *, models: tuple[Labeller, ModelControl | None] | None = None, **settings: Any
) -> Iterator[Served]:
    """`serve` in this process on 127.0.0.1 and a free port, ready; stopped (drained) on exit. `models`: a
    Labeller and its model control as `models_for` builds them (then `classifier` is not used)."""
    values: dict[str, Any] = {"http_port": 0, "worker_id": "test-serve", **settings}
    stop = threading.Event()
    registry = CollectorRegistry()
    listening: list[tuple[str, int]] = []
    labeller, control = models or (
        labeller_for(
            classifier, WorkerSettings(**values), ModelRef(name=classifier.name, version=classifier.version)
        ),
        None,
    )
    service = SentimentApi(
        WorkerSettings(**values).sections,
        labeller,
        registry=registry,
        stop=stop,
        on_listening=listening.append,
        control=control,
    )
    failed: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)

    thread = threading.Thread(target=run, name="serve-under-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not listening and not failed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert listening, f"serve did not listen: {failed}"
    url = f"http://{listening[0][0]}:{listening[0][1]}"
    while httpx.get(url + "/readyz").status_code != 200:
        assert time.monotonic() < deadline and not failed, f"serve never became ready: {failed}"
        time.sleep(0.05)
    try:
        yield Served(url, registry, service)
    finally:
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), "serve did not stop"
        assert not failed, failed


class SlowClassifier:
    """The tiny model, `delay_s` slower per model call: an overloaded or stuck server on demand."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self._inner = inner
        self.delay_s = delay_s
        self.labels = inner.labels
        self.name, self.version = inner.name, inner.version
        self.call_overhead_tokens = inner.call_overhead_tokens
        self.parallel_calls = 1  # the delays add up, one call at a time

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return list(self._inner.token_ids(texts))

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        time.sleep(self.delay_s)
        return np.asarray(self._inner.predict_ids(batch))


def scrape(url: str) -> dict[str, float]:
    """/metrics as {name{labels}: value}."""
    text = httpx.get(url + "/metrics").text
    return {
        sample.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())) + "}": sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
