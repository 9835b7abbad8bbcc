"""The lag gauges are true from the first second: a worker drains a backlog of old messages on 3 partitions
(one with far more than the others, so the fetcher serves the partitions unevenly), and every sample of
/metrics from readiness on agrees with the committed-offset view `sentiment-worker lag` reads, within the
in-flight window; no partition that holds unconsumed messages shows 0 messages or 0 seconds."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from schemas.sentiment_result import ModelRef
from tests.integration.helpers import make_settings
from tests.labellers import labeller_for
from worker.bench.worker_process import free_port
from worker.kafka.app import SentimentWorker
from worker.tools.lag import measure_lag

pytestmark = pytest.mark.integration

BACKLOG = {0: 200, 1: 2500, 2: 2500}
AGE_S = 600.0  # the first message of each partition was written ten minutes ago, the next ones 1 ms apart
YOUNGEST_S = AGE_S - max(BACKLOG.values()) / 1000  # the age of the last message of a partition at t=0
DEADLINE_S = 120.0


@dataclass(frozen=True)
class Sample:
    """One look: the committed view (read first), then the worker's gauges measured after it."""

    at_s: float
    committed_lag: dict[int, int]
    committed_lag_seconds: dict[int, float | None]
    gauge_lag: dict[int, float]
    gauge_seconds: dict[int, float]
    in_flight_window: int  # consumed by the worker, not committed when the view was read

    def line(self) -> str:
        cells = [
            f"p{p} gauge {self.gauge_lag[p]:>5.0f} msgs {self.gauge_seconds[p]:>6.1f} s"
            f" | committed view {self.committed_lag[p]:>5} msgs {_fmt_s(self.committed_lag_seconds[p])} s"
            for p in sorted(self.gauge_lag)
        ]
        return f"t={self.at_s:5.2f}s window {self.in_flight_window:>4}  " + "  ;  ".join(cells)


def _fmt_s(value: float | None) -> str:
    return "     -" if value is None else f"{value:>6.1f}"


def _produce_old_backlog(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    base_ms = int(time.time() * 1000 - AGE_S * 1000)
    for partition, count in BACKLOG.items():
        for i in range(count):
            value = json.dumps({"id": f"p{partition}-{i}", "text": "好"}).encode()
            producer.produce(topic, value=value, partition=partition, timestamp=base_ms + i)
            if i % 1000 == 0:
                producer.poll(0)
    assert producer.flush(30) == 0


def _scrape(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return {f.name: f for f in text_string_to_metric_families(response.read().decode())}


def _per_partition(families: dict[str, Any], name: str) -> dict[int, float]:
    family = families.get(name)
    return {} if family is None else {int(s.labels["partition"]): s.value for s in family.samples}


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _sample(conf: dict[str, Any], group: str, topic: str, url: str, started: float) -> Sample | None:
    """The committed view at t0, then a scrape whose gauges were measured after t0 (None: not yet)."""
    t0 = time.time()
    view = measure_lag(conf, group, topic)
    deadline = time.monotonic() + 10
    while True:
        families = _scrape(url)
        polled = families.get("sentiment_last_poll_timestamp_seconds")
        if polled is not None and polled.samples[0].value >= t0:
            break
        assert time.monotonic() < deadline, "the lag gauges were not refreshed within 10 s"
        time.sleep(0.05)
    lag, seconds = (
        _per_partition(families, "sentiment_consumer_lag_messages"),
        _per_partition(families, "sentiment_consumer_lag_seconds"),
    )
    consumed = sum(
        s.value for s in families["sentiment_messages_consumed"].samples if s.name.endswith("_total")
    )
    committed = sum(p.committed_offset or 0 for p in view.partitions)
    return Sample(
        at_s=t0 - started,
        committed_lag={p.partition: p.lag_messages for p in view.partitions},
        committed_lag_seconds={p.partition: p.lag_seconds for p in view.partitions},
        gauge_lag=lag,
        gauge_seconds=seconds,
        in_flight_window=int(consumed) - committed,
    )


def test_lag_gauges_agree_with_the_committed_view_from_readiness_on(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics(input_partitions=3)
    topic, group = names["reviews"], names["group"]
    _produce_old_backlog(kafka_bootstrap, topic)
    port = free_port()
    settings = make_settings(
        kafka_bootstrap, names, http_port=port, max_window_messages=32, commit_interval_ms=200
    )
    worker = SentimentWorker(
        settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
    )
    thread = threading.Thread(target=worker.run, kwargs={"idle_exit_s": 120})
    conf = {"bootstrap.servers": kafka_bootstrap}
    url = f"http://127.0.0.1:{port}/metrics"
    samples: list[Sample] = []
    thread.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not _ready(port):
            assert time.monotonic() < deadline, "the worker did not become ready"
            time.sleep(0.05)
        started = time.time()
        while True:
            assert time.monotonic() < deadline, "the backlog was not drained"
            sample = _sample(conf, group, topic, url, started)
            assert sample is not None
            samples.append(sample)
            drained = not any(sample.committed_lag.values()) and not any(sample.gauge_lag.values())
            if drained and sample.in_flight_window == 0:
                break
    finally:
        worker.request_stop()
        thread.join(timeout=60)
        print("\n" + "\n".join(s.line() for s in samples))
    assert not thread.is_alive()

    assert len(samples) >= 3
    for sample in samples:
        assert set(sample.gauge_lag) == set(sample.gauge_seconds) == {0, 1, 2}, sample.line()
        for p in range(3):
            # The gauge counts from this member's position, the view from the committed offset: the gauge
            # is never behind the view and at most the in-flight window ahead of it.
            ahead = sample.committed_lag[p] - sample.gauge_lag[p]
            assert 0 <= ahead <= sample.in_flight_window, sample.line()
            if sample.gauge_lag[p] > 0:
                # The message waited for is about ten minutes old, as the view says (up to the seconds
                # between): at least as old as the youngest message of the backlog.
                assert sample.gauge_seconds[p] >= YOUNGEST_S, sample.line()
                view_s = sample.committed_lag_seconds[p]
                assert view_s is not None and abs(sample.gauge_seconds[p] - view_s) <= 10, sample.line()
