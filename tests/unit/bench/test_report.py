"""The arithmetic of `sentiment-worker report`: counter rates across restarts, histogram quantiles as
Prometheus computes them, reading recordings; and a rendered PNG from a synthetic recording."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from worker.bench.report import (
    Recording,
    ReportError,
    histogram_quantile,
    increase,
    label_mix,
    load_recording,
    low_confidence_share,
    parse_scrape,
    quantile_series,
    rate,
    render,
    summarize,
)


def test_increase_treats_a_drop_as_a_counter_restart() -> None:
    assert increase([0, 5, 12, 3, 10]) == [0, 5, 7, 3, 7]


def test_rate_uses_the_trailing_window() -> None:
    times = [0, 1, 2, 3, 4, 5]
    counter = [0, 10, 20, 30, 30, 30]
    rates = rate(times, counter, window_s=2)
    assert math.isnan(rates[0])
    assert rates[1:] == [10, 10, 10, 5, 0]


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.5, 0.15),  # rank 50 of 100: halfway through the (0.1, 0.2] bucket (40 → 60)
        (0.2, 0.05),  # rank 20: halfway through the first bucket (0, 0.1] (0 → 40)
        (0.99, 0.5),  # in the +Inf bucket: the largest finite bound
    ],
)
def test_histogram_quantile_interpolates_like_prometheus(q: float, expected: float) -> None:
    buckets = [(0.1, 40), (0.2, 60), (0.5, 90), (math.inf, 100)]
    assert histogram_quantile(q, buckets) == pytest.approx(expected)


def test_histogram_quantile_of_an_empty_histogram_is_nan() -> None:
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0), (math.inf, 0)]))


EXPOSITION = """\
# HELP sentiment_results_published_total r
# TYPE sentiment_results_published_total counter
sentiment_results_published_total{{topic="out"}} {results}
sentiment_results_published_created{{topic="out"}} 1.7e9
# HELP sentiment_dead_letters_total d
# TYPE sentiment_dead_letters_total counter
sentiment_dead_letters_total{{kind="invalid_json"}} {dead}
# HELP sentiment_consumer_lag_messages l
# TYPE sentiment_consumer_lag_messages gauge
sentiment_consumer_lag_messages{{topic="in",partition="0"}} {lag}
# HELP sentiment_end_to_end_latency_seconds h
# TYPE sentiment_end_to_end_latency_seconds histogram
sentiment_end_to_end_latency_seconds_bucket{{le="0.1"}} {fast}
sentiment_end_to_end_latency_seconds_bucket{{le="1.0"}} {results}
sentiment_end_to_end_latency_seconds_bucket{{le="+Inf"}} {results}
sentiment_end_to_end_latency_seconds_sum 1.0
sentiment_end_to_end_latency_seconds_count {results}
# HELP python_gc_objects_collected_total g
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 5
"""


def _write_recording(path: Path) -> None:
    rows = [
        parse_scrape(EXPOSITION.format(results=r, dead=d, lag=lag, fast=f), 1000.0 + i)
        for i, (r, d, lag, f) in enumerate([(0, 0, 50, 0), (20, 1, 30, 20), (40, 2, 10, 20), (50, 2, 0, 20)])
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def test_recordings_keep_the_worker_metrics_and_summarize(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _write_recording(path)
    recording = load_recording(path)
    names = {name for scrape in recording.samples for name, _ in scrape}
    assert "python_gc_objects_collected_total" not in names
    assert not any(n.endswith("_created") for n in names)
    summary = summarize(recording)
    assert (summary.seconds, summary.scrapes, summary.outputs, summary.dead_letters) == (3.0, 4, 52.0, 2.0)
    assert summary.final_total_lag_messages == 0
    # 20 of 50 latencies under 0.1 s, the other 30 in (0.1, 1]: p95 = 0.1 + 0.9 * (47.5 - 20) / 30
    assert summary.latency_p95_s == pytest.approx(0.925)
    # In the last step all 10 new observations were slow: p50 of that window is inside (0.1, 1].
    assert quantile_series(recording, "sentiment_end_to_end_latency_seconds", 0.5, 1.0)[-1] == pytest.approx(
        0.55
    )


def test_render_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _write_recording(path)
    out = tmp_path / "report.png"
    render(load_recording(path), out, window_s=2.0)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_a_recording_of_one_scrape_or_garbage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps({"t": 1, "samples": []}) + "\n", encoding="utf-8")
    with pytest.raises(ReportError, match="at least 2"):
        load_recording(path)
    path.write_text("not json\n", encoding="utf-8")
    with pytest.raises(ReportError, match=":1 is not a recording line"):
        load_recording(path)


def test_label_mix_and_low_confidence_share_are_shares_of_the_window_over_versions() -> None:
    pos, neg = (
        (("label", "positive"), ("model_version", "1")),
        (("label", "negative"), ("model_version", "1")),
    )
    pos2 = (("label", "positive"), ("model_version", "2"))  # a promoted model, born mid-recording
    low, low2 = (("model_version", "1"),), (("model_version", "2"),)
    name, low_name = "sentiment_predictions_total", "sentiment_low_confidence_predictions_total"
    steps = [(0, 0, 0, 0), (50, 50, 10, 0), (100, 100, 20, 0), (100, 120, 50, 40)]  # pos, neg, low, pos2
    recording = Recording(
        times=[0.0, 1.0, 2.0, 3.0],
        samples=[
            {
                (name, pos): p,
                (name, neg): n,
                (low_name, low): lo,
                **({(name, pos2): p2, (low_name, low2): 10} if p2 else {}),
            }
            for p, n, lo, p2 in steps
        ],
    )
    mix = label_mix(recording, window_s=1.0)
    assert set(mix) == {"positive", "negative"}
    assert math.isnan(mix["positive"][0])
    assert mix["positive"][1:] == [0.5, 0.5, pytest.approx(40 / 60)]
    assert mix["negative"][1:] == [0.5, 0.5, pytest.approx(20 / 60)]
    share = low_confidence_share(recording, window_s=1.0)
    assert share[1:] == [0.1, 0.1, pytest.approx(40 / 60)]  # 30 of version 1, 10 of version 2
