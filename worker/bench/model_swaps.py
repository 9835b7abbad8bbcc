"""`sentiment-worker bench --swaps N`: the memory of one worker process whose primary is swapped back and
forth N times while it drains, A → B → A …, each swap written to its group's control topic as `models promote`
writes it (A: the configured model, named by its directory; B: `--swap-with DIR`).

The worker is kept busy: reviews are produced in chunks (round robin over the partitions) whenever fewer than
half a chunk wait for it. Its RSS (/proc/<pid>/status VmRSS) is read after the first model labelled for
`dwell_s` (before), `settle_s` after each swap took effect (its
/metrics: `sentiment_model_changes_total{role="primary",outcome="applied"}` counts it and
`sentiment_model_info` names the model served; the replaced model's engine closes once its windows are done
and its memory is released), and at the end, once every review produced has its result; the drift is end −
before. The results are read back: every input one result or dead letter, and each partition's results
change model version in the order of the swaps, never back.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

from confluent_kafka import Producer

from worker.bench.bench import review_texts
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
    phase_topics,
    read_drain,
)
from worker.bench.worker_process import WorkerProcess, WorkerProcessError, rss_bytes, start_worker
from worker.config import WorkerSettings

__all__ = ["SwapBenchOptions", "format_swaps_table", "run_swaps_bench", "swaps_conserved"]

MB = 1024 * 1024


@dataclass(frozen=True)
class SwapBenchOptions(DrainOptions):
    """`swaps` promotes, alternately to `swap_with` and back; `dwell_s` of draining on each model;
    `chunk` reviews produced at a time; `settle_s` between a swap taking effect (or the drain's end) and the
    RSS read."""

    swap_with: str = "models/fast"
    swaps: int = 3
    chunk: int = 400
    dwell_s: float = 20.0
    settle_s: float = 3.0
    sample_interval_s: float = 0.5
    swap_timeout_s: float = 300.0

    # Small sizes for a smoke run.
    QUICK: ClassVar[dict[str, Any]] = {"chunk": 100, "dwell_s": 2.0, "settle_s": 1.0, "swap_timeout_s": 120.0}


class _Feed:
    """The reviews produced so far (`m-0` … `m-<produced-1>`), topped up a chunk at a time."""

    def __init__(self, common: dict[str, Any], topic: str, texts: list[str], partitions: int) -> None:
        self._producer = Producer({**common, "linger.ms": 5, "enable.idempotence": True})
        self._topic, self._texts, self._partitions = topic, texts, partitions
        self.produced = 0
        self.open = True

    def top_up(self, done: float, chunk: int) -> None:
        """A chunk more when fewer than half a chunk wait (and the feed is open)."""
        if not self.open or self.produced - done >= chunk / 2:
            return
        for i in range(self.produced, self.produced + chunk):
            text = self._texts[i % len(self._texts)]
            value = json.dumps({"id": f"m-{i}", "text": text}, ensure_ascii=False).encode()
            # Round robin: every partition gets reviews on each model (keyless records stick to one).
            self._producer.produce(self._topic, value=value, partition=i % self._partitions)
            self._producer.poll(0)
        self.produced += chunk
        if self._producer.flush(60):
            raise WorkerProcessError("the swap bench could not produce its reviews")


class _Watch:
    """Drives one worker: samples /metrics and RSS every `interval_s`, keeps the feed topped up."""

    def __init__(self, worker: WorkerProcess, feed: _Feed, options: SwapBenchOptions) -> None:
        self.worker, self.feed, self.options = worker, feed, options
        self.scrape: dict[str, float] = {}
        self.series: list[list[Any]] = []  # [s since start, RSS bytes, reviews done, model version]
        self.started = time.monotonic()

    def done(self) -> float:
        return metric_value(self.scrape, "sentiment_results_published_total") + metric_value(
            self.scrape, "sentiment_dead_letters_total"
        )

    def served(self) -> dict[str, str]:
        info = metric_labels(self.scrape, "sentiment_model_info")
        return info[0] if info else {}

    def applied(self) -> int:
        return int(
            metric_value(self.scrape, "sentiment_model_changes_total", role="primary", outcome="applied")
        )

    def refused(self) -> int:
        return int(
            metric_value(self.scrape, "sentiment_model_changes_total", role="primary", outcome="refused")
        )

    def sample(self) -> int | None:
        if not self.worker.alive():
            raise WorkerProcessError(f"{self.worker.name} exited:\n{self.worker.stderr_tail()}")
        self.scrape = self.worker.metrics() or self.scrape
        rss = rss_bytes(self.worker.pid)
        if rss is not None:
            self.series.append(
                [
                    round(time.monotonic() - self.started, 2),
                    rss,
                    int(self.done()),
                    self.served().get("version"),
                ]
            )
        self.feed.top_up(self.done(), self.options.chunk)
        return rss

    def until(self, done: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Samples until `done()`; the seconds it took (WorkerProcessError after `timeout_s`)."""
        started = time.monotonic()
        while True:
            self.sample()
            if done():
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise WorkerProcessError(
                    f"{what}: not within {timeout_s:.0f} s:\n{self.worker.stderr_tail()}"
                )
            time.sleep(self.options.sample_interval_s)

    def wait(self, seconds: float) -> int:
        """Samples for `seconds`; the RSS read at its end."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.sample()
            time.sleep(min(self.options.sample_interval_s, max(0.0, end - time.monotonic())))
        rss = self.sample()
        if rss is None:
            raise WorkerProcessError(f"cannot read the RSS of {self.worker.name}")
        return rss


def _point(label: str, watch: _Watch, rss: int, **extra: Any) -> dict[str, Any]:
    served = watch.served()
    return {
        "sample": label,
        "served": f"{served.get('name', '?')} {served.get('version', '?')}",
        "served_version": served.get("version"),
        "rss_bytes": rss,
        "reviews_done": int(watch.done()),
        **extra,
    }


def run_swaps_bench(
    settings: WorkerSettings, options: SwapBenchOptions, *, say: Callable[[str], None] = lambda _line: None
) -> dict[str, Any]:
    """One worker, `options.swaps` swaps of its primary while it drains; the report (`format_swaps_table`)."""
    first, other = model_choice(Path(settings.model)), model_choice(Path(options.swap_with))
    if first.content_hash == other.content_hash:
        raise WorkerProcessError(
            f"{settings.model} and {options.swap_with} are the same model: nothing to swap"
        )
    prefix = f"bench-swaps-{datetime.now(timezone.utc):%Y%m%d%H%M%S}-{os.getpid()}"
    common = settings.librdkafka_common()
    report: dict[str, Any] = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model_a": {"path": first.path, "content_hash": first.content_hash},
        "model_b": {"path": other.path, "content_hash": other.content_hash},
        "options": asdict(options),
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
    }
    with tempfile.TemporaryDirectory(prefix="sentiment-bench-swaps-") as tmp:
        try:
            names = phase_topics(common, prefix, "swaps", options.partitions)
            control = create_control_topics(common, names["group"])
            texts = review_texts(20_000, options.seed)
            feed = _Feed(common, names["reviews"], texts, options.partitions)
            worker = start_worker(settings, names, None, Path(tmp))
            try:
                points = _swap_and_sample(worker, feed, control, common, (first, other), options, say)
            except BaseException:
                worker.stop()
                raise
            worker.terminate()  # a clean stop: flush, commit, its summary
            report["worker_summary"] = worker.finish(120)
            report.update(points)
            report["produced"] = feed.produced
            report.update(_read_back(common, names, feed.produced, report["worker_summary"]))
        finally:
            if not options.keep_topics:
                report["deleted_topics"] = delete_run_topics(common, prefix)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    before, end = report["points"][0]["rss_bytes"], report["points"][-1]["rss_bytes"]
    report["rss_drift_bytes"] = end - before
    report["rss_drift_share"] = round((end - before) / before, 4)
    return report


def _swap_and_sample(
    worker: WorkerProcess,
    feed: _Feed,
    control: str,
    common: dict[str, Any],
    models: tuple[Any, Any],
    options: SwapBenchOptions,
    say: Callable[[str], None],
) -> dict[str, Any]:
    watch = _Watch(worker, feed, options)
    watch.until(lambda: watch.done() > 0 and bool(watch.served()), 600, "the worker's first results")
    # Before: after the first model labelled for a dwell, as each model does before the next swap.
    points = [_point("before", watch, watch.wait(max(options.dwell_s, options.settle_s)))]
    say(f"before: {points[0]['served']}, RSS {points[0]['rss_bytes'] / MB:.0f} MB")
    for swap in range(1, options.swaps + 1):
        target = models[swap % 2]
        write_desired(common, control, primary=target, shadow=None, by="bench --swaps")

        def taken(n: int = swap) -> bool:
            return watch.applied() >= n or watch.refused() > 0

        took = watch.until(taken, options.swap_timeout_s, f"swap {swap}")
        if watch.refused():
            raise WorkerProcessError(f"swap {swap} to {target.path} was refused:\n{worker.stderr_tail()}")
        rss = watch.wait(options.settle_s)
        points.append(_point(f"swap {swap} → {target.path}", watch, rss, took_s=round(took, 2)))
        say(f"swap {swap}: {points[-1]['served']} in {took:.1f} s, RSS {rss / MB:.0f} MB")
        points[-1]["rss_end_of_dwell_bytes"] = watch.wait(max(0.0, options.dwell_s - options.settle_s))
    feed.open = False
    watch.until(lambda: watch.done() >= feed.produced, 600, "the last reviews")
    points.append(_point("end", watch, watch.wait(options.settle_s)))
    say(f"end: RSS {points[-1]['rss_bytes'] / MB:.0f} MB after {feed.produced} reviews")
    return {"points": points, "rss_series": watch.series}


def _read_back(
    common: dict[str, Any], names: dict[str, str], produced: int, summary: dict[str, Any]
) -> dict[str, Any]:
    """Conservation by id, and each input partition's result model versions in offset order, each version
    once per run of it."""
    drained, dead, check = read_drain(common, names, produced, summary)
    results = [r for r, _ in drained]
    by_partition: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for r in results:
        by_partition[r["source"]["partition"]].append((r["source"]["offset"], r["model"]["version"]))
    switches: dict[str, list[str]] = {}
    for partition, rows in sorted(by_partition.items()):
        versions = [v for _, v in sorted(rows)]
        switches[str(partition)] = [v for i, v in enumerate(versions) if i == 0 or versions[i - 1] != v]
    return {
        "results": len(results),
        "dead_letters": len(dead),
        "conservation": check,
        "versions_by_partition": switches,
    }


def swaps_conserved(report: dict[str, Any]) -> bool:
    """Every input one result or dead letter; the served model alternated at each swap; each partition's
    results switched version only in the order of the swaps."""
    served = [point["served_version"] for point in report["points"][:-1]]
    alternates = all(served[i] != served[i + 1] for i in range(len(served) - 1)) and all(
        served[i] == served[i + 2] for i in range(len(served) - 2)
    )
    # A partition may start after the first swap (no input before it), never on a model not served.
    in_order = all(
        switches[0] in served
        and switches == served[served.index(switches[0]) : served.index(switches[0]) + len(switches)]
        for switches in report["versions_by_partition"].values()
        if switches
    )
    return bool(report["conservation"]["ok"] and alternates and in_order)


def format_swaps_table(report: dict[str, Any]) -> str:
    """The RSS series and the drift, as a small Markdown table."""

    def mb(value: int | None) -> str:
        return "" if value is None else f"{value / MB:.1f}"

    lines = [
        f"A {report['model_a']['path']} ⇄ B {report['model_b']['path']}: {len(report['points']) - 2} swaps "
        f"while draining {report['produced']} reviews",
        "",
        "| sample | served | RSS MB | RSS MB at the dwell's end | swap took s |",
        "|---|---|---:|---:|---:|",
    ]
    for point in report["points"]:
        took = point.get("took_s")
        lines.append(
            f"| {point['sample']} | {point['served']} | {point['rss_bytes'] / MB:.1f} | "
            f"{mb(point.get('rss_end_of_dwell_bytes'))} | {'' if took is None else f'{took:.1f}'} |"
        )
    peak = max(row[1] for row in report["rss_series"]) if report["rss_series"] else None
    lines += [
        "",
        f"RSS drift (end − before): {report['rss_drift_bytes'] / MB:+.1f} MB "
        f"({report['rss_drift_share']:+.1%}); peak {peak / MB if peak else 0:.1f} MB",
        "every input one result or dead letter, model switched in the order of the swaps: "
        f"{'yes' if swaps_conserved(report) else 'NO'}; versions by partition "
        f"{report['versions_by_partition']}",
    ]
    return "\n".join(lines)
