"""The Kafka worker with `http_api`: it answers POST /v1/sentiment on its HTTP port while it consumes, with
the same model and the same inference thread (one model copy)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from schemas.sentiment_result import ModelRef
from tests.integration.helpers import make_settings, sample_reviews
from tests.integration.kafka_io import produce, read_topic, results_of, review_records
from tests.integration.serve_helpers import SlowClassifier
from tests.labellers import labeller_for
from worker.bench.worker_process import free_port
from worker.files.predict import predict_lines
from worker.http.serving import WorkerApi
from worker.kafka.app import SentimentWorker
from worker.labelling.labeller import Labeller

pytestmark = pytest.mark.integration


class CountingClassifier(SlowClassifier):
    """The tiny model, counting the threads that call it (one inference thread for both paths)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner, delay_s=0.0)
        self.threads: set[str] = set()
        self.calls = 0

    def predict_ids(self, batch: Any) -> Any:
        self.threads.add(threading.current_thread().name)
        self.calls += 1
        return super().predict_ids(batch)


def test_the_worker_serves_the_api_while_it_consumes(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics()
    reviews = sample_reviews(60)
    model = CountingClassifier(tiny_classifier)
    settings = make_settings(
        kafka_bootstrap,
        names,
        http_api=True,
        http_port=free_port(),
        max_window_messages=16,
        http_max_wait_ms=50,
        max_batch_size=8,
    )
    stop = threading.Event()
    worker = SentimentWorker(
        settings.sections,
        labeller_for(model, settings, ModelRef(name=model.name, version=model.version)),
        registry=CollectorRegistry(),
        stop=stop,
        api=WorkerApi(),
    )
    summary: list[Any] = []
    # No max_messages: a worker that stops at its 60th input closes its HTTP port with it, and the checks
    # below would race it. The test stops the worker once it has read the results, the page and the metrics.
    thread = threading.Thread(target=lambda: summary.append(worker.run()))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while worker.http_address is None:
            assert time.monotonic() < deadline and thread.is_alive(), "the worker did not start"
            time.sleep(0.05)
        url = "http://{}:{}".format(*worker.http_address)
        while httpx.get(url + "/readyz").status_code != 200:  # warm, partitions assigned
            assert time.monotonic() < deadline and thread.is_alive(), "the worker did not become ready"
            time.sleep(0.1)
        model.threads.clear()  # the warm-up ran on the starting thread
        texts = [r["text"] for r in reviews[:12]]

        async def ask() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                return list(
                    await asyncio.gather(*(client.post("/v1/sentiment", json={"text": t}) for t in texts))
                )

        produce(kafka_bootstrap, names["reviews"], review_records(reviews))
        responses = asyncio.run(ask())  # while the worker labels the topic
        out = results_of(read_topic(kafka_bootstrap, names["results"], expected=60))
        metrics = httpx.get(url + "/metrics").text
        page = httpx.get(url + "/")
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive(), "the worker did not stop within 60 s of its stop event"
    assert [r.status_code for r in responses] == [200] * len(texts)
    expected = [row["label"] for row in predict_lines(Labeller.of(tiny_classifier), texts)]
    assert [r.json()["results"][0]["label"] for r in responses] == expected
    assert summary and (summary[0].results, summary[0].dead_letters) == (60, 0)
    assert sorted(r["id"] for r in out) == sorted(r["id"] for r in reviews)
    assert {name.split("_")[0] for name in model.threads} == {"engine-lane"}  # both paths: the one engine
    assert page.status_code == 200 and "v1/sentiment" in page.text
    assert 'sentiment_http_requests_total{code="200"} 12.0' in metrics
    assert "sentiment_consumer_lag_messages" in metrics  # the worker's own metrics on the same port
