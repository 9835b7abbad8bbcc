"""The monitoring assets against a running worker: every metric the Grafana dashboard and the Prometheus
alert rules query exists in its /metrics output; and `record` + `report` turn a live run into a PNG."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.sentiment_result import ModelRef
from tests.integration.helpers import make_settings, sample_reviews
from tests.integration.kafka_io import produce, read_topic, review_records
from tests.labellers import labeller_for
from tests.monitoring_assets import alert_queries, dashboard_queries
from tests.polling import wait_until
from worker.bench.report import load_recording, record, summarize
from worker.bench.worker_process import free_port
from worker.cli import main
from worker.kafka.app import SentimentWorker
from worker.metrics import DeviceMemoryCollector

pytestmark = pytest.mark.integration
# Exported by the worker only on a GPU (see tests/unit/test_metrics_collectors.py).
GPU_ONLY = set(DeviceMemoryCollector.NAMES)
# Declared by the worker but without a sample until the event happens (labelled by the failing topic).
EVENT_ONLY = {"sentiment_delivery_failures_total"}
# Declared but sampled only while a shadow model runs (labelled by label pair / outcome); their values are
# checked against both models' predictions in test_live_models.py.
SHADOW_ONLY = {
    "sentiment_shadow_agreeing_total",
    "sentiment_shadow_predictions_total",
    "sentiment_shadow_groups_total",
}


def _scrape(url: str) -> tuple[set[str], set[str]]:
    """(names with a sample, names declared by a family) in a /metrics page."""
    with urllib.request.urlopen(url, timeout=5) as response:
        families = list(text_string_to_metric_families(response.read().decode()))
    sampled = {s.name for f in families for s in f.samples}
    suffixes = {
        "counter": ["_total"],
        "histogram": ["_bucket", "_sum", "_count"],
        "info": ["_info"],
        "summary": ["_sum", "_count"],
    }
    declared = {f.name + s for f in families for s in suffixes.get(f.type, [""])}
    return sampled, declared | sampled


@pytest.fixture
def running_worker(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> Iterator[tuple[str, dict[str, str]]]:
    """A worker in this process with /metrics on a free port; yields (metrics URL, topic names)."""
    names = topics(input_partitions=3)
    settings = make_settings(kafka_bootstrap, names).model_copy(update={"http_port": free_port()})
    worker = SentimentWorker(
        settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
    )
    thread = threading.Thread(target=worker.run, kwargs={"idle_exit_s": 120})
    thread.start()
    deadline = time.monotonic() + 60
    while not worker.health.readiness()[0]:
        assert thread.is_alive() and time.monotonic() < deadline, "worker never became ready"
        time.sleep(0.2)
    try:
        yield f"http://127.0.0.1:{settings.http_port}/metrics", names
    finally:
        worker.request_stop()
        thread.join(timeout=60)
    assert not thread.is_alive()


def _feed(bootstrap: str, names: dict[str, str], n: int) -> None:
    produce(bootstrap, names["reviews"], review_records(sample_reviews(n)) + [(b"bad", b"{not json")])
    assert len(read_topic(bootstrap, names["results"], expected=n)) == n
    assert len(read_topic(bootstrap, names["dlq"], expected=1)) == 1


def test_every_metric_the_dashboard_and_alerts_query_is_exported(
    kafka_bootstrap: str, running_worker: tuple[str, dict[str, str]]
) -> None:
    url, names = running_worker
    _feed(kafka_bootstrap, names, 30)  # results, a dead letter, batches: every histogram has observations
    dashboard = dashboard_queries()
    assert all(dashboard.values()), [q for q, n in dashboard.items() if not n]
    queried = set().union(*dashboard.values())
    assert queried & GPU_ONLY == GPU_ONLY  # the GPU memory panel

    # The loop refreshes its gauges every second: scrape until they are all there (or the deadline).
    deadline = time.monotonic() + 30
    while True:
        sampled, declared = _scrape(url)
        missing = {q: sorted(n - sampled - GPU_ONLY - EVENT_ONLY - SHADOW_ONLY) for q, n in dashboard.items()}
        if not any(missing.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {q: n for q, n in missing.items() if n} == {}
    assert EVENT_ONLY & queried <= declared
    assert queried >= SHADOW_ONLY  # the live models row
    assert declared >= SHADOW_ONLY

    alerts = alert_queries()
    undeclared = {a: sorted(n - declared - {"up"}) for a, n in alerts.items()}
    assert {a: n for a, n in undeclared.items() if n} == {}


def test_record_and_report_render_a_live_run(
    kafka_bootstrap: str, running_worker: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, names = running_worker
    recording_path, png = tmp_path / "run.jsonl", tmp_path / "report.png"
    done = threading.Event()

    def sleep_or_interrupt(seconds: float) -> None:
        if done.wait(seconds):
            raise KeyboardInterrupt  # Ctrl-C: `record` ends the recording early, keeping what it wrote

    recorder = threading.Thread(
        target=record,
        args=(url, recording_path),
        kwargs={"interval_s": 0.5, "duration_s": 600, "sleep": sleep_or_interrupt},
    )
    recorder.start()
    try:
        wait_until(lambda: recording_path.exists() and recording_path.read_text(), 30, "the first scrape")
        _feed(kafka_bootstrap, names, 40)

        def caught_up() -> bool:
            try:
                summary = summarize(load_recording(recording_path))
            except ValueError:  # a scrape half written as we read
                return False
            return summary.outputs == 41 and summary.final_total_lag_messages == 0

        wait_until(caught_up, 60, "a scrape showing the 41 outputs and no lag", interval_s=0.5)
    finally:
        done.set()
        recorder.join(timeout=60)
    assert not recorder.is_alive()

    summary = summarize(load_recording(recording_path))
    assert summary.outputs == 41 and summary.dead_letters == 1  # everything fed after the first scrape
    assert summary.final_total_lag_messages == 0 and summary.scrapes >= 2
    assert main(["report", str(recording_path), "--out", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
