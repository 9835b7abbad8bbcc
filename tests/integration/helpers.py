"""Helpers shared by the worker's integration tests."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

from schemas.sentiment_result import ModelRef
from tests.integration.kafka_io import produce, review_records
from tests.labellers import labeller_for
from worker.config import WorkerSettings
from worker.kafka.app import SentimentWorker

SAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "samples" / "reviews.jsonl"


def sample_reviews(n: int) -> list[dict[str, Any]]:
    base = [json.loads(line) for line in SAMPLES.read_text(encoding="utf-8").splitlines() if line.strip()]
    out = []
    for i in range(n):
        row = dict(base[i % len(base)])
        row["id"] = f"r-{i:04d}"
        row["seq"] = i
        out.append(row)
    return out


def produce_samples(
    bootstrap: str, topic: str, n: int, *, partition: int | None = None
) -> list[dict[str, Any]]:
    """`sample_reviews(n)` produced to `topic` (keyed by id, in order, each acknowledged); returns them."""
    reviews = sample_reviews(n)
    produce(bootstrap, topic, review_records(reviews), partition=partition)
    return reviews


def make_settings(bootstrap: str, names: dict[str, str], **extra: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "input_topic": names["reviews"],
        "output_topic": names["results"],
        "dlq_topic": names["dlq"],
        "group_id": names["group"],
        "http_port": 0,
        "max_wait_ms": 20,
        "worker_id": "test-worker",
    }
    return WorkerSettings(**{**values, **extra})


def run_worker(settings: WorkerSettings, classifier: Any, **kwargs: Any) -> Any:
    worker = SentimentWorker(
        settings.sections,
        labeller_for(classifier, settings, ModelRef(name=classifier.name, version=classifier.version)),
    )
    return worker.run(**kwargs)


def assert_partition_order(messages: list[Any]) -> None:
    """Within each input partition, outputs appear in input offset order."""
    by_source: dict[tuple[str, int], list[int]] = defaultdict(list)
    for m in messages:
        src = json.loads(m.value())["source"]
        by_source[(src["topic"], src["partition"])].append(src["offset"])
    for key, offsets in by_source.items():
        assert offsets == sorted(offsets), f"results of {key} out of input order"


def cli_env(bootstrap: str, names: dict[str, str], model_dir: Path, **extra: str) -> dict[str, str]:
    """The SENTIMENT_* settings of a `sentiment-worker` command on the test's topics and group: CPU, no HTTP
    port; `extra` adds or overrides."""
    return {
        "SENTIMENT_BOOTSTRAP_SERVERS": bootstrap,
        "SENTIMENT_INPUT_TOPIC": names["reviews"],
        "SENTIMENT_OUTPUT_TOPIC": names["results"],
        "SENTIMENT_DLQ_TOPIC": names["dlq"],
        "SENTIMENT_GROUP_ID": names["group"],
        "SENTIMENT_MODEL": str(model_dir),
        "SENTIMENT_DEVICE": "cpu",
        "SENTIMENT_HTTP_PORT": "0",
        **extra,
    }


def worker_env(bootstrap: str, names: dict[str, str], model_dir: Path, **extra: str) -> dict[str, str]:
    """Environment of a `python -m worker run` process: the test's topics and group, CPU, no HTTP port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTIMENT_")}
    defaults = {
        "SENTIMENT_MAX_WINDOW_MESSAGES": "32",
        "SENTIMENT_MAX_WAIT_MS": "20",
        # Several processes share two cores: one math thread each keeps them from thrashing.
        "OMP_NUM_THREADS": "1",
    }
    env.update(cli_env(bootstrap, names, model_dir, **{**defaults, **extra}))
    return env


class RunningWorker:
    """A SentimentWorker in a thread; keeps what `run` returned or raised."""

    def __init__(self, worker: SentimentWorker) -> None:
        self.worker = worker
        self.outcome: list[Any] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.outcome.append(self.worker.run())
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            self.outcome.append(exc)

    def stop(self) -> None:
        self.worker.request_stop()
        self.thread.join(60)


def http_get(url: str) -> tuple[int, str]:
    """(status, body) of a GET, an error status's too; (0, "") when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""
