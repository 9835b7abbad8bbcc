"""A short run of the benchmark on the real broker: report structure and conservation, no timings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker.bench.bench import BenchOptions, run_bench
from worker.bench.bench_table import format_table
from worker.bench.model_table import EndToEnd, format_model_table, model_table
from worker.config import WorkerSettings

PHASE_KEYS = {"messages", "seconds", "messages_per_second", "results", "dead_letters"}
PREDICT_LINES = 1000  # N: `predict` runs on N and 2N lines


def test_bench_conserves_every_message_and_reports_each_phase(
    kafka_bootstrap: str, tiny_model_dir: Path, tiny_classifier: Any
) -> None:
    settings = WorkerSettings(
        bootstrap_servers=kafka_bootstrap,
        model=str(tiny_model_dir),
        device="cpu",
        http_port=0,
        max_wait_ms=20,
    )
    options = BenchOptions.quick(
        messages=150,
        model_only_messages=120,
        predict_messages=PREDICT_LINES,
        naive_messages=15,
        latency_messages=30,
        rate_per_s=30.0,
        drains=2,  # two drains, each on its own topics: the median one is reported
    )
    report = run_bench(settings, tiny_classifier, options, max_batch_tokens=512, tuned_from="test")

    json.dumps(report)  # the report is written as JSON
    for phase in ("model_only", "end_to_end", "naive", "latency"):
        assert set(report[phase]) >= PHASE_KEYS, phase
    model_only, e2e, naive, latency = (report[k] for k in ("model_only", "end_to_end", "naive", "latency"))

    # N in → N out, by id, in every phase.
    assert model_only["messages"] == 120 and model_only["results"] + model_only["dead_letters"] == 120
    each = {"inputs": 150, "outputs": 150, "missing": 0, "duplicates": 0, "ok": True}
    assert e2e["conservation"] == {**each, "every_drain": [each, each]}
    assert len(e2e["rates_of_every_drain"]) == 2 and min(e2e["rates_of_every_drain"]) > 0
    assert e2e["results"] + e2e["dead_letters"] == 150
    assert e2e["worker_summary"]["consumed"] == 150
    assert naive["messages"] == naive["results"] == 15 and naive["padded_to"] == 64  # the tiny model's limit
    assert latency["conservation"]["ok"] and latency["results"] + latency["dead_letters"] == 30
    assert latency["offered_rate_per_s"] == 30.0
    # `predict` on N and 2N lines: one output row per input line, numbered in order, in both runs.
    predict = report["predict"]
    assert [(run["lines_in"], run["lines_out"]) for run in predict["runs"]] == [
        (PREDICT_LINES, PREDICT_LINES),
        (2 * PREDICT_LINES, 2 * PREDICT_LINES),
    ]
    assert all(run["numbered_in_order"] and run["errors"] == 0 for run in predict["runs"])
    assert predict["conservation"]["ok"]
    # The marginal rate is N / (t(2N) - t(N)) of the runs' own times (JSON: rounded to 1 ms), or None when
    # start-up noise outweighed the extra N lines (the tiny model labels them in a fraction of a second).
    short_s, long_s = (run["seconds"] for run in predict["runs"])
    rate, ratio = predict["messages_per_second"], report["ratios"]["e2e_vs_predict"]
    extra_s = long_s - short_s
    if extra_s > 0.002:
        assert PREDICT_LINES / (extra_s + 0.001) <= rate <= PREDICT_LINES / (extra_s - 0.001)
        # Round 1 is drain 1 then the pair; round 2 is drain 2 alone: the ratio is drain 1's over the pair's.
        assert ratio == pytest.approx(e2e["rates_of_every_drain"][0] / rate, rel=0.02)
        # (JSON keeps 4 decimals: a ratio far from 1 is compared to its rounding, not to 0.1 % of it)
        assert report["e2e_vs_predict_by_round"] == [pytest.approx(ratio, rel=1e-3, abs=1e-4)]
    elif extra_s < -0.002:
        assert rate is None and ratio is None and report["targets"]["e2e_vs_predict"]["met"] is None

    # The measurements the table and the targets are built from are present.
    assert 0 < model_only["padding_efficiency"] <= 1 and 0 <= model_only["tokenization_share"] <= 1
    assert {"p50", "p95", "p99"} <= set(latency["latency_ms"]) and latency["latency_ms"]["p50"] is not None
    assert e2e["rss"]["samples"] >= 1 and e2e["rss"]["peak_bytes"] > 0
    assert report["max_batch_tokens"] == 512 and report["max_batch_size"] == settings.max_batch_size
    assert set(report["targets"]) == {
        "e2e_vs_model_only",
        "e2e_vs_predict",
        "e2e_vs_naive",
        "padding_efficiency",
        "tokenization_share",
        "rss_growth",
    }
    assert all({"value", "target", "met"} <= set(flag) for flag in report["targets"].values())
    # The run's topics are deleted afterwards (a full run leaves 200k messages otherwise).
    deleted = report["deleted_topics"]
    # Reviews, results and dead letters of the 2 drains and of the latency phase; the naive loop's output.
    assert len(deleted) == 3 * 2 + 3 + 1 and all(name.startswith("bench-") for name in deleted)
    table = format_table(report)
    assert report["targets"]["e2e_vs_predict"]["target"] == 0.90
    for row in ("model-only", "end-to-end", "predict", "naive loop", "latency", "worker RSS"):
        assert row in table
    assert "padding_efficiency" in table and "e2e_vs_predict" in table


def test_model_table_drains_each_served_form_through_the_broker(
    kafka_bootstrap: str, tiny_model_dir: Path, tiny_int8_dir: Path
) -> None:
    from confluent_kafka.admin import AdminClient

    settings = WorkerSettings(bootstrap_servers=kafka_bootstrap, device="cpu", http_port=0, max_wait_ms=20)
    where = EndToEnd(settings, messages=80, partitions=2)
    rows = model_table([tiny_model_dir, tiny_int8_dir], texts=64, repeats=1, end_to_end=where)

    for row in rows:  # conservation is checked inside (a lost or repeated review raises)
        assert row.end_to_end_reviews_per_s is not None and row.end_to_end_reviews_per_s > 0
        assert row.peak_rss_mb is not None and row.peak_rss_mb > 50  # a worker with Paddle loaded
    table = format_model_table(rows)
    assert "| reviews/s end to end | peak RSS |" in table and " MB | " in table
    left = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert not [name for name in left if name.startswith("model-table-")], "drain topics are deleted"
