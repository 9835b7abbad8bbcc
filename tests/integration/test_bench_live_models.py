"""`bench --shadow` and `bench --swaps` briefly on the real broker with the tiny session models (the tiny
model as the primary, its INT8 form as the shadow or the other model): the reports' structure and sanity, no
timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.bench.model_swaps import SwapBenchOptions, format_swaps_table, run_swaps_bench, swaps_conserved
from worker.bench.shadow_cost import (
    ShadowBenchOptions,
    format_shadow_table,
    run_shadow_bench,
    shadow_conserved,
)
from worker.config import WorkerSettings

pytestmark = pytest.mark.integration

MESSAGES = 240


def bench_settings(kafka_bootstrap: str, model: Path) -> WorkerSettings:
    return WorkerSettings(
        bootstrap_servers=kafka_bootstrap,
        model=str(model),
        device="cpu",
        cpu_threads=1,
        http_port=0,
        max_wait_ms=20,
        max_window_messages=16,
    )


def test_shadow_bench_drains_every_review_in_both_arms(
    kafka_bootstrap: str, tiny_model_dir: Path, tiny_int8_dir: Path
) -> None:
    settings = bench_settings(kafka_bootstrap, tiny_model_dir)
    options = ShadowBenchOptions.quick(messages=MESSAGES, pairs=2, partitions=2, sample_interval_s=0.1)
    report = run_shadow_bench(settings, tiny_int8_dir, options)

    json.dumps(report)  # written as JSON
    arms = report["arms"]
    # Two pairs, alternated: off-on, then on-off.
    assert [(a["pair"], a["shadow"]) for a in arms] == [(0, False), (0, True), (1, True), (1, False)]
    each = {"inputs": MESSAGES, "outputs": MESSAGES, "missing": 0, "duplicates": 0, "ok": True}
    for arm in arms:
        assert arm["conservation"] == each
        assert arm["results"] + arm["dead_letters"] == MESSAGES
        assert arm["messages_per_second"] > 0
        assert arm["cpu_s_per_review"] is None or arm["cpu_s_per_review"] > 0
        assert arm["latency_ms"]["p50"] is not None and arm["latency_ms"]["p95"] >= arm["latency_ms"]["p50"]
        assert (
            arm["primary_model"] is not None
            and arm["primary_model"]["version"] in arm["models_in_results"][0]
        )
        assert len(arm["models_in_results"]) == 1  # the primary's results only, with or without a shadow
        if arm["shadow"]:
            groups = arm["shadow_groups"]
            assert groups["shadowed"] >= 1 and groups["skipped"] >= 0
            assert arm["shadow_model"] is not None
            assert arm["shadow_model"]["version"] != arm["primary_model"]["version"]
        else:
            assert arm["shadow_groups"] is None and arm["shadow_model"] is None
    for side in ("without_shadow", "with_shadow"):
        assert report[side]["drains"] == 2
        assert report[side]["results_of_every_drain"] == [MESSAGES, MESSAGES]
        assert report[side]["messages_per_second"] > 0
    assert report["with_shadow"]["shadow_groups_shadowed"] >= 2
    assert len(report["with_vs_without"]["rate_ratio_by_pair"]) == 2
    assert shadow_conserved(report)
    # Reviews, results, dead letters, control and status topics of each of the 4 drains.
    assert len(report["deleted_topics"]) == 5 * 4
    table = format_shadow_table(report)
    for row in ("reviews/s", "CPU s per review", "latency p50", "latency p95", "shadowed / skipped"):
        assert row in table


def test_swaps_bench_alternates_the_primary_and_samples_rss_after_each_swap(
    kafka_bootstrap: str, tiny_model_dir: Path, tiny_int8_dir: Path
) -> None:
    settings = bench_settings(kafka_bootstrap, tiny_model_dir)
    options = SwapBenchOptions.quick(
        swap_with=str(tiny_int8_dir), swaps=3, partitions=2, sample_interval_s=0.2
    )
    report = run_swaps_bench(settings, options)

    json.dumps(report)
    points = report["points"]
    # The start sample, one after each of the 3 swaps, one at the end.
    assert [p["sample"].split(" →")[0] for p in points] == ["before", "swap 1", "swap 2", "swap 3", "end"]
    assert all(p["rss_bytes"] > 50 * 1024 * 1024 for p in points)  # a worker with Paddle loaded
    served = [p["served_version"] for p in points]
    a, b = served[0], served[1]
    assert a != b and served == [a, b, a, b, b]  # A → B → A → B, still B at the end
    assert all(p["took_s"] >= 0 for p in points[1:4])
    assert report["rss_drift_bytes"] == points[-1]["rss_bytes"] - points[0]["rss_bytes"]
    # Every review produced while it swapped has one result or dead letter; every partition's results
    # change version in the order of the swaps (A first), never back.
    assert report["conservation"]["ok"] and report["conservation"]["inputs"] == report["produced"]
    assert report["results"] + report["dead_letters"] == report["produced"] >= 4 * options.chunk
    for switches in report["versions_by_partition"].values():
        assert switches == [a, b, a, b][: len(switches)]
    assert swaps_conserved(report)
    assert len(report["deleted_topics"]) == 5
    table = format_swaps_table(report)
    assert "RSS drift (end − before)" in table and "| swap 3 →" in table
