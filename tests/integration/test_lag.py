"""`sentiment-worker lag` against the real broker: offsets as the broker reports them, lag in seconds from
the first unconsumed message, owners from the group's description, and agreement with /metrics."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from schemas.sentiment_result import ModelRef
from tests.integration.helpers import make_settings, sample_reviews
from tests.integration.kafka_io import committed_offsets, end_offsets, produce, read_topic, review_records
from tests.labellers import labeller_for
from tests.polling import wait_until
from tests.worker_commands import run_command
from worker.bench.worker_process import free_port
from worker.kafka.app import SentimentWorker
from worker.tools.lag import GroupLag, format_table, measure_lag

pytestmark = pytest.mark.integration


def produce_with_timestamps(bootstrap: str, topic: str, partition: int, timestamps_ms: list[int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i, ts in enumerate(timestamps_ms):
        producer.produce(
            topic,
            value=json.dumps({"id": f"p{partition}-{i}", "text": "好"}).encode(),
            partition=partition,
            timestamp=ts,
        )
    assert producer.flush(30) == 0


def commit_for_group(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def test_lag_reads_offsets_like_the_broker_and_ages_the_first_unconsumed_message(
    kafka_bootstrap: str, topics: Any
) -> None:
    names = topics(input_partitions=3)
    topic, group = names["reviews"], names["group"]
    base_ms = int(time.time() * 1000) - 600_000  # ten minutes ago
    stamps = {p: [base_ms + p * 1000 + i * 10 for i in range(10)] for p in range(3)}
    for p, ts in stamps.items():
        produce_with_timestamps(kafka_bootstrap, topic, p, ts)
    commit_for_group(kafka_bootstrap, group, topic, {0: 4, 1: 10})  # partition 2: nothing committed

    lag = measure_lag({"bootstrap.servers": kafka_bootstrap}, group, topic)

    rows = {p.partition: p for p in lag.partitions}
    assert sorted(rows) == [0, 1, 2]
    broker_committed = committed_offsets(kafka_bootstrap, group, topic, 3)
    broker_end = end_offsets(kafka_bootstrap, topic, 3)
    assert {p: r.log_end_offset for p, r in rows.items()} == broker_end == {0: 10, 1: 10, 2: 10}
    assert rows[0].committed_offset == broker_committed[0] == 4
    assert rows[1].committed_offset == broker_committed[1] == 10
    assert rows[2].committed_offset is None and broker_committed[2] < 0
    assert [rows[p].lag_messages for p in range(3)] == [6, 0, 10]
    assert lag.total_lag_messages == 16

    # Behind: the age of the message at the committed offset (offset 4), or at the log start (offset 0).
    assert rows[0].oldest_unconsumed_timestamp_ms == stamps[0][4]
    assert rows[0].lag_seconds == pytest.approx((lag.measured_at_ms - stamps[0][4]) / 1000, abs=0.01)
    assert rows[2].oldest_unconsumed_timestamp_ms == stamps[2][0]
    assert rows[2].lag_seconds == pytest.approx((lag.measured_at_ms - stamps[2][0]) / 1000, abs=0.01)
    assert rows[0].lag_seconds > 500 and rows[2].lag_seconds > 500
    # Caught up: zero seconds, whatever the age of the last message.
    assert rows[1].lag_seconds == 0.0 and rows[1].oldest_unconsumed_timestamp_ms is None
    assert lag.state in ("EMPTY", "DEAD") and all(r.member_id is None for r in rows.values())

    # The command prints the same numbers (JSON), and a table with one line per partition.
    env_args = ["--bootstrap-servers", kafka_bootstrap, "--input-topic", topic, "--group-id", group]
    out = run_command("lag", *env_args, "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert [
        (
            p["partition"],
            p["committed_offset"],
            p["log_end_offset"],
            p["lag_messages"],
            p["oldest_unconsumed_timestamp_ms"],
        )
        for p in printed["partitions"]
    ] == [(0, 4, 10, 6, stamps[0][4]), (1, 10, 10, 0, None), (2, None, 10, 10, stamps[2][0])]
    assert printed["total_lag_messages"] == 16 and printed["max_lag_seconds"] > 500
    table = run_command("lag", *env_args, timeout=60)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[1].split()[:6] == [
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "LAG-SECONDS",
    ]
    assert [line.split()[1:5] for line in lines[2:5]] == [
        ["0", "4", "10", "6"],
        ["1", "10", "10", "0"],
        ["2", "-", "10", "10"],
    ]
    assert "total lag 16 messages" in lines[-1]


def test_lag_of_a_missing_topic_is_a_clear_error(kafka_bootstrap: str, unique_name: Any) -> None:
    args = ["--bootstrap-servers", kafka_bootstrap, "--input-topic", unique_name("absent")]
    out = run_command("lag", *args, timeout=60)
    assert out.returncode == 2  # cannot start as configured (README's exit codes); it was 1
    assert "does not exist" in out.stderr and "SENTIMENT_INPUT_TOPIC" in out.stderr
    assert "Traceback" not in out.stderr


def _metrics(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return {f.name: f for f in text_string_to_metric_families(response.read().decode())}


def _wait_for(condition: Any, what: str, timeout_s: float = 90.0) -> Any:
    return wait_until(condition, timeout_s, what, interval_s=0.5)


def test_running_worker_owns_every_partition_and_its_metrics_match_lag_when_caught_up(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics(input_partitions=3)
    conf = {"bootstrap.servers": kafka_bootstrap}
    produce(kafka_bootstrap, names["reviews"], review_records(sample_reviews(60)))
    before = measure_lag(conf, names["group"], names["reviews"])
    assert before.total_lag_messages == 60
    assert all(p.lag_seconds is not None and p.lag_seconds > 0 for p in before.partitions if p.lag_messages)

    with _worker_on_port(kafka_bootstrap, names, tiny_classifier) as url:
        assert len(read_topic(kafka_bootstrap, names["results"], expected=60)) == 60

        def caught_up() -> GroupLag | None:
            lag = measure_lag(conf, names["group"], names["reviews"])
            owned = all(p.client_id == "test-worker" for p in lag.partitions)
            return lag if lag.total_lag_messages == 0 and owned else None

        lag = _wait_for(caught_up, "the group caught up with the worker owning every partition")
        assert lag.state == "STABLE"
        assert {p.partition: p.committed_offset for p in lag.partitions} == end_offsets(
            kafka_bootstrap, names["reviews"], 3
        )
        assert all(p.lag_seconds == 0.0 for p in lag.partitions)
        assert len({p.member_id for p in lag.partitions}) == 1 and "test-worker" in format_table(lag)

        def gauges() -> dict[str, dict[str, float]] | None:
            found = _lag_gauges(url)
            return found if all(len(v) == 3 for v in found.values()) else None

        metrics = _wait_for(gauges, "per-partition lag gauges for the 3 partitions")
        table = {str(p.partition): float(p.lag_messages) for p in lag.partitions}
        assert metrics["sentiment_consumer_lag_messages"] == table
        assert metrics["sentiment_consumer_lag_seconds"] == {str(p.partition): 0.0 for p in lag.partitions}


def test_an_idle_assigned_partition_exports_zero_lag(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics(input_partitions=3)
    produce(kafka_bootstrap, names["reviews"], review_records(sample_reviews(10)), partition=0)
    with _worker_on_port(kafka_bootstrap, names, tiny_classifier) as url:
        assert len(read_topic(kafka_bootstrap, names["results"], expected=10)) == 10

        def gauges() -> dict[str, dict[str, float]] | None:
            found = _lag_gauges(url)
            caught_up = all(v == {"0": 0.0, "1": 0.0, "2": 0.0} for v in found.values())
            return found if caught_up else None

        # Partitions 1 and 2 never received a message: their series exist anyway, at 0.
        metrics = _wait_for(gauges, "lag series for the 3 partitions, all 0")
        assert set(metrics["sentiment_consumer_lag_messages"]) == {"0", "1", "2"}


@contextmanager
def _worker_on_port(bootstrap: str, names: dict[str, str], classifier: Any) -> Iterator[str]:
    """A SentimentWorker with an HTTP port, running in a thread for the block; yields its /metrics URL."""
    settings = make_settings(bootstrap, names).model_copy(update={"http_port": free_port()})
    worker = SentimentWorker(
        settings.sections, labeller_for(classifier, settings, ModelRef(name="tiny", version="1"))
    )
    thread = threading.Thread(target=worker.run, kwargs={"idle_exit_s": 120})
    thread.start()
    try:
        yield f"http://127.0.0.1:{settings.http_port}/metrics"
    finally:
        worker.request_stop()
        thread.join(timeout=60)
    assert not thread.is_alive()


def _lag_gauges(url: str) -> dict[str, dict[str, float]]:
    """Both per-partition lag series of the worker's /metrics: name -> partition -> value."""
    families = _metrics(url)
    return {
        name: {s.labels["partition"]: s.value for s in families[name].samples}
        for name in ("sentiment_consumer_lag_messages", "sentiment_consumer_lag_seconds")
    }
