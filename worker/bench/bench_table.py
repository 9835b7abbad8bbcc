"""`bench`'s printed table: the report's phases, one row each, then each target with its verdict; and
`bench --host-ceiling`'s."""

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
            f"{batch_cap(report['max_batch_size'])}, window {report['max_window_messages']}",
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


def format_host_ceiling_table(report: dict[str, Any]) -> str:
    """`bench --host-ceiling`'s report as a table: the rates, their ratio, CPU µs per review per thread
    role, the targets (the JSON has every thread and every round)."""
    host, anchor, model = report["host_ceiling"], report["anchor"], report["model"]

    def fmt(value: Any, spec: str = ",.1f") -> str:
        return "n/a" if value is None else f"{value:{spec}}"

    def ok(phase: dict[str, Any]) -> str:
        return "ok" if phase["conservation"]["ok"] else "BROKEN"

    rounds = ", ".join("–" if r is None else f"{r:.1%}" for r in report["host_vs_anchor_by_round"])
    anchor_cpu = anchor["cpu_us_per_review"]
    named = "yes" if model["every_result_names_identity"] else "NO"
    rows = [
        (
            "model",
            f"{' / '.join(model['in_results']) or model['name']} (NO INFERENCE; tokenizer of "
            f"{model['tokenizer_from']}; every result names it: {named})",
        ),
        (
            "worker shape",
            f"window {report['max_window_messages']}, wait {report['max_wait_ms']} ms, "
            f"{batch_cap(report['max_batch_size'])}, {report['max_batch_tokens']} padded tokens",
        ),
        ("cpu", report["machine"]["cpu_description"]),
        (
            "host ceiling",
            f"{fmt(host['messages_per_second'])} msg/s ({host['messages']} reviews through the broker, "
            f"{_drains(host['rates_of_every_drain'], fmt)}"
            f"{_steady(host.get('steady_messages_per_second'), fmt)}conservation {ok(host)})",
        ),
        (
            "anchor",
            f"{fmt(anchor['messages_per_second'])} msg/s ({anchor['messages']} reviews: {anchor['loop']}; "
            f"{_drains(anchor['rates_of_every_drain'], fmt)}conservation {ok(anchor)})",
        ),
        ("host / anchor", f"{fmt(report['host_vs_anchor'], '.1%')} (median of rounds: {rounds})"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines.append("")
    threads = host["threads"]
    if threads is None:
        lines.append("CPU per review: too few samples while the backlog drained (raise --messages)")
    else:
        window = threads["window"]
        lines.append(
            f"worker CPU µs per review, steady drain (results {window['from_done']:.0f} to "
            f"{window['to_done']:.0f}, {window['seconds']:.1f} s):"
        )
        lines.append(f"  {'thread role':<16} {'threads':>7} {'µs/review':>10}  names")
        for role, figures in threads["roles"].items():
            names = ", ".join(figures["names"])
            lines.append(f"  {role:<16} {figures['threads']:>7} {figures['us_per_review']:>10.1f}  {names}")
        lines.append(f"  {'total':<16} {len(threads['threads']):>7} {threads['total_us_per_review']:>10.1f}")
        lines.append(
            f"  anchor: loop thread {fmt(anchor_cpu['loop_thread'])} µs/review, whole process "
            f"{fmt(anchor_cpu['process'])} µs/review"
        )
    lines.append("")
    lines.append(f"{'target':<20} {'measured':>10} {'wanted':>10}  verdict")
    for name, target in report["targets"].items():
        show = (lambda v: f"{v:.1%}") if name == "host_vs_anchor" else (lambda v: f"{v:.1f} µs")
        shown = "n/a" if target["value"] is None else show(target["value"])
        wanted = f"{'>=' if target['at_least'] else '<='} {show(target['target'])}"
        verdict = {True: "met", False: "MISSED", None: "n/a"}[target["met"]]
        lines.append(f"{name:<20} {shown:>10} {wanted:>10}  {verdict}")
    return "\n".join(lines)


def batch_cap(max_batch_size: int | None) -> str:
    """How a report's batches were capped by count: "batch <= 32", or none (a GPU's token budget alone)."""
    return "no batch count cap" if max_batch_size is None else f"batch <= {max_batch_size}"
