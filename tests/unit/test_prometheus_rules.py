"""The Prometheus files checked by Prometheus' own promtool: the configuration (with the rule file it names,
relative to itself), the alert rules, and deploy/prometheus/alerts_test.yml, in which every alert fires on
a synthetic bad series and stays silent on a healthy one. promtool comes from Debian's `prometheus` package
(`make prometheus-tools`); without it these tests fail, they do not skip."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring_assets import DASHBOARD, promql_metric_names

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy/prometheus"
CONFIG, ALERTS, ALERT_TESTS = (PROMETHEUS / n for n in ("prometheus.yml", "alerts.yml", "alerts_test.yml"))


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _rules() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in _yaml(ALERTS)["groups"] for rule in group["rules"]}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make prometheus-tools` installs it (Debian's prometheus package)")
    # The label-mix tests evaluate every rule each minute over 26 hours: seconds of CPU, minutes under load.
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_promtool_accepts_the_repository_config_and_the_rule_file_it_names(tmp_path: Path) -> None:
    # From an unrelated directory: the rule path resolves against the config file, as in the container.
    run = _promtool("check", "config", str(CONFIG), cwd=tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "SUCCESS: 1 rule files found" in output
    assert f"Checking {ALERTS}" in output and f"SUCCESS: {len(_rules())} rules found" in output


def test_promtool_accepts_the_alert_rules(tmp_path: Path) -> None:
    run = _promtool("check", "rules", str(ALERTS), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in run.stdout


def test_promtool_unit_tests_of_the_alerts_pass(tmp_path: Path) -> None:
    run = _promtool("test", "rules", str(ALERT_TESTS), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


# ----- every alert has a firing and a silent case -----
def _duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|[smhd])", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(float(n) * units[u] for n, u in parts)


def _series_name(series: str) -> str:
    match = re.match(r"\s*([A-Za-z_:][A-Za-z0-9_:]*)", series)
    assert match, series
    return match.group(1)


def coverage_gaps(rules: dict[str, dict[str, Any]], tests: dict[str, Any]) -> list[str]:
    """What the alert tests lack: an alert without a case where it fires (non-empty `exp_alerts`) or without
    one where it stays silent (empty `exp_alerts`) on series of the metrics it reads, evaluated no earlier
    than it first fires in its firing case (so the silence is not just its `for:` still pending); and test
    cases naming an alert that does not exist."""
    fired: dict[str, list[float]] = {}
    silent: dict[str, list[float]] = {}
    for group in tests["tests"]:
        fed = {_series_name(s["series"]) for s in group.get("input_series", [])}
        for case in group.get("alert_rule_test", []):
            name = case["alertname"]
            when = _duration_s(case["eval_time"])
            if case.get("exp_alerts"):
                fired.setdefault(name, []).append(when)
            elif name in rules and fed & promql_metric_names(rules[name]["expr"]):
                silent.setdefault(name, []).append(when)
    gaps = [f"{name}: no case where it fires" for name in rules if name not in fired]
    gaps += [
        f"{name}: no case where it stays silent on a healthy series (after it would have fired)"
        for name in rules
        if name in fired and not any(t >= min(fired[name]) for t in silent.get(name, []))
    ]
    named = {c["alertname"] for g in tests["tests"] for c in g.get("alert_rule_test", [])}
    gaps += [f"{name}: tested but not in alerts.yml" for name in sorted(named - set(rules))]
    return gaps


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    tests = _yaml(ALERT_TESTS)
    assert tests["rule_files"] == [ALERTS.name]
    rules = _rules()
    assert len(rules) >= 8
    assert coverage_gaps(rules, tests) == []


def test_coverage_check_reports_a_new_alert_without_tests() -> None:
    tests, rules = _yaml(ALERT_TESTS), _rules()
    rules["SentimentSomethingNew"] = {"alert": "SentimentSomethingNew", "expr": "sentiment_ready > 1"}
    assert coverage_gaps(rules, tests) == ["SentimentSomethingNew: no case where it fires"]

    # A silent case only while the alert is still pending does not count as a healthy series.
    lag = "SentimentLagSecondsHigh"
    only_pending = {
        "tests": [
            g
            for g in tests["tests"]
            if any(c["alertname"] == lag for c in g.get("alert_rule_test", []))
            and any(c.get("exp_alerts") for c in g["alert_rule_test"])
        ]
    }
    assert f"{lag}: no case where it stays silent on a healthy series (after it would have fired)" in (
        coverage_gaps({lag: rules[lag]}, only_pending)
    )


# ----- the dashboard's stat panels, evaluated by promtool -----
def _stat_expr(title: str) -> str:
    """A stat panel's query with Grafana's variables filled in as for one scrape interval on all workers."""
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    (panel,) = [p for p in panels if p["title"] == title and p["type"] == "stat"]
    (target,) = panel["targets"]
    return str(target["expr"]).replace("$instance", ".*").replace("$__rate_interval", "2m")


def test_throughput_and_dead_letter_share_show_a_number_before_the_first_dead_letter(tmp_path: Path) -> None:
    # A labelled counter is exported from its first event on: a worker that never dead-lettered has no
    # sentiment_dead_letters_total series, and `results + dead letters` must not become "No data".
    worker = 'instance="worker-1:9108", job="sentiment-worker"'
    group = {
        "interval": "1m",
        "input_series": [
            {"series": f'sentiment_results_published_total{{{worker}, topic="out"}}', "values": "0+60x10"}
        ],
        "promql_expr_test": [
            {
                "expr": _stat_expr("Throughput"),
                "eval_time": "10m",
                "exp_samples": [{"labels": "{}", "value": 1}],
            },
            {
                "expr": _stat_expr("Dead-letter share"),
                "eval_time": "10m",
                "exp_samples": [{"labels": "{}", "value": 0}],
            },
        ],
    }
    tests = tmp_path / "dashboard_test.yml"
    tests.write_text(yaml.safe_dump({"rule_files": [], "tests": [group]}), encoding="utf-8")
    run = _promtool("test", "rules", str(tests), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_shadow_agreement_panel_shows_the_diagonal_over_all_reviews_by_shadow_version(
    tmp_path: Path,
) -> None:
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    (panel,) = [p for p in panels if p["title"] == "Shadow agreement"]
    agreement = panel["targets"][0]["expr"].replace("$instance", ".*").replace("$__rate_interval", "2m")
    worker = 'instance="worker-1:9108", job="sentiment-worker", shadow_version="7"'
    per_minute = {("negative", "negative"): 4, ("positive", "negative"): 4}  # half agree
    series = [
        {
            "series": f'sentiment_shadow_predictions_total{{{worker}, primary_label="{p}", '
            f'shadow_label="{s}"}}',
            "values": f"0+{n}x10",
        }
        for (p, s), n in per_minute.items()
    ]
    series.append({"series": f"sentiment_shadow_agreeing_total{{{worker}}}", "values": "0+4x10"})
    expected = [{"labels": '{shadow_version="7"}', "value": 0.5}]
    group = {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [{"expr": agreement, "eval_time": "10m", "exp_samples": expected}],
    }
    tests = tmp_path / "dashboard_test.yml"
    tests.write_text(yaml.safe_dump({"rule_files": [], "tests": [group]}), encoding="utf-8")
    run = _promtool("test", "rules", str(tests), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
