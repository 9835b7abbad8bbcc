"""Metrics updated once per turn give the same series as one update per record."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from worker.metrics import create_metrics, observe_all


def _histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram("t_seconds", "test", buckets=(0.1, 0.5, 1, 5), registry=registry)


def test_observe_all_gives_the_buckets_count_and_sum_of_observing_one_by_one() -> None:
    rng = random.Random(7)
    values = [rng.choice([0.1, 0.5, 1.0, 5.0, 7.0, 0.0]) or rng.random() * 6 for _ in range(500)]
    one_by_one, bulk = CollectorRegistry(), CollectorRegistry()
    each = _histogram(one_by_one)
    for value in values:
        each.observe(value)
    observe_all(_histogram(bulk), values)
    samples_each = {
        (s.name, tuple(s.labels.items())): s.value for s in next(iter(one_by_one.collect())).samples
    }
    samples_bulk = {(s.name, tuple(s.labels.items())): s.value for s in next(iter(bulk.collect())).samples}
    assert samples_each.keys() == samples_bulk.keys()
    for key, value in samples_each.items():
        if key[0].endswith("_sum"):
            assert abs(samples_bulk[key] - value) < 1e-9
        elif not key[0].endswith("_created"):
            assert samples_bulk[key] == value, key  # a value on a bound counts in that bound's bucket


def test_observe_predictions_counts_labels_confidences_and_low_confidence_once_per_call() -> None:
    registry = CollectorRegistry()
    metrics = create_metrics(registry, low_confidence=0.6)
    metrics.observe_predictions({"positive": 2, "negative": 1}, [0.9, 0.55, 0.6], "v1")
    text = generate_latest(registry).decode()
    assert 'sentiment_predictions_total{label="positive",model_version="v1"} 2.0' in text
    assert 'sentiment_predictions_total{label="negative",model_version="v1"} 1.0' in text
    assert 'sentiment_low_confidence_predictions_total{model_version="v1"} 1.0' in text
    assert "sentiment_prediction_confidence_count 3.0" in text
