"""A real Prometheus server (Debian's `prometheus`, installed by `make prometheus-tools`) scrapes a real
worker on loopback, loads the repository's alert rules, and answers the lag, throughput and model series
through its HTTP API as the dashboard and the alerts read them.

The backlog is held back deterministically: it is written in a transaction left open, so the high watermark
counts it while a read_committed consumer cannot fetch it yet; committing the transaction lets it drain."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from schemas.sentiment_result import ModelRef
from tests.integration.helpers import make_settings, sample_reviews
from tests.integration.kafka_io import read_topic, results_of
from tests.labellers import labeller_for
from tests.polling import wait_until
from worker.bench.worker_process import free_port
from worker.kafka.app import SentimentWorker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy/prometheus/alerts.yml"
PER_PARTITION = 30
DEADLINE_S = 60.0


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[int], str]]:
    """Starts Prometheus scraping 127.0.0.1:<port> every second; returns its base URL."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        pytest.fail(
            "the prometheus server is missing: `make prometheus-tools` installs it (Debian's package)"
        )
    processes: list[subprocess.Popen[bytes]] = []

    def start(worker_port: int) -> str:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {
                    "job_name": "sentiment-worker",
                    "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        port = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        processes.append(
            subprocess.Popen(
                [
                    binary,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        url = f"http://127.0.0.1:{port}"
        _wait_for(lambda: _get(f"{url}/-/ready") is not None, "Prometheus ready")
        return url

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bytes(response.read())
    except (urllib.error.URLError, OSError):
        return None


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    """Instant query through /api/v1/query: the result vector."""
    body = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert body is not None, f"Prometheus did not answer {promql}"
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def _value(base: str, promql: str) -> float | None:
    result = _query(base, promql)
    return float(result[0]["value"][1]) if result else None


def _wait_for(condition: Callable[[], Any], what: str, timeout_s: float = DEADLINE_S) -> Any:
    return wait_until(condition, timeout_s, what, interval_s=0.2)


def test_prometheus_scrapes_the_worker_and_answers_lag_throughput_and_model_series(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any, prometheus: Callable[[int], str]
) -> None:
    names = topics(input_partitions=3)
    port = free_port()
    settings = make_settings(kafka_bootstrap, names, http_port=port)
    worker = SentimentWorker(
        settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="7"))
    )
    thread = threading.Thread(target=worker.run, kwargs={"idle_exit_s": 120})
    thread.start()
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": names["group"] + "-tx"})
    try:
        base = prometheus(port)
        job = '{job="sentiment-worker"}'
        _wait_for(lambda: _value(base, f"up{job}") == 1, "the worker scraped (up == 1)")
        # The repository's alert rules load and evaluate in the real server.
        rules = json.loads(_get(f"{base}/api/v1/rules") or b"{}")["data"]["groups"]
        loaded = {r["name"]: r["health"] for g in rules for r in g["rules"]}
        defined = {
            rule["alert"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
        }
        assert set(loaded) == defined and set(loaded.values()) <= {"ok", "unknown"}, loaded
        partitions = _wait_for(
            lambda: (
                _query(base, f"sentiment_consumer_lag_messages{job}")
                if len(_query(base, f"sentiment_consumer_lag_messages{job}")) == 3
                else None
            ),
            "a lag series per partition",
        )
        assert {r["metric"]["partition"] for r in partitions} == {"0", "1", "2"}

        # A backlog the worker cannot fetch yet: 30 reviews per partition in an open transaction.
        reviews = sample_reviews(3 * PER_PARTITION)
        producer.init_transactions(30)
        producer.begin_transaction()
        for i, review in enumerate(reviews):
            producer.produce(
                names["reviews"], json.dumps(review, ensure_ascii=False).encode(), partition=i % 3
            )
        producer.flush(30)
        lag = _wait_for(
            lambda: _value(base, f"sum(sentiment_consumer_lag_messages{job})") == 3 * PER_PARTITION,
            "Prometheus reading the held-back backlog as lag",
        )
        assert lag
        per_partition = {
            r["metric"]["partition"]: float(r["value"][1])
            for r in _query(base, f"sentiment_consumer_lag_messages{job}")
        }
        assert per_partition == {"0": 30.0, "1": 30.0, "2": 30.0}

        producer.commit_transaction(30)
        results = results_of(read_topic(kafka_bootstrap, names["results"], expected=len(reviews)))
        assert len(results) == len(reviews)
        _wait_for(
            lambda: _value(base, f"sum(sentiment_results_published_total{job})") == len(reviews),
            "every result counted in Prometheus",
        )
        # The results series existed at 0 before the first result, so rate() sees all of them.
        _wait_for(
            lambda: (_value(base, f"sum(increase(sentiment_results_published_total{job}[1m]))") or 0) > 0,
            "a throughput in Prometheus",
        )
        # The commit marker stays behind a read_committed consumer's position: at most 1 per partition.
        _wait_for(
            lambda: (_value(base, f"sum(sentiment_consumer_lag_messages{job})") or 0) <= 3,
            "the lag drained",
        )

        # Model monitoring: the counts by label and under the threshold are those of the published results.
        by_label = Counter(r["label"] for r in results)
        low = sum(1 for r in results if r["confidence"] < settings.low_confidence)
        counted = {
            (r["metric"]["label"], r["metric"]["model_version"]): float(r["value"][1])
            for r in _query(base, f"sentiment_predictions_total{job}")
        }
        assert counted == {(label, "7"): float(by_label.get(label, 0)) for label in tiny_classifier.labels}
        assert _value(base, f"sum(sentiment_low_confidence_predictions_total{job})") == low
        assert _value(base, f"sum(sentiment_prediction_confidence_count{job})") == len(reviews)
        assert _value(base, f"sentiment_low_confidence_threshold{job}") == settings.low_confidence
    finally:
        worker.request_stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
