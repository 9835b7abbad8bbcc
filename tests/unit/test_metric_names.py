"""The monitoring assets and the worker speak of the same metric names."""

from __future__ import annotations

from tests.monitoring_assets import promql_metric_names


def test_promql_metric_names_extraction() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le) "
        '(rate(a_bucket{instance=~"$instance", x="y(z)"}[$__rate_interval])))'
        " / clamp_min(sum(rate(b_total[5m])) + c, 1e-9) > 0.05 unless on (instance) d == 0"
        " or e offset 10m"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b_total", "c", "d", "e"}
