"""The metric names the monitoring assets query: the Grafana dashboard's panels and variables and the
Prometheus alert rules. Shared by tests/unit/test_metric_names.py (against the worker's registry) and
tests/integration/test_deploy_metrics.py (against a running worker's /metrics)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
DASHBOARD = DEPLOY / "grafana/dashboards/sentiment-worker.json"
ALERTS = DEPLOY / "prometheus/alerts.yml"

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (functions, keywords, labels, numbers and variables removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\$\w+", "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"(?<![\w.])\d+(\.\d+)?([eE][-+]?\d+)?(ms|[smhdwy])?", "0", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[match.end() :].lstrip().startswith("(") or match.group(0).lower() in _KEYWORDS:
            continue
        names.add(match.group(0))
    return names


def dashboard_queries() -> dict[str, set[str]]:
    """{panel / refId or variable: metric names} of the Grafana dashboard."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = {
        f"{panel['title']} / {target['refId']}": promql_metric_names(target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    }
    for variable in dashboard["templating"]["list"]:
        (metric,) = re.findall(r"label_values\((\w+),", variable["definition"])
        queries[f"variable {variable['name']}"] = {metric}
    return queries


def alert_queries() -> dict[str, set[str]]:
    """{alert name: metric names of its expression} of deploy/prometheus/alerts.yml."""
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return {rule["alert"]: promql_metric_names(rule["expr"]) for g in groups for rule in g["rules"]}
