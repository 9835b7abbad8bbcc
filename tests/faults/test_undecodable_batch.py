"""A record batch the consumer cannot decompress does not wedge its partition (real broker of its own).

The bomb is a real produced record batch: three values of 50 MB of zeros, compressed with zstd into a few KB
in one batch (the broker accepts it: its compressed size is far below max.message.bytes). It decompresses to
150 MB, past the consumer's receive.message.max.bytes (the worker's receive_message_max_bytes, 64 MiB by
default, and librdkafka's own 100 MB default before), so librdkafka refuses it on every fetch ("Decompression
... failed: Local: Invalid compressed data"). Good reviews come before and after it on the same partition.

The worker retries the batch, finds where it ends, dead-letters each of its offsets (kind undecodable_batch,
no key and no value, the coordinates in headers) and labels the reviews after it; /readyz and
sentiment_partition_stalled_seconds say so while the partition is held. Every offset yields exactly one
record, in both delivery modes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from schemas.dead_letter import DeadLetterKind, parse_dead_letter_headers
from schemas.sentiment_result import ModelRef
from tests.faults.harness import PrivateBroker, broker_up, make_topics
from tests.integration.helpers import RunningWorker, make_settings, sample_reviews
from tests.integration.kafka_io import committed_offsets, produce, read_topic, results_of, review_records
from tests.labellers import labeller_for
from tests.polling import wait_until
from worker.kafka.app import SentimentWorker
from worker.model.device import choose_device
from worker.model.loading import load_classifier

pytestmark = pytest.mark.integration

BOMB_VALUES, BOMB_VALUE_BYTES = 3, 50_000_000  # 150 MB once decompressed
BEFORE, AFTER = 5, 6
RETRIES = 12  # fetched ~0.5 s apart: long enough to see /readyz and the stalled gauge say so


@pytest.fixture(scope="module")
def bomb_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateBroker]:
    with broker_up(tmp_path_factory.mktemp("bomb-broker")) as broker:
        yield broker


@pytest.fixture(scope="module")
def tiny_classifier(tiny_model_dir: Path) -> Any:
    return load_classifier(str(tiny_model_dir), choose_device("cpu"))


def produce_zstd_bomb(bootstrap: str, topic: str) -> list[int]:
    """One zstd record batch of `BOMB_VALUES` values of `BOMB_VALUE_BYTES` zeros each; their offsets."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": "zstd",
            # One batch for all of them: room for their uncompressed size, and time to gather them.
            "message.max.bytes": 1_000_000_000,
            "batch.size": 1_000_000_000,
            "batch.num.messages": BOMB_VALUES,
            "linger.ms": 5000,
        }
    )
    offsets: list[int] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        errors.append(err) if err is not None else offsets.append(msg.offset())

    for _ in range(BOMB_VALUES):
        producer.produce(topic, value=b"\0" * BOMB_VALUE_BYTES, partition=0, on_delivery=on_delivery)
    assert producer.flush(60) == 0 and not errors, errors
    return sorted(offsets)


def _stalled(worker: SentimentWorker, topic: str) -> float:
    labels = {"topic": topic, "partition": "0"}
    return worker.registry.get_sample_value("sentiment_partition_stalled_seconds", labels) or 0.0


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_a_zstd_bomb_is_dead_lettered_and_its_partition_moves_on(
    delivery: str, bomb_broker: PrivateBroker, tiny_classifier: Any
) -> None:
    bootstrap = bomb_broker.bootstrap
    suffix = uuid.uuid4().hex[:8]
    names = {k: f"bomb-{k}-{suffix}" for k in ("reviews", "results", "dlq", "group")}
    make_topics(bootstrap, {names["reviews"]: 1, names["results"]: 1, names["dlq"]: 1}, dlq=names["dlq"])
    reviews = sample_reviews(BEFORE + AFTER)
    produce(bootstrap, names["reviews"], review_records(reviews[:BEFORE]), partition=0)
    bomb = produce_zstd_bomb(bootstrap, names["reviews"])
    produce(bootstrap, names["reviews"], review_records(reviews[BEFORE:]), partition=0)
    assert bomb == list(range(BEFORE, BEFORE + BOMB_VALUES))
    settings = make_settings(
        bootstrap, names, delivery=delivery, undecodable_batch_retries=RETRIES, max_window_messages=4
    )
    running = RunningWorker(
        SentimentWorker(
            settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
        )
    )
    worker = running.worker
    try:
        # Meanwhile: not ready, the partition named with the batch's offset, and its stalled seconds grow.
        checks = wait_until(
            lambda: worker.health.readiness()[1].get("undecodable_batches") or not running.thread.is_alive(),
            120,
            "/readyz to name the partition held by the batch",
        )
        assert running.thread.is_alive(), running.outcome
        assert list(checks) == [f"{names['reviews']}[0]"] and f"offset {BEFORE}:" in str(checks), checks
        assert worker.health.readiness()[0] is False
        wait_until(lambda: _stalled(worker, names["reviews"]) > 0, 60, "the stalled gauge to rise")
        results = read_topic(bootstrap, names["results"], expected=BEFORE + AFTER, timeout_s=120)
        dead = read_topic(bootstrap, names["dlq"], expected=BOMB_VALUES, timeout_s=60)
        end = BEFORE + BOMB_VALUES + AFTER
        wait_until(
            lambda: committed_offsets(bootstrap, names["group"], names["reviews"], 1) == {0: end},
            60,
            "every offset committed",
        )
        wait_until(lambda: worker.health.readiness()[0], 60, "ready again once the partition moved on")
        assert running.thread.is_alive(), running.outcome
    finally:
        running.stop()
    assert running.outcome and not isinstance(running.outcome[0], BaseException), running.outcome
    # Every offset exactly one record: the good reviews labelled in order, the batch's offsets dead letters.
    labelled = results_of(results)
    assert [r["id"] for r in labelled] == [r["id"] for r in reviews]
    assert [r["source"]["offset"] for r in labelled] == [*range(BEFORE), *range(BEFORE + BOMB_VALUES, end)]
    infos = [parse_dead_letter_headers(m.headers()) for m in dead]
    assert [info.source_offset for info in infos] == bomb
    assert {(info.kind, info.source_topic, info.source_partition) for info in infos} == {
        (DeadLetterKind.UNDECODABLE_BATCH, names["reviews"], 0)
    }
    assert {(m.key(), m.value()) for m in dead} == {(None, None)}
    assert "Decompression" in infos[0].reason and "RECEIVE_MESSAGE_MAX_BYTES" in infos[0].reason
    summary = running.outcome[0]
    assert (summary.consumed, summary.results, summary.dead_letters) == (end, BEFORE + AFTER, BOMB_VALUES)
    assert json.dumps(summary.dead_letters_by_kind) == json.dumps({"undecodable_batch": BOMB_VALUES})
