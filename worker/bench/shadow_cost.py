"""`sentiment-worker bench --shadow DIR`: what a shadow costs the primary, on a real worker process draining a
backlog through the real broker.

Pairs of drains of the same reviews by the configured primary: one without a shadow, one with DIR as the
shadow. The shadow reaches the worker as `models shadow DIR` sends it, through its group's control topic
(written before the worker starts: a replica serves what the topic says from its first window). The order
alternates pair by pair (off-on, on-off, …) so that a drift of the host's speed falls on both arms. Per
drain (fresh topics and group each):
- reviews/s: the backlog over first consume → the last result's broker append time (as `bench`'s drains);
- CPU seconds per review: the process's CPU time (all threads: the primary, the shadow, the Kafka clients)
  from the first result until every review has its result and the shadow's last groups are done, over the
  reviews done in that time (model loading and warm-up left out);
- the primary's latency p50/p95: consume → result produced (`processing_time_ms` of each result): time in
  the worker, what a shadow could delay (a backlog drain: the time waiting in the topic is not counted);
- the shadow's groups shadowed / skipped (its /metrics, `sentiment_shadow_groups_total`), and that the
  results name the primary only.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

from schemas.control import ModelChoice
from worker.bench.bench import latency_percentiles, review_texts
from worker.bench.live_control import (
    create_control_topics,
    metric_labels,
    metric_value,
    model_choice,
    write_desired,
)
from worker.bench.options import DrainOptions
from worker.bench.topic_io import (
    delete_run_topics,
    drain_seconds,
    phase_topics,
    produce_backlog,
    read_drain,
)
from worker.bench.worker_process import (
    WorkerProcess,
    WorkerProcessError,
    cpu_seconds,
    rss_bytes,
    start_worker,
)
from worker.config import WorkerSettings

__all__ = ["ShadowBenchOptions", "format_shadow_table", "run_shadow_bench", "shadow_conserved"]

_DONE = ("sentiment_results_published_total", "sentiment_dead_letters_total")


@dataclass(frozen=True)
class ShadowBenchOptions(DrainOptions):
    """`messages` reviews per drain, `pairs` pairs of drains (without and with the shadow); `settle_s`: at
    most this long for the shadow's last groups after the primary's last result."""

    messages: int = 3000
    pairs: int = 3
    sample_interval_s: float = 0.5
    settle_s: float = 60.0
    worker_timeout_s: float = 3600.0

    # Small sizes for a smoke run.
    QUICK: ClassVar[dict[str, Any]] = {
        "messages": 400,
        "pairs": 1,
        "worker_timeout_s": 300.0,
        "settle_s": 20.0,
    }


def _done(scrape: dict[str, float]) -> float:
    return sum(metric_value(scrape, name) for name in _DONE)


def _shadow_groups(scrape: dict[str, float]) -> dict[str, int]:
    return {
        outcome: int(metric_value(scrape, "sentiment_shadow_groups_total", outcome=outcome))
        for outcome in ("shadowed", "skipped")
    }


def watch_drain(
    worker: WorkerProcess, total: int, options: ShadowBenchOptions, shadowed: bool
) -> dict[str, Any]:
    """Samples `worker` (its /metrics, RSS, CPU) until `total` inputs have a result or dead letter, then,
    with a shadow, until its groups stop changing (at most `settle_s`). Its CPU and the reviews done from
    the first result on, its peak RSS, the last scrape."""
    started = time.monotonic()
    first: tuple[float, float] | None = None  # (CPU s, done) at the first sample with a result
    peak, scrape = 0, dict[str, float]()
    while True:
        if not worker.alive():
            raise WorkerProcessError(f"{worker.name} exited while draining:\n{worker.stderr_tail()}")
        if time.monotonic() - started > options.worker_timeout_s:
            raise WorkerProcessError(f"{worker.name} did not drain {total} reviews in time")
        now = worker.metrics() or scrape
        scrape = now
        cpu, rss, done = cpu_seconds(worker.pid), rss_bytes(worker.pid), _done(scrape)
        peak = max(peak, rss or 0)
        if first is None and done > 0 and cpu is not None:
            first = (cpu, done)
        if done >= total:
            break
        time.sleep(options.sample_interval_s)
    drained_s = time.monotonic() - started
    if shadowed:  # the shadow runs behind the primary: its last groups finish after the last result
        deadline, last = time.monotonic() + options.settle_s, None
        while time.monotonic() < deadline:
            groups = _shadow_groups(scrape)
            if groups == last:
                break
            last = groups
            time.sleep(max(options.sample_interval_s, 0.5))
            scrape = worker.metrics() or scrape
    cpu_end = cpu_seconds(worker.pid)
    per_review = None
    if first is not None and cpu_end is not None and total > first[1]:
        per_review = (cpu_end - first[0]) / (total - first[1])
    return {
        "cpu_s_per_review": per_review,
        "cpu_counted_reviews": int(total - first[1]) if first is not None else 0,
        "rss_peak_bytes": peak or None,
        "watched_s": round(drained_s, 2),
        "scrape": scrape,
    }


def drain_arm(
    settings: WorkerSettings,
    texts: Sequence[str],
    options: ShadowBenchOptions,
    prefix: str,
    phase: str,
    workdir: Path,
    shadow: ModelChoice | None,
) -> dict[str, Any]:
    """One drain of `texts` by a fresh worker of a fresh group, `shadow` on its control topic (None: a
    control topic without a desired state: the configured primary alone)."""
    common = settings.librdkafka_common()
    names = phase_topics(common, prefix, phase, options.partitions)
    control = create_control_topics(common, names["group"])
    if shadow is not None:
        write_desired(common, control, primary=None, shadow=shadow, by="bench --shadow")
    produce_backlog(common, names["reviews"], texts, "m")
    worker = start_worker(settings, names, None, workdir)
    try:
        watched = watch_drain(worker, len(texts), options, shadow is not None)
    except BaseException:
        worker.stop()
        raise
    worker.terminate()  # a clean stop: it flushes and commits, prints its summary
    summary = worker.finish(120)
    results, dead, check = read_drain(common, names, len(texts), summary)
    seconds = drain_seconds(results)
    scrape = watched.pop("scrape")
    primary = metric_labels(scrape, "sentiment_model_info")
    shadow_model = metric_labels(scrape, "sentiment_shadow_model_info")
    return {
        "phase": phase,
        "shadow": shadow is not None,
        "messages": len(texts),
        "results": len(results),
        "dead_letters": len(dead),
        "seconds": round(seconds, 3),
        "messages_per_second": round(len(texts) / seconds, 1) if seconds > 0 else None,
        "latency_ms": latency_percentiles([float(r["processing_time_ms"]) for r, _ in results]),
        "latency_measured_as": "consume → result produced (processing_time_ms), backlog drain",
        "shadow_groups": _shadow_groups(scrape) if shadow is not None else None,
        "primary_model": primary[0] if primary else None,
        "shadow_model": shadow_model[0] if shadow_model else None,
        "models_in_results": sorted({" ".join(r["model"].values()) for r, _ in results}),
        "conservation": check,
        "worker_summary": summary,
        **watched,
    }


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def side_summary(arms: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The medians of one side's drains (and each drain's own figures, in run order)."""
    summary: dict[str, Any] = {
        "drains": len(arms),
        "messages_per_second": _median([a["messages_per_second"] for a in arms]),
        "cpu_s_per_review": _median([a["cpu_s_per_review"] for a in arms]),
        "latency_ms_p50": _median([a["latency_ms"]["p50"] for a in arms]),
        "latency_ms_p95": _median([a["latency_ms"]["p95"] for a in arms]),
        "rates_of_every_drain": [a["messages_per_second"] for a in arms],
        "results_of_every_drain": [a["results"] + a["dead_letters"] for a in arms],
    }
    if arms and arms[0]["shadow_groups"] is not None:
        summary["shadow_groups_shadowed"] = sum(a["shadow_groups"]["shadowed"] for a in arms)
        summary["shadow_groups_skipped"] = sum(a["shadow_groups"]["skipped"] for a in arms)
    return summary


def run_shadow_bench(
    settings: WorkerSettings,
    shadow_dir: Path,
    options: ShadowBenchOptions,
    *,
    say: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """`options.pairs` pairs of drains, without and with `shadow_dir` as the shadow, alternated; the report
    (`format_shadow_table` prints it)."""
    shadow = model_choice(shadow_dir)  # refused here, before any topic is made, when it fails the checks
    prefix = f"bench-shadow-{datetime.now(timezone.utc):%Y%m%d%H%M%S}-{os.getpid()}"
    texts = review_texts(options.messages, options.seed)
    report: dict[str, Any] = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "primary": settings.model,
        "shadow": {"path": shadow.path, "content_hash": shadow.content_hash},
        "options": asdict(options),
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
    }
    arms: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sentiment-bench-shadow-") as tmp:
        try:
            for pair in range(options.pairs):
                order = (False, True) if pair % 2 == 0 else (True, False)
                for with_shadow in order:
                    state = "on" if with_shadow else "off"
                    phase = f"p{pair}-{state}"
                    say(f"pair {pair + 1} of {options.pairs}: {len(texts)} reviews, shadow {state}")
                    arm = drain_arm(
                        settings, texts, options, prefix, phase, Path(tmp), shadow if with_shadow else None
                    )
                    arm["pair"] = pair
                    arms.append(arm)
                    say(f"  {arm['messages_per_second']} reviews/s, CPU {arm['cpu_s_per_review']} s/review")
        finally:
            if not options.keep_topics:
                report["deleted_topics"] = delete_run_topics(settings.librdkafka_common(), prefix)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    report["arms"] = arms
    without = side_summary([a for a in arms if not a["shadow"]])
    with_ = side_summary([a for a in arms if a["shadow"]])
    report["without_shadow"], report["with_shadow"] = without, with_
    rates = {(a["pair"], a["shadow"]): a["messages_per_second"] for a in arms}
    pair_ratios = [
        rates[pair, True] / rates[pair, False]
        for pair in range(options.pairs)
        if rates[pair, True] and rates[pair, False]
    ]
    report["with_vs_without"] = {
        "rate_ratio_median_of_pairs": round(statistics.median(pair_ratios), 4) if pair_ratios else None,
        "rate_ratio_by_pair": [round(r, 4) for r in pair_ratios],
        "cpu_per_review_ratio": _ratio(with_["cpu_s_per_review"], without["cpu_s_per_review"]),
    }
    return report


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def shadow_conserved(report: dict[str, Any]) -> bool:
    """Every drain gave every input one result or dead letter, and published the primary's results only."""
    return all(arm["conservation"]["ok"] and len(arm["models_in_results"]) == 1 for arm in report["arms"])


def format_shadow_table(report: dict[str, Any]) -> str:
    """The shadow bench as a small Markdown table."""
    off, on = report["without_shadow"], report["with_shadow"]
    arm = report["arms"][0]
    shadow_arm = next(a for a in report["arms"] if a["shadow"])
    primary, shadow = arm["primary_model"] or {}, shadow_arm["shadow_model"] or {}

    def num(value: float | None, spec: str) -> str:
        return "–" if value is None else format(value, spec)

    def row(name: str, a: float | None, b: float | None, spec: str) -> str:
        return f"| {name} | {num(a, spec)} | {num(b, spec)} |"

    ratio = report["with_vs_without"]
    lines = [
        f"primary {report['primary']} ({primary.get('name', '?')} {primary.get('version', '?')}), shadow "
        f"{report['shadow']['path']} ({shadow.get('name', '?')} {shadow.get('version', '?')}); "
        f"{len(report['arms']) // 2} alternated pairs of {arm['messages']} reviews",
        "",
        "| median of the drains | without shadow | with shadow | with / without |",
        "|---|---:|---:|---:|",
        row("reviews/s", off["messages_per_second"], on["messages_per_second"], ".1f")
        + f" {num(ratio['rate_ratio_median_of_pairs'], '.3f')} (median of pairs) |",
        row("CPU s per review", off["cpu_s_per_review"], on["cpu_s_per_review"], ".4f")
        + f" {num(ratio['cpu_per_review_ratio'], '.3f')} |",
        row("primary latency p50, ms", off["latency_ms_p50"], on["latency_ms_p50"], ".0f") + " |",
        row("primary latency p95, ms", off["latency_ms_p95"], on["latency_ms_p95"], ".0f") + " |",
        f"| shadow groups shadowed / skipped | – | {on.get('shadow_groups_shadowed')} / "
        f"{on.get('shadow_groups_skipped')} | |",
        "",
        f"every drain, reviews/s: without {off['rates_of_every_drain']}, with {on['rates_of_every_drain']}; "
        f"pair ratios {ratio['rate_ratio_by_pair']}",
        f"latency: {arm['latency_measured_as']}; every input one result or dead letter, primary's results "
        f"only: {'yes' if shadow_conserved(report) else 'NO'}",
    ]
    return "\n".join(lines)
