"""The `sentiment-worker run` process: signals, exit codes, health endpoints, against the real broker."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.sentiment_result import ModelRef
from tests.integration.helpers import http_get, make_settings, produce_samples, sample_reviews, worker_env
from tests.integration.kafka_io import (
    assert_all_committed,
    assert_nothing_committed,
    produce,
    read_topic,
    results_of,
    review_records,
)
from tests.labellers import labeller_for
from tests.worker_commands import start_command
from worker.bench.worker_process import free_port
from worker.kafka.app import SentimentWorker

pytestmark = pytest.mark.integration


def test_sigterm_mid_stream_loses_nothing(kafka_bootstrap: str, topics: Any, tiny_model_dir: Path) -> None:
    names = topics()
    reviews = sample_reviews(600)
    records = review_records(reviews)
    env = worker_env(kafka_bootstrap, names, tiny_model_dir, SENTIMENT_MAX_WINDOW_MESSAGES="16")
    first = start_command(env, "run")

    # Feed at a steady pace while the worker runs, so the signal lands mid-stream.
    def feed() -> None:
        for start in range(0, len(records), 20):
            produce(kafka_bootstrap, names["reviews"], records[start : start + 20])
            time.sleep(0.05)

    feeder = threading.Thread(target=feed)
    feeder.start()
    deadline = time.monotonic() + 120
    while len(read_topic(kafka_bootstrap, names["results"], expected=50, timeout_s=2, settle_s=0)) < 50:
        assert first.poll() is None, f"worker died: {first.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "worker published nothing within 120 s"
    first.send_signal(signal.SIGTERM)
    try:
        out, err = first.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        first.kill()
        pytest.fail("worker did not stop within 60 s of SIGTERM")
    feeder.join()
    assert first.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped"] == "stop requested"
    assert summary["consumed"] == summary["results"] + summary["dead_letters"]
    assert summary["consumed"] < len(records), "the signal should have landed mid-stream"

    second = start_command(env, "run", "--idle-exit-s", "4")
    out2, err2 = second.communicate(timeout=300)
    assert second.returncode == 0, err2[-3000:]

    ids = [r["id"] for r in results_of(read_topic(kafka_bootstrap, names["results"], expected=len(reviews)))]
    assert len(ids) == len(reviews) and set(ids) == {r["id"] for r in reviews}  # nothing lost, nothing twice
    assert_all_committed(kafka_bootstrap, names, 3)


def test_gpu_requested_without_cuda_exits_non_zero_with_a_clear_message(
    kafka_bootstrap: str, topics: Any, tiny_model_dir: Path
) -> None:
    names = topics()
    proc = start_command(worker_env(kafka_bootstrap, names, tiny_model_dir, SENTIMENT_DEVICE="gpu"), "run")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "device" in err and "cpu" in err.lower(), err  # says what to do: use cpu or install the GPU build
    assert "Traceback" not in err
    assert_nothing_committed(kafka_bootstrap, names, 3)


def test_readyz_flips_after_warm_up_and_assignment_and_metrics_count(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    names = topics()
    settings = make_settings(kafka_bootstrap, names).model_copy(update={"http_port": free_port()})
    worker = SentimentWorker(
        settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
    )
    assert worker.health.readiness()[0] is False  # nothing loaded, nothing assigned yet
    thread = threading.Thread(target=worker.run, kwargs={"idle_exit_s": 60})
    thread.start()
    try:
        base = f"http://127.0.0.1:{settings.http_port}"
        deadline = time.monotonic() + 60
        while True:
            status, body = http_get(base + "/readyz") if worker.http_address else (0, "")
            if status == 200:
                break
            assert time.monotonic() < deadline, f"never ready: {body}"
            time.sleep(0.2)
        ready = json.loads(body)
        assert ready["model_warm"] is True and ready["partitions_assigned"] == 3
        assert http_get(base + "/healthz")[0] == 200
        produce_samples(kafka_bootstrap, names["reviews"], 20)
        read_topic(kafka_bootstrap, names["results"], expected=20)

        def published_and_lag() -> tuple[float, dict[str, float]]:
            families = {f.name: f for f in text_string_to_metric_families(http_get(base + "/metrics")[1])}
            published = sum(
                s.value for s in families["sentiment_results_published"].samples if s.name.endswith("_total")
            )
            samples = families["sentiment_consumer_lag_messages"].samples
            return published, {s.labels["partition"]: s.value for s in samples}

        # The gauges refresh every second: scrape until they show the 20 results, with a deadline.
        deadline = time.monotonic() + 30
        published, lag = published_and_lag()
        while (published, lag) != (20, {"0": 0, "1": 0, "2": 0}) and time.monotonic() < deadline:
            time.sleep(0.2)
            published, lag = published_and_lag()
        assert published == 20
        assert set(lag) == {"0", "1", "2"} and all(v == 0 for v in lag.values())
    finally:
        worker.request_stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert worker.health.readiness()[0] is False  # stopping is not ready
