"""The monitoring assets and the worker speak of the same metric names: every metric the Grafana dashboard
and the Prometheus alerts query, and every `sentiment_*` name the README, docs/ and the operator commands
(`worker/tools`, `worker/bench`: doctor, report, bench) mention, is one that worker/metrics.py exports.
tests/integration/test_deploy_metrics.py checks the same against a running worker's /metrics."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tests.monitoring_assets import alert_queries, dashboard_queries, promql_metric_names
from worker.metrics import create_http_metrics, create_metrics

REPO = Path(__file__).resolve().parents[2]
# Series Prometheus makes itself for every target, not exported by the worker.
PROMETHEUS_SERIES = {"up"}
# A `sentiment_*` word, unless part of a file or module name (sentiment_model.json, schemas.sentiment_result).
_MENTION = re.compile(r"(?<![\w./-])sentiment_[a-z_]+\b(?![.\w/-])")


def _mentions(text: str) -> set[str]:
    return set(_MENTION.findall(text))


def test_promql_metric_names_extraction() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le) "
        '(rate(a_bucket{instance=~"$instance", x="y(z)"}[$__rate_interval])))'
        " / clamp_min(sum(rate(b_total[5m])) + c, 1e-9) > 0.05 unless on (instance) d == 0"
        " or e offset 10m"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b_total", "c", "d", "e"}


def test_mentions_are_metric_names_not_files_or_modules() -> None:
    text = (
        "`sentiment_consumer_lag_seconds` and sentiment_ready; not sentiment_model.json, "
        "schemas/sentiment_result.py, schemas.sentiment_result or SENTIMENT_MODEL"
    )
    assert _mentions(text) == {"sentiment_consumer_lag_seconds", "sentiment_ready"}


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> tuple[set[str], set[str]]:
    """(sample names, family names) of a worker's registry with the HTTP API's metrics, as scraped on a GPU:
    every labelled metric has a child, so each family yields its samples (a Counter `x` gives `x_total`)."""
    registry = CollectorRegistry()
    metrics, http = create_metrics(registry), create_http_metrics(registry)
    for family in (metrics, http, metrics.live):
        for metric in vars(family).values():
            if isinstance(metric, Counter | Gauge | Histogram) and metric._labelnames:
                metric.labels(*("x" for _ in metric._labelnames))
    metrics.model.info({"name": "m", "version": "1", "device": "gpu:0"})
    cuda = types.SimpleNamespace(
        memory_allocated=lambda i: 1, max_memory_allocated=lambda i: 1, memory_reserved=lambda i: 1
    )
    device = types.SimpleNamespace(get_device=lambda: "gpu:0", cuda=cuda)
    monkeypatch.setitem(sys.modules, "paddle", types.SimpleNamespace(device=device))
    families = list(registry.collect())
    samples = {sample.name for family in families for sample in family.samples}
    return samples, {family.name for family in families}


def test_every_family_of_the_worker_has_samples(exported: tuple[set[str], set[str]]) -> None:
    samples, families = exported
    assert {f for f in families if not any(s.startswith(f) for s in samples)} == set()
    assert {"sentiment_results_published_total", "sentiment_device_memory_peak_bytes"} <= samples
    assert {"sentiment_end_to_end_latency_seconds_bucket", "process_resident_memory_bytes"} <= samples


def test_dashboard_and_alerts_query_only_series_the_worker_exports(
    exported: tuple[set[str], set[str]],
) -> None:
    samples, _ = exported
    queries = {f"dashboard: {q}": names for q, names in dashboard_queries().items()}
    queries |= {f"alert {a}": names for a, names in alert_queries().items()}
    assert all(queries.values()), [q for q, names in queries.items() if not names]
    unknown = {q: sorted(names - samples - PROMETHEUS_SERIES) for q, names in queries.items()}
    assert {q: names for q, names in unknown.items() if names} == {}


def test_readme_docs_and_operator_commands_mention_only_exported_metrics(
    exported: tuple[set[str], set[str]],
) -> None:
    samples, families = exported
    texts = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    code = sorted((REPO / "worker/tools").rglob("*.py")) + sorted((REPO / "worker/bench").rglob("*.py"))
    mentioned = {path: _mentions(path.read_text(encoding="utf-8")) for path in texts}
    for path in code:  # quoted whole names only: `"sentiment_dead_letters_total"`, not a prefix or a module
        quoted = re.findall(r"[\"'](sentiment_[a-z_]+)[\"']", path.read_text(encoding="utf-8"))
        mentioned[path] = set(quoted)
    assert mentioned[REPO / "README.md"], "the README names no metric: the pattern is wrong"
    unknown = {str(p.relative_to(REPO)): sorted(n - samples - families) for p, n in mentioned.items()}
    assert {p: names for p, names in unknown.items() if names} == {}
