"""The live-model benches' pure parts: reading /metrics samples, latency percentiles, the swap verdict."""

from __future__ import annotations

from typing import Any

from worker.bench.bench import latency_percentiles
from worker.bench.live_control import metric_labels, metric_value
from worker.bench.model_swaps import swaps_conserved

SCRAPE = {
    'sentiment_model_info{"device": "cpu", "name": "tiny", "version": "b"}': 1.0,
    'sentiment_model_changes_total{"outcome": "applied", "role": "primary"}': 2.0,
    'sentiment_model_changes_total{"outcome": "refused", "role": "primary"}': 1.0,
    'sentiment_model_changes_total{"outcome": "applied", "role": "shadow"}': 4.0,
    'sentiment_model_changes_created{"outcome": "applied", "role": "primary"}': 1.7e9,
}


def test_metric_value_sums_the_samples_whose_labels_match() -> None:
    assert metric_value(SCRAPE, "sentiment_model_changes_total", role="primary", outcome="applied") == 2.0
    assert metric_value(SCRAPE, "sentiment_model_changes_total", role="primary") == 3.0
    assert metric_value(SCRAPE, "sentiment_model_changes_total") == 7.0
    assert metric_value(SCRAPE, "sentiment_shadow_groups_total", outcome="skipped") == 0.0


def test_metric_labels_names_what_an_info_metric_says() -> None:
    assert metric_labels(SCRAPE, "sentiment_model_info") == [
        {"device": "cpu", "name": "tiny", "version": "b"}
    ]
    assert metric_labels(SCRAPE, "sentiment_shadow_model_info") == []


def test_the_shadow_bench_reports_latency_as_the_drain_bench_does() -> None:
    got = latency_percentiles([float(v) for v in range(1, 101)])
    assert got == {"p50": 50.5, "p95": 95.05, "p99": 99.01, "max": 100.0}
    assert latency_percentiles([]) == {"p50": None, "p95": None, "p99": None, "max": None}


def swap_report(served: list[str], by_partition: dict[str, list[str]], ok: bool = True) -> dict[str, Any]:
    points = [{"served_version": v} for v in served]
    return {"points": points, "versions_by_partition": by_partition, "conservation": {"ok": ok}}


def test_a_swap_report_holds_when_the_model_alternates_and_partitions_follow_in_order() -> None:
    assert swaps_conserved(
        swap_report(["a", "b", "a", "b", "b"], {"0": ["a", "b", "a", "b"], "1": ["a", "b"]})
    )
    assert not swaps_conserved(swap_report(["a", "b", "b", "b", "b"], {"0": ["a", "b"]}))  # a swap not taken
    assert not swaps_conserved(swap_report(["a", "b", "a", "b", "b"], {"0": ["a", "b", "a", "a"]}))
    # more switches than swaps; a model never served
    assert not swaps_conserved(swap_report(["a", "b", "a", "b", "b"], {"0": ["a", "b", "a", "b", "a"]}))
    assert not swaps_conserved(swap_report(["a", "b", "a", "b", "b"], {"0": ["a", "c"]}))
    # a partition whose first input came after the first swap starts on the second model
    assert swaps_conserved(swap_report(["a", "b", "a", "b", "b"], {"0": ["b", "a"]}))
    assert not swaps_conserved(swap_report(["a", "b", "a", "b", "b"], {"0": ["a"]}, ok=False))
