"""The poll loop on a fake GPU: a backlog fills windows, and batches, far bigger than the CPU's 256 messages
and 32 reviews (bounded by the token budget), with every input published once, in order; on CPU the
windows and batches keep their measured sizes."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest

from schemas.sentiment_result import ModelRef
from tests.labellers import labeller_for
from tests.unit.kafka.fake_kafka import FakePublisher, fake_clients
from worker.config import WorkerSettings
from worker.kafka.app import SentimentWorker
from worker.model.device import DeviceChoice

TOPIC, RESULTS, DLQ = "reviews", "results", "dlq"
MODEL = ModelRef(name="fake", version="1")


class FakeDeviceClassifier:
    """Tokens = one per character + 2; 'probability positive' = characters / 100, so a result can be matched
    to its text. Records the sequence lengths of each model call."""

    labels = ["negative", "positive"]
    call_overhead_tokens = None
    parallel_calls = 1

    def __init__(self, kind: str) -> None:
        self.device = DeviceChoice(kind, f"{kind}:0" if kind == "gpu" else "cpu", "test", f"Fake {kind}")  # type: ignore[arg-type]
        self.batches: list[list[int]] = []

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [[1, *([7] * len(text)), 2] for text in texts]

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        self.batches.append([len(row) for row in batch])
        p = np.array([(len(row) - 2) / 100 for row in batch], dtype=np.float32)
        return np.stack([1 - p, p], axis=1)


def backlog(partitions: int = 2, per_partition: int = 1000) -> dict[int, list[bytes | None]]:
    """Reviews of 46 to 54 characters (~50 tokens), whose id names their partition and offset."""
    return {
        p: [
            json.dumps({"id": f"{p}-{offset}", "text": "好" * (46 + offset % 9)}).encode()
            for offset in range(per_partition)
        ]
        for p in range(partitions)
    }


def run(classifier: FakeDeviceClassifier, **extra: object) -> FakePublisher:
    """The worker drains the 2,000-review backlog with the window and batch sizes left at their defaults."""
    values: dict[str, object] = {
        "input_topic": TOPIC,
        "output_topic": RESULTS,
        "dlq_topic": DLQ,
        "http_port": 0,
        "shutdown_timeout_s": 5,
        **extra,
    }
    publisher = FakePublisher()
    clients, _ = fake_clients(TOPIC, backlog(), publisher)
    worker = SentimentWorker(
        WorkerSettings(**values).sections,
        labeller_for(classifier, WorkerSettings(**values), MODEL),
        clients=clients,
    )  # type: ignore[arg-type]
    summary = worker.run(max_messages=2000, idle_exit_s=5)
    assert (summary.consumed, summary.results, summary.dead_letters) == (2000, 2000, 0)
    offsets: dict[int, list[int]] = {}
    for record in publisher.results(RESULTS):
        body = json.loads(record.value or b"")
        assert body["id"] == f"{record.source.partition}-{record.source.offset}"
        positive = (46 + record.source.offset % 9) / 100  # its own label
        assert body["probabilities"]["positive"] == pytest.approx(positive, abs=1e-6)
        offsets.setdefault(record.source.partition, []).append(record.source.offset)
    assert offsets == {0: list(range(1000)), 1: list(range(1000))}  # one each, in input order
    return publisher


def test_on_a_gpu_a_backlog_fills_windows_and_batches_to_the_token_budget() -> None:
    gpu = FakeDeviceClassifier("gpu")
    run(gpu, max_batch_tokens=65_536)  # a number that is set: not calibrated
    batch_sizes = [len(b) for b in gpu.batches[1:]]  # after the warm-up's
    assert all(len(b) * max(b) <= 65_536 for b in gpu.batches)  # bounded by tokens
    # The first windows have the configured 256 messages; once the engine has seen ~50 tokens a review, a
    # window grows to fill a 65,536-token batch (~1,260 reviews): far more than 256 in one batch.
    assert max(batch_sizes) > 1000
    assert sum(batch_sizes) == 2000


def test_on_cpu_windows_and_batches_keep_their_sizes() -> None:
    cpu = FakeDeviceClassifier("cpu")
    run(cpu)
    batch_sizes = [len(b) for b in cpu.batches[1:]]
    assert max(batch_sizes) == 32 and all(len(b) * max(b) <= 4096 for b in cpu.batches)
    assert sum(batch_sizes) == 2000
