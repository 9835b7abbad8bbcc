"""Recording a worker's /metrics over time, and rendering the Grafana dashboard's panels from a recording
into a PNG (the `record` and `report` commands) — for where no Prometheus/Grafana runs.

A recording is JSON lines, one scrape per line: {"t": unix seconds, "samples": [[name, {labels}, value]]},
keeping the worker's own metrics (`sentiment_*`) and the process' (`process_*`).
"""

from __future__ import annotations

import itertools
import json
import math
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from worker.errors import ConfigurationError

_KEPT_PREFIXES = ("sentiment_", "process_")
LabelKey = tuple[tuple[str, str], ...]


class ReportError(ConfigurationError):
    """The recording cannot be made or read; the message says why."""


# ----- recording -----
def parse_scrape(text: str, t: float) -> dict[str, Any]:
    """One /metrics text exposition → a recording line (kept metrics only)."""
    samples = [
        [s.name, dict(s.labels), s.value]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(_KEPT_PREFIXES) and not s.name.endswith("_created")
    ]
    return {"t": t, "samples": samples}


def record(
    url: str,
    out: Path,
    *,
    interval_s: float,
    duration_s: float,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = lambda line: None,
) -> int:
    """Scrapes `url` every `interval_s` for `duration_s` seconds into `out`; returns the scrapes written.

    A failed scrape is logged and skipped (the worker may be restarting); Ctrl-C ends the recording early.
    """
    written, started = 0, clock()
    with out.open("w", encoding="utf-8") as sink:
        try:
            while True:
                t = clock()
                try:
                    with urllib.request.urlopen(url, timeout=max(1.0, interval_s)) as response:
                        text = response.read().decode("utf-8")
                except (urllib.error.URLError, OSError) as exc:
                    log(f"scrape of {url} failed: {exc}")
                else:
                    sink.write(json.dumps(parse_scrape(text, t), ensure_ascii=False) + "\n")
                    sink.flush()
                    written += 1
                next_at = t + interval_s
                if next_at - started > duration_s:
                    break
                sleep(max(0.0, next_at - clock()))
        except KeyboardInterrupt:
            log("interrupted: recording ends here")
    return written


# ----- reading -----
@dataclass
class Recording:
    """Scrapes in time order: `times[i]` (unix s) and `samples[i]` {(name, labels): value}."""

    times: list[float] = field(default_factory=list)
    samples: list[dict[tuple[str, LabelKey], float]] = field(default_factory=list)

    @property
    def elapsed(self) -> list[float]:
        """Seconds since the first scrape."""
        return [t - self.times[0] for t in self.times] if self.times else []

    def series(self, name: str) -> dict[LabelKey, list[float]]:
        """Every label set of `name` → its value at each scrape (NaN where absent)."""
        keys = sorted({labels for scrape in self.samples for (n, labels) in scrape if n == name})
        return {key: [scrape.get((name, key), math.nan) for scrape in self.samples] for key in keys}

    def total(self, name: str, where: Callable[[dict[str, str]], bool] = lambda labels: True) -> list[float]:
        """Sum over the label sets of `name` (matching `where`) at each scrape; 0 where none."""
        return [
            sum(v for (n, labels), v in scrape.items() if n == name and where(dict(labels)))
            for scrape in self.samples
        ]


def load_recording(path: Path) -> Recording:
    """Reads a recording written by `record`."""
    recording = Recording()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            scrape = {(str(n), tuple(sorted(labels.items()))): float(v) for n, labels, v in row["samples"]}
            recording.times.append(float(row["t"]))
            recording.samples.append(scrape)
        except (ValueError, KeyError, TypeError) as exc:
            raise ReportError(f"{path}:{number} is not a recording line ({exc})") from None
    if len(recording.times) < 2:
        raise ReportError(f"{path} holds {len(recording.times)} scrape(s); a report needs at least 2")
    return recording


# ----- PromQL-like arithmetic over a recording -----
def increase(values: Sequence[float]) -> list[float]:
    """Per-step increase of a counter, counting a drop as a restart from 0 (as Prometheus does)."""
    out = [0.0]
    for before, after in zip(values, values[1:], strict=False):
        out.append(after - before if after >= before else after)
    return out


def windowed(times: Sequence[float], steps: Sequence[float], window_s: float) -> list[tuple[float, float]]:
    """(sum of `steps` over the trailing `window_s`, seconds covered) at each scrape."""
    out = []
    for i in range(len(times)):
        j = i
        while j > 0 and times[i] - times[j - 1] <= window_s:
            j -= 1
        out.append((sum(steps[j + 1 : i + 1]), times[i] - times[j]))
    return out


def rate(times: Sequence[float], counter: Sequence[float], window_s: float) -> list[float]:
    """Per-second rate of a counter over the trailing window (NaN until the window covers a step)."""
    return [s / span if span > 0 else math.nan for s, span in windowed(times, increase(counter), window_s)]


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets, +Inf included:
    linear interpolation inside the bucket; in the +Inf bucket, the largest finite bound. NaN if empty."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return math.nan
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def quantile_series(recording: Recording, histogram: str, q: float, window_s: float) -> list[float]:
    """`histogram_quantile(q, sum by (le) (increase(<histogram>_bucket[window])))` at each scrape."""
    by_le: dict[float, list[float]] = defaultdict(lambda: [0.0] * len(recording.times))
    for labels, values in recording.series(f"{histogram}_bucket").items():
        le = float(dict(labels)["le"])
        for i, v in enumerate(values):
            by_le[le][i] += 0.0 if math.isnan(v) else v
    windows = {le: windowed(recording.times, increase(v), window_s) for le, v in by_le.items()}
    return [
        histogram_quantile(q, [(le, w[i][0]) for le, w in windows.items()])
        for i in range(len(recording.times))
    ]


def mean_series(recording: Recording, histogram: str, window_s: float) -> list[float]:
    """Mean observation over the trailing window: increase(_sum) / increase(_count)."""
    sums = windowed(recording.times, increase(recording.total(f"{histogram}_sum")), window_s)
    counts = windowed(recording.times, increase(recording.total(f"{histogram}_count")), window_s)
    return [s / c if c > 0 else math.nan for (s, _), (c, _) in zip(sums, counts, strict=True)]


# ----- the report -----
@dataclass(frozen=True)
class ReportSummary:
    """Headline numbers of a recording (also printed by `report`)."""

    seconds: float
    scrapes: int
    outputs: float  # results + dead letters acknowledged during the recording
    dead_letters: float
    outputs_per_second: float
    final_total_lag_messages: float
    max_lag_seconds: float
    latency_p95_s: float  # over the whole recording


def summarize(recording: Recording) -> ReportSummary:
    seconds = recording.times[-1] - recording.times[0]
    results = recording.total("sentiment_results_published_total")
    dead = recording.total("sentiment_dead_letters_total")
    outputs = sum(increase(results)[1:]) + sum(increase(dead)[1:])
    lag_seconds = [v for vs in recording.series("sentiment_consumer_lag_seconds").values() for v in vs]
    whole = quantile_series(recording, "sentiment_end_to_end_latency_seconds", 0.95, seconds + 1.0)
    return ReportSummary(
        seconds=seconds,
        scrapes=len(recording.times),
        outputs=outputs,
        dead_letters=sum(increase(dead)[1:]),
        outputs_per_second=outputs / seconds if seconds > 0 else math.nan,
        final_total_lag_messages=recording.total("sentiment_consumer_lag_messages")[-1],
        max_lag_seconds=max((v for v in lag_seconds if not math.isnan(v)), default=0.0),
        latency_p95_s=whole[-1],
    )


def label_mix(recording: Recording, window_s: float) -> dict[str, list[float]]:
    """Each label's share of the results over the trailing window (all model versions together), as the
    dashboard's label mix panel."""
    name, t = "sentiment_predictions_total", recording.times
    labels = sorted({dict(key).get("label", "") for key in recording.series(name)})
    total = rate(t, recording.total(name), window_s)
    mix: dict[str, list[float]] = {}
    for label in labels:

        def of_label(d: dict[str, str], label: str = label) -> bool:
            return d.get("label") == label

        part = rate(t, recording.total(name, of_label), window_s)
        mix[label] = [p / n if n > 0 else math.nan for p, n in zip(part, total, strict=True)]
    return mix


def low_confidence_share(recording: Recording, window_s: float) -> list[float]:
    """Share of the results under the confidence threshold over the trailing window."""
    t = recording.times
    low = rate(t, recording.total("sentiment_low_confidence_predictions_total"), window_s)
    total = rate(t, recording.total("sentiment_predictions_total"), window_s)
    return [lo / n if n > 0 else math.nan for lo, n in zip(low, total, strict=True)]


def _since_start(counter: Sequence[float]) -> list[float]:
    """A counter's increase since the first scrape; a labelled counter is absent (0) until its first event."""
    return list(itertools.accumulate(increase([0.0 if math.isnan(v) else v for v in counter])))


def _label(labels: LabelKey, keys: Iterable[str]) -> str:
    d = dict(labels)
    if "topic" in d and "partition" in d:
        return f"{d['topic']}[{d['partition']}]"
    return " ".join(d[k] for k in keys if k in d) or "value"


_Panel = tuple[str, str, dict[str, list[float]], str]
"""One panel of the dashboard: title, y label, its lines by label, what it says when it has no data."""


def render(
    recording: Recording, out: Path, *, window_s: float, title: str = "Sentiment worker"
) -> ReportSummary:
    """Draws the dashboard's panels from `recording` into the PNG `out`; returns the headline numbers."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    summary = summarize(recording)
    fig, axes = plt.subplots(4, 3, figsize=(18, 17), constrained_layout=True)
    fig.suptitle(
        f"{title} — {summary.seconds:.0f} s, {summary.outputs:.0f} outputs "
        f"({summary.outputs_per_second:.1f}/s), {summary.dead_letters:.0f} dead letters, "
        f"final lag {summary.final_total_lag_messages:.0f} messages, "
        f"end-to-end p95 {summary.latency_p95_s:.3f} s",
        fontsize=13,
    )
    panels = _flow_panels(recording, window_s) + _resource_panels(recording, window_s)
    for ax, panel in zip([ax for row in axes for ax in row], panels, strict=True):
        _draw_panel(ax, recording.elapsed, *panel)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return summary


def _draw_panel(
    ax: Any, x: list[float], name: str, ylabel: str, lines: dict[str, list[float]], note: str = ""
) -> None:
    ax.set_title(name)
    ax.set_xlabel("seconds since start of recording")
    ax.set_ylabel(ylabel)
    finite = [v for values in lines.values() for v in values if math.isfinite(v)]
    for label, values in lines.items():
        if any(math.isfinite(v) for v in values):
            ax.plot(x, values, label=label, linewidth=1.4)
    if finite:
        ax.legend(fontsize=8, loc="upper left")
        top = max(finite)  # every panel shows a non-negative quantity: keep 0 at the bottom
        ax.set_ylim(0, top * 1.1 if top > 0 else 1)
    else:
        ax.text(0.5, 0.5, note or "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.grid(alpha=0.3)


def _flow_panels(recording: Recording, window_s: float) -> list[_Panel]:
    """The first two rows: lag, throughput, latency, batch tokens, padding."""
    t = recording.times
    budget = recording.total("sentiment_token_budget_tokens")
    return [
        (
            "Lag per partition (messages)",
            "messages",
            {_label(k, ()): v for k, v in recording.series("sentiment_consumer_lag_messages").items()},
            "",
        ),
        (
            "Lag per partition (seconds)",
            "seconds",
            {_label(k, ()): v for k, v in recording.series("sentiment_consumer_lag_seconds").items()},
            "",
        ),
        (
            f"Throughput (per second, {window_s:g} s window)",
            "messages / s",
            {
                "consumed": rate(t, recording.total("sentiment_messages_consumed_total"), window_s),
                "results acknowledged": rate(
                    t, recording.total("sentiment_results_published_total"), window_s
                ),
                "dead letters acknowledged": rate(
                    t, recording.total("sentiment_dead_letters_total"), window_s
                ),
            },
            "",
        ),
        (
            "End-to-end latency (message timestamp → acknowledged)",
            "seconds",
            {
                f"p{round(q * 100)}": quantile_series(
                    recording, "sentiment_end_to_end_latency_seconds", q, window_s
                )
                for q in (0.5, 0.95, 0.99)
            },
            "",
        ),
        (
            "Batch tokens (padded)",
            "tokens per batch",
            {
                "mean": mean_series(recording, "sentiment_batch_padded_tokens", window_s),
                "p95": quantile_series(recording, "sentiment_batch_padded_tokens", 0.95, window_s),
                **({"token budget": budget} if any(budget) else {}),
            },
            "",
        ),
        (
            "Padding efficiency (real / padded tokens)",
            "ratio",
            {"last window": recording.total("sentiment_padding_efficiency_ratio")},
            "",
        ),
    ]


def _resource_panels(recording: Recording, window_s: float) -> list[_Panel]:
    """The last two rows: dead letters, memory, drain time, label mix, low confidence, confidence."""
    gib = 1024.0**3
    memory = {"process RSS": [v / gib for v in recording.total("process_resident_memory_bytes")]}
    for name, what in (
        ("allocated", "sentiment_device_memory_allocated_bytes"),
        ("peak", "sentiment_device_memory_peak_bytes"),
    ):
        for k, values in recording.series(what).items():
            memory[f"GPU {name} {_label(k, ('device',))}"] = [v / gib for v in values]
    threshold = recording.total("sentiment_low_confidence_threshold")
    drain = recording.total("sentiment_consumer_drain_seconds")
    return [
        (
            "Dead letters by kind (cumulative during the recording)",
            "dead letters",
            {
                _label(k, ("kind",)): _since_start(values)
                for k, values in recording.series("sentiment_dead_letters_total").items()
            },
            "no dead letters",
        ),
        ("Memory (GPU lines on GPU workers only)", "GiB", memory, ""),
        (
            "Seconds to drain the backlog",
            "seconds",
            {"at recent rate": [v if not math.isinf(v) else math.nan for v in drain]},
            "",
        ),
        (
            f"Label mix (share of results, {window_s:g} s window)",
            "share",
            label_mix(recording, window_s),
            "no results",
        ),
        (
            f"Low-confidence share (confidence < {threshold[-1]:g})",
            "share",
            {"under threshold": low_confidence_share(recording, window_s)},
            "no results",
        ),
        (
            "Confidence of results",
            "top label's probability",
            {
                **{
                    f"p{round(q * 100)}": quantile_series(
                        recording, "sentiment_prediction_confidence", q, window_s
                    )
                    for q in (0.5, 0.1)
                },
                "threshold": threshold,
            },
            "",
        ),
    ]


def _median_step(times: Sequence[float]) -> float:
    steps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
    return steps[len(steps) // 2] if steps else 1.0


def default_window_s(recording: Recording) -> float:
    """The rate/quantile window when none is given: three scrapes, at least 5 s."""
    return max(5.0, 3 * _median_step(recording.times))
