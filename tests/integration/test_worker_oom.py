"""The README's "the worker never dies of OOM", at worker level against the real broker: the real tiny
model wrapped so that every batch holding a marked review raises the error Paddle itself raises when an
allocation fails (`MemoryError`, "(ResourceExhausted) ..."). Those reviews become `too_long_for_memory`
dead letters, the budget is lowered, everything else is labelled, and the stream goes on."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from schemas import DeadLetterKind
from schemas.sentiment_result import ModelRef
from tests.integration.helpers import make_settings, sample_reviews
from tests.integration.kafka_io import committed_offsets, produce, read_topic, review_records
from tests.labellers import labeller_for
from tests.model_wrappers import OOM_MARKER, OutOfMemoryOn
from tests.polling import wait_until
from worker.kafka.app import SentimentWorker

pytestmark = pytest.mark.integration
WINDOW = 8


def test_out_of_memory_window_becomes_dead_letters_and_the_stream_goes_on(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics(input_partitions=1, output_partitions=1)
    reviews = sample_reviews(3 * WINDOW)
    for row in reviews[WINDOW : 2 * WINDOW]:  # the middle window runs out of memory, review by review
        row["text"] = f"{OOM_MARKER}{row['text']}"
    oom_ids = {r["id"] for r in reviews[WINDOW : 2 * WINDOW]}
    model = OutOfMemoryOn(tiny_classifier)
    settings = make_settings(kafka_bootstrap, names, max_window_messages=WINDOW, max_batch_tokens=4096)
    registry = CollectorRegistry()
    worker = SentimentWorker(
        settings.sections,
        labeller_for(model, settings, ModelRef(name="tiny", version="1")),
        registry=registry,
    )
    summaries: list[Any] = []
    thread = threading.Thread(target=lambda: summaries.append(worker.run()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: worker.health.readiness()[0] or not thread.is_alive(), 60, "the worker ready")
        produce(kafka_bootstrap, names["reviews"], review_records(reviews[: 2 * WINDOW]), partition=0)
        dead = read_topic(kafka_bootstrap, names["dlq"], expected=WINDOW, settle_s=0)
        assert thread.is_alive(), "the worker died of the out-of-memory errors"
        # The stream goes on: reviews produced after the out-of-memory window are labelled.
        produce(kafka_bootstrap, names["reviews"], review_records(reviews[2 * WINDOW :]), partition=0)
        results = read_topic(kafka_bootstrap, names["results"], expected=2 * WINDOW)
        wait_until(
            lambda: committed_offsets(kafka_bootstrap, names["group"], names["reviews"], 1)[0] == 3 * WINDOW,
            30,
            "every offset committed",
        )
        assert thread.is_alive()
    finally:
        worker.request_stop()
        thread.join(60)
    assert not thread.is_alive() and summaries, "the worker did not stop cleanly"

    assert model.raised >= WINDOW  # a batch of the window, its halves, ..., each marked review alone
    by_key = {m.key().decode(): dict(m.headers() or []) for m in dead}
    assert set(by_key) == oom_ids
    for headers in by_key.values():
        assert headers["sentiment.error.kind"] == DeadLetterKind.TOO_LONG_FOR_MEMORY.value.encode()
        assert b"MemoryError" in headers["sentiment.error.reason"]
        assert b"ResourceExhausted" in headers["sentiment.error.reason"]
    labelled = [json.loads(m.value())["id"] for m in results]
    assert sorted(labelled) == sorted(r["id"] for r in reviews if r["id"] not in oom_ids)
    summary = summaries[0]
    assert (summary.results, summary.dead_letters) == (2 * WINDOW, WINDOW)
    assert summary.dead_letters_by_kind == {DeadLetterKind.TOO_LONG_FOR_MEMORY.value: WINDOW}
    assert (registry.get_sample_value("sentiment_out_of_memory_events_total") or 0) >= WINDOW
