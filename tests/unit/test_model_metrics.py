"""Model monitoring metrics: results by label and model version, confidence, low-confidence share."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from worker.metrics import create_metrics


def test_results_are_counted_by_label_and_version_and_low_confidence_under_the_threshold() -> None:
    registry = CollectorRegistry()
    metrics = create_metrics(registry, low_confidence=0.7)
    metrics.start_predictions(["negative", "positive"], "3")
    value = registry.get_sample_value
    # Every label's series exists at 0 before the first result (rate() sees the first one).
    assert value("sentiment_predictions_total", {"label": "negative", "model_version": "3"}) == 0
    assert value("sentiment_low_confidence_predictions_total", {"model_version": "3"}) == 0
    assert value("sentiment_low_confidence_threshold") == 0.7

    for label, confidence in [("positive", 0.99), ("positive", 0.69), ("negative", 0.7), ("negative", 0.51)]:
        metrics.observe_prediction(label, confidence, "3")

    assert value("sentiment_predictions_total", {"label": "positive", "model_version": "3"}) == 2
    assert value("sentiment_predictions_total", {"label": "negative", "model_version": "3"}) == 2
    assert value("sentiment_low_confidence_predictions_total", {"model_version": "3"}) == 2  # 0.69, 0.51
    assert value("sentiment_prediction_confidence_count") == 4
    assert value("sentiment_prediction_confidence_bucket", {"le": "0.55"}) == 1
    assert value("sentiment_prediction_confidence_bucket", {"le": "0.7"}) == 3
    assert value("sentiment_prediction_confidence_bucket", {"le": "0.98"}) == 3
    assert value("sentiment_prediction_confidence_sum") == 0.99 + 0.69 + 0.7 + 0.51
