"""`bench`'s printed table: the report's phases, one row each, then each target with its verdict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _predict_row(
    predict: dict[str, Any] | None, by_round: list[float | None], fmt: Callable[..., str]
) -> str:
    """The `predict` phase in one cell: its marginal rate, the median wall times, each pair's rate, each
    round's drain / pair ratio, conservation."""
    if predict is None:
        return "skipped (--predict-messages 0)"
    short, long = predict["messages"], 2 * predict["messages"]
    t_short, t_long = predict["median_seconds"]
    repeats = predict["repeats"]
    rate = predict["messages_per_second"]
    shown = (
        f"{fmt(rate)} msg/s marginal" if rate is not None else f"no marginal rate: t({long}) <= t({short})"
    )
    runs = f"{repeats} runs each, median " if repeats > 1 else ""
    pairs = predict["pair_rates"]
    spread = (
        "; pairs " + ", ".join("–" if r is None else fmt(r) for r in pairs) + " msg/s"
        if len(pairs) > 1
        else ""
    )
    rounds = (
        "; drain / pair by round " + ", ".join("–" if r is None else f"{r:.1%}" for r in by_round)
        if len(by_round) > 1
        else ""
    )
    return (
        f"{shown} (`predict` on {short} and {long} reviews, {runs}{t_short:.1f} s and {t_long:.1f} s"
        f"{spread}{rounds}; conservation {'ok' if predict['conservation']['ok'] else 'BROKEN'})"
    )


def _drains(rates: list[float], fmt: Callable[..., str]) -> str:
    """The drains' rates when there were several (the row's rate is their median)."""
    if len(rates) < 2:
        return ""
    return f"median of {len(rates)} drains: {', '.join(fmt(rate) for rate in rates)} msg/s; "


def _steady(rate: float | None, fmt: Callable[..., str]) -> str:
    """The kept drain's steady rate (its middle 80 % of results), when known."""
    return "" if rate is None else f"steady (the middle 80 % of results) {fmt(rate)} msg/s; "


def format_table(report: dict[str, Any]) -> str:
    """The report as an aligned table (the JSON has the full detail, e.g. the RSS series)."""
    m, e, n, lat = report["model_only"], report["end_to_end"], report["naive"], report["latency"]
    rss = e["rss"]
    mib = 1024 * 1024

    def fmt(value: Any, spec: str = ",.1f", unit: str = "") -> str:
        return "n/a" if value is None else f"{value:{spec}}{unit}"

    rows = [
        ("model", f"{report['model']['name']} {report['model']['version']} on {report['model']['device']}"),
        (
            "token budget",
            f"{report['max_batch_tokens']} padded tokens ({report['max_batch_tokens_from']}), "
            f"batch <= {report['max_batch_size']}, window {report['max_window_messages']}",
        ),
        (
            "model-only",
            f"{fmt(m['messages_per_second'])} msg/s, {fmt(m['real_tokens_per_second'], ',.0f')} "
            f"tokens/s ({m['messages']} reviews)",
        ),
        (
            "end-to-end",
            f"{fmt(e['messages_per_second'])} msg/s ({e['messages']} reviews through the broker, "
            f"{_drains(e['rates_of_every_drain'], fmt)}"
            f"{_steady(e.get('steady_messages_per_second'), fmt)}"
            f"conservation {'ok' if e['conservation']['ok'] else 'BROKEN'})",
        ),
        ("predict", _predict_row(report.get("predict"), report.get("e2e_vs_predict_by_round", []), fmt)),
        (
            "naive loop",
            f"{fmt(n['messages_per_second'])} msg/s ({n['messages']} reviews, padded to "
            f"{n['padded_to']}, flush per message)",
        ),
        ("padding efficiency", fmt(m["padding_efficiency"], ".1%")),
        (
            "tokenization share",
            f"worker {fmt(e['tokenization_share'], '.1%')}, model-only {fmt(m['tokenization_share'], '.1%')}",
        ),
        (
            "latency",
            f"p50 {fmt(lat['latency_ms']['p50'], ',.0f')} ms, p95 {fmt(lat['latency_ms']['p95'], ',.0f')} "
            f"ms, p99 {fmt(lat['latency_ms']['p99'], ',.0f')} ms at {lat['offered_rate_per_s']:.0f} msg/s "
            f"offered ({lat['messages']} reviews, conservation "
            f"{'ok' if lat['conservation']['ok'] else 'BROKEN'})",
        ),
        (
            "worker RSS",
            f"peak {fmt((rss['peak_bytes'] or 0) / mib, ',.0f')} MiB; while draining "
            f"{fmt((rss['draining_min_bytes'] or 0) / mib, ',.0f')}–"
            f"{fmt((rss['draining_max_bytes'] or 0) / mib, ',.0f')} MiB ({rss['samples']} samples)",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines.append("")
    lines.append(f"{'target':<20} {'measured':>10} {'wanted':>10}  verdict")
    for name, flag in report["targets"].items():
        value = flag["value"]
        show = (lambda v: f"{v:.2f}x") if name == "e2e_vs_naive" else (lambda v: f"{v:.1%}")
        shown = "n/a" if value is None else show(value)
        wanted = f"{'>=' if flag['at_least'] else '<='} {show(flag['target'])}"
        verdict = {True: "met", False: "MISSED", None: "n/a"}[flag["met"]]
        lines.append(f"{name:<20} {shown:>10} {wanted:>10}  {verdict}")
    return "\n".join(lines)
