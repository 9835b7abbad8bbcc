"""Every metric of the worker, created against a registry that is passed in.

Names follow Prometheus conventions: base units (seconds, bytes), `_total` counters, labels only of low
cardinality (topic, partition, kind, label, model version). Tests build their own `CollectorRegistry`.
"""

from __future__ import annotations

import bisect
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from worker.config import DEFAULT_LOW_CONFIDENCE

if TYPE_CHECKING:
    from worker.inference.model_calls import GroupStats

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# Top-label probability: at least 1/k for k labels (0.5 for the shipped two); finer near the top.
_CONFIDENCE_BUCKETS = (0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0)


@dataclass(frozen=True)
class WorkerMetrics:
    """The worker's metrics; one instance per registry."""

    registry: CollectorRegistry
    messages_consumed: Counter
    results_published: Counter
    dead_letters: Counter
    delivery_failures: Counter
    rebalances: Counter
    offsets_committed: Counter
    batch_size: Histogram
    batch_tokens: Histogram
    inference_seconds: Histogram
    tokenization_seconds: Histogram
    end_to_end_latency_seconds: Histogram
    padding_efficiency: Gauge
    consumer_lag_messages: Gauge
    consumer_lag_seconds: Gauge
    partition_stalled_seconds: Gauge
    in_flight_messages: Gauge
    last_poll_timestamp_seconds: Gauge
    ready: Gauge
    model: Info
    out_of_memory_events: Counter
    token_budget: Gauge
    inference_queue_windows: Gauge
    paused: Gauge
    transactions: Counter
    predictions: Counter
    prediction_confidence: Histogram
    low_confidence_predictions: Counter
    low_confidence_threshold: Gauge
    low_confidence: float  # results under this confidence are counted in low_confidence_predictions
    live: LiveModelMetrics  # model changes and the shadow's agreement

    def start_predictions(self, labels: list[str], model_version: str) -> None:
        """Exports every label's prediction series at 0 from the start, so rate() sees the first result."""
        for label in labels:
            self.predictions.labels(label, model_version)
        self.low_confidence_predictions.labels(model_version)

    def observe_prediction(self, label: str, confidence: float, model_version: str) -> None:
        """One result (a Kafka result acknowledged, or a text answered over HTTP): its label and its
        confidence (the top label's probability)."""
        self.predictions.labels(label, model_version).inc()
        self.prediction_confidence.observe(confidence)
        if confidence < self.low_confidence:
            self.low_confidence_predictions.labels(model_version).inc()

    def observe_predictions(
        self, counts: dict[str, int], confidences: list[float], model_version: str
    ) -> None:
        """Many results at once (the deliveries of one turn): per label how many, and their confidences."""
        for label, count in counts.items():
            self.predictions.labels(label, model_version).inc(count)
        observe_all(self.prediction_confidence, confidences)
        low = sum(1 for confidence in confidences if confidence < self.low_confidence)
        if low:
            self.low_confidence_predictions.labels(model_version).inc(low)

    def observe_group(self, stats: GroupStats, token_budget: int) -> None:
        """Records one labelled window: its batches, tokenization time, padding and OOM splits."""
        self.token_budget.set(token_budget)
        self.out_of_memory_events.inc(stats.out_of_memory_events)
        if stats.batches:
            self.tokenization_seconds.observe(stats.tokenize_seconds)
            self.padding_efficiency.set(stats.padding_efficiency)
        for batch in stats.batches:
            self.batch_size.observe(batch.size)
            self.batch_tokens.observe(batch.padded_tokens)
            self.inference_seconds.observe(batch.seconds)


@dataclass(frozen=True)
class LiveModelMetrics:
    """Models that change while the stream flows: swaps and shadow changes applied or refused, and the shadow
    beside the primary on live traffic (a confusion table by label pair, its confidence, groups shadowed or
    skipped)."""

    model_changes: Counter
    shadow_model: Gauge
    shadow_predictions: Counter
    shadow_agreeing: Counter
    shadow_confidence: Histogram
    shadow_groups: Counter

    def observe_shadowed(
        self, pairs: dict[tuple[str, str], int], confidences: list[float], version: str
    ) -> None:
        """One group labelled by both models: how many reviews got each (primary label, shadow label) pair,
        and the shadow's confidences."""
        for (primary, shadow), count in pairs.items():
            self.shadow_predictions.labels(primary, shadow, version).inc(count)
        # PromQL cannot compare two labels of a series: the diagonal is counted apart, for the alert.
        self.shadow_agreeing.labels(version).inc(sum(c for (p, s), c in pairs.items() if p == s))
        observe_all(self.shadow_confidence, confidences)
        self.shadow_groups.labels("shadowed").inc()


def create_live_model_metrics(registry: CollectorRegistry) -> LiveModelMetrics:
    """Creates the live-model metrics in `registry` (`create_metrics` does, beside the worker's own)."""
    return LiveModelMetrics(
        model_changes=Counter(
            "sentiment_model_changes_total",
            "Model changes asked by the control topic or the admin route, by role (primary, shadow) and "
            "outcome (applied, refused: the replica keeps what it served).",
            ["role", "outcome"],
            registry=registry,
        ),
        shadow_model=Gauge(
            "sentiment_shadow_model_info",
            "1 for the shadow model this replica runs beside the primary (none: no series).",
            ["name", "version"],
            registry=registry,
        ),
        shadow_predictions=Counter(
            "sentiment_shadow_predictions_total",
            "Reviews labelled by both the primary and the shadow, by the primary's label, the shadow's label "
            "and the shadow's version: the live confusion table (agreement: the diagonal over the sum).",
            ["primary_label", "shadow_label", "shadow_version"],
            registry=registry,
        ),
        shadow_agreeing=Counter(
            "sentiment_shadow_agreeing_total",
            "Reviews the shadow gave the primary's label, by the shadow's version (the diagonal of "
            "sentiment_shadow_predictions_total; agreement: this over its sum).",
            ["shadow_version"],
            registry=registry,
        ),
        shadow_confidence=Histogram(
            "sentiment_shadow_prediction_confidence",
            "The shadow's top-label probability on the reviews it labelled beside the primary.",
            buckets=_CONFIDENCE_BUCKETS,
            registry=registry,
        ),
        shadow_groups=Counter(
            "sentiment_shadow_groups_total",
            "Groups of reviews (Kafka windows, HTTP requests) the shadow labelled (shadowed) or skipped "
            "because it was behind (skipped).",
            ["outcome"],
            registry=registry,
        ),
    )


@dataclass(frozen=True)
class HttpMetrics:
    """The HTTP API's own metrics (its batches are counted by WorkerMetrics' batch histograms)."""

    requests: Counter
    request_seconds: Histogram
    texts: Counter
    queued_texts: Gauge
    connections_refused: Counter


def create_http_metrics(registry: CollectorRegistry) -> HttpMetrics:
    """Creates the HTTP API's metrics in `registry` (beside `create_metrics`' ones)."""
    return HttpMetrics(
        requests=Counter(
            "sentiment_http_requests_total",
            "POST /v1/sentiment requests, by the status code answered; 499: the client closed the "
            "connection before its body was complete (nothing answered).",
            ["code"],
            registry=registry,
        ),
        request_seconds=Histogram(
            "sentiment_http_request_seconds",
            "Time from accepting a POST /v1/sentiment request to its answer (answered requests).",
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        ),
        texts=Counter(
            "sentiment_http_texts_total", "Texts labelled for POST /v1/sentiment.", registry=registry
        ),
        queued_texts=Gauge(
            "sentiment_http_queued_texts",
            "Texts accepted over HTTP and not yet answered (bounded by http_max_queued_texts).",
            registry=registry,
        ),
        connections_refused=Counter(
            "sentiment_http_connections_refused_total",
            "HTTP connections closed by a connection bound, by reason: header_too_large (431), "
            "header_timeout, body_timeout (408), too_many_connections (503); idle ones are not counted.",
            ["reason"],
            registry=registry,
        ),
    )


def create_metrics(
    registry: CollectorRegistry, *, low_confidence: float = DEFAULT_LOW_CONFIDENCE
) -> WorkerMetrics:
    """Creates every metric of the worker in `registry`; `low_confidence` is the confidence under which a
    result counts as low-confidence (settings.low_confidence)."""
    tp = ["topic", "partition"]
    threshold = Gauge(
        "sentiment_low_confidence_threshold",
        "Confidence under which a result counts in sentiment_low_confidence_predictions_total.",
        registry=registry,
    )
    threshold.set(low_confidence)
    metrics = WorkerMetrics(
        registry=registry,
        messages_consumed=Counter(
            "sentiment_messages_consumed_total",
            "Input messages read from Kafka.",
            ["topic"],
            registry=registry,
        ),
        results_published=Counter(
            "sentiment_results_published_total",
            "Results acknowledged by the broker on the output topic.",
            ["topic"],
            registry=registry,
        ),
        dead_letters=Counter(
            "sentiment_dead_letters_total",
            "Dead letters acknowledged by the broker, by error kind.",
            ["kind"],
            registry=registry,
        ),
        delivery_failures=Counter(
            "sentiment_delivery_failures_total",
            "Records the broker did not acknowledge (the worker stops without committing them).",
            ["topic"],
            registry=registry,
        ),
        rebalances=Counter(
            "sentiment_rebalances_total",
            "Partition assignment changes, by event (assigned, revoked, lost).",
            ["event"],
            registry=registry,
        ),
        offsets_committed=Counter(
            "sentiment_offset_commits_total", "Offset commits requested by the worker.", registry=registry
        ),
        batch_size=Histogram(
            "sentiment_batch_size", "Reviews per inference batch.", buckets=_SIZE_BUCKETS, registry=registry
        ),
        batch_tokens=Histogram(
            "sentiment_batch_padded_tokens",
            "Padded tokens (batch size x longest sequence) per inference batch.",
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        ),
        inference_seconds=Histogram(
            "sentiment_inference_seconds",
            "Model time per inference batch.",
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        ),
        tokenization_seconds=Histogram(
            "sentiment_tokenization_seconds",
            "Tokenizer time per window.",
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        ),
        end_to_end_latency_seconds=Histogram(
            "sentiment_end_to_end_latency_seconds",
            "Input message timestamp to broker acknowledgement of its result or dead letter.",
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        ),
        padding_efficiency=Gauge(
            "sentiment_padding_efficiency_ratio",
            "Real tokens / padded tokens of the last window (1.0 = no padding).",
            registry=registry,
        ),
        consumer_lag_messages=Gauge(
            "sentiment_consumer_lag_messages",
            "High watermark minus the next offset this worker consumes, per assigned partition (before it "
            "fetched from the partition: minus the committed offset, else the log start).",
            tp,
            registry=registry,
        ),
        consumer_lag_seconds=Gauge(
            "sentiment_consumer_lag_seconds",
            "Age of the oldest message not done: consumed and unacknowledged, or, before the partition was "
            "fetched from, the one at its committed offset (0 when nothing waits).",
            tp,
            registry=registry,
        ),
        partition_stalled_seconds=Gauge(
            "sentiment_partition_stalled_seconds",
            "Seconds an assigned partition's work has not moved while inputs of it wait (its oldest awaited "
            "offset the same, e.g. a record the broker refuses every time); 0 when it moves or nothing "
            "waits. Past SENTIMENT_STUCK_PARTITION_S, /readyz fails naming it.",
            tp,
            registry=registry,
        ),
        in_flight_messages=Gauge(
            "sentiment_in_flight_messages",
            "Messages consumed whose output the broker has not acknowledged yet.",
            registry=registry,
        ),
        last_poll_timestamp_seconds=Gauge(
            "sentiment_last_poll_timestamp_seconds",
            "Unix time of the poll loop's last turn (liveness).",
            registry=registry,
        ),
        ready=Gauge(
            "sentiment_ready",
            "1 when /readyz says ready: model warm, partitions assigned, broker reachable, none stuck.",
            registry=registry,
        ),
        model=Info("sentiment_model", "The loaded model: name, version, device.", registry=registry),
        out_of_memory_events=Counter(
            "sentiment_out_of_memory_events_total",
            "Inference batches that ran out of memory (each is split in halves and retried).",
            registry=registry,
        ),
        token_budget=Gauge(
            "sentiment_token_budget_tokens",
            "Current padded-token budget of an inference batch (lowered after out-of-memory).",
            registry=registry,
        ),
        inference_queue_windows=Gauge(
            "sentiment_inference_queue_windows",
            "Windows handed to the engine and not yet published.",
            registry=registry,
        ),
        paused=Gauge(
            "sentiment_consumer_paused",
            "1 while the partitions are paused: the inference queue has been full for 2 s (backpressure).",
            registry=registry,
        ),
        transactions=Counter(
            "sentiment_transactions_total",
            "Exactly-once transactions, by outcome (committed, aborted, given_up: a call past its deadline).",
            ["outcome"],
            registry=registry,
        ),
        predictions=Counter(
            "sentiment_predictions",
            "Results by predicted label and model version (Kafka results acknowledged, HTTP texts answered).",
            ["label", "model_version"],
            registry=registry,
        ),
        prediction_confidence=Histogram(
            "sentiment_prediction_confidence",
            "Confidence (top label's probability) of each result, Kafka and HTTP.",
            buckets=_CONFIDENCE_BUCKETS,
            registry=registry,
        ),
        low_confidence_predictions=Counter(
            "sentiment_low_confidence_predictions",
            "Results whose confidence is under sentiment_low_confidence_threshold, by model version.",
            ["model_version"],
            registry=registry,
        ),
        low_confidence_threshold=threshold,
        low_confidence=low_confidence,
        live=create_live_model_metrics(registry),
    )
    # Computed when scraped, from outside the loop: nothing to feed.
    ProcessCollector(registry=registry)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
    registry.register(DeviceMemoryCollector())
    registry.register(
        DrainTimeCollector(metrics.consumer_lag_messages, [metrics.results_published, metrics.dead_letters])
    )
    return metrics


def observe_all(histogram: Histogram, values: list[float]) -> None:
    """`histogram.observe(v)` for every value, in one update per bucket: the same series, counts and sum,
    without a lock taken and the buckets walked per value (two per result on the poll thread)."""
    if not values:
        return
    histogram._raise_if_not_observable()
    bounds = histogram._upper_bounds
    per_bucket = [0] * len(bounds)
    for value in values:
        per_bucket[bisect.bisect_left(bounds, value)] += 1  # the first bound >= value, as observe picks
    histogram._sum.inc(math.fsum(values))
    for bucket, count in zip(histogram._buckets, per_bucket, strict=True):
        if count:
            bucket.inc(count)


def _total(metric: Counter | Gauge) -> float:
    """Sum of every labelled child's value (counters: their `_total` samples)."""
    return sum(
        sample.value
        for family in metric.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    )


class DrainTimeCollector(Collector):
    """`sentiment_consumer_drain_seconds`: this worker's backlog (the sum of its per-partition lag in
    messages) divided by its recent processing rate (results + dead letters acknowledged per second over
    the last `window_s`, measured between scrapes). 0 without backlog; +Inf with a backlog and no progress
    in the window; absent until a second scrape gives a rate."""

    NAME = "sentiment_consumer_drain_seconds"

    def __init__(
        self,
        lag_messages: Gauge,
        done_counters: list[Counter],
        *,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lag = lag_messages
        self._done = done_counters
        self._window_s = window_s
        self._clock = clock
        self._samples: deque[tuple[float, float]] = deque()
        self._lock = threading.Lock()  # scrapes may run concurrently (threaded HTTP server)

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(self.NAME, self._help())]

    def collect(self) -> list[Metric]:
        now, done, backlog = self._clock(), sum(_total(c) for c in self._done), _total(self._lag)
        with self._lock:
            self._samples.append((now, done))
            while len(self._samples) > 2 and now - self._samples[1][0] >= self._window_s:
                self._samples.popleft()
            first_t, first_done = self._samples[0]
        family = GaugeMetricFamily(self.NAME, self._help())
        if backlog <= 0:
            family.add_metric([], 0.0)
        elif now > first_t:
            rate = (done - first_done) / (now - first_t)
            family.add_metric([], backlog / rate if rate > 0 else math.inf)
        return [family]

    @staticmethod
    def _help() -> str:
        return "Seconds to work off this worker's backlog at its recent rate (lag messages / messages per s)."


class DeviceMemoryCollector(Collector):
    """GPU memory of the Paddle device in use (`paddle.device.cuda`): allocated now, peak, and reserved by
    the caching allocator, in bytes. Yields nothing on the CPU, or before Paddle is imported."""

    NAMES = (
        "sentiment_device_memory_allocated_bytes",
        "sentiment_device_memory_peak_bytes",
        "sentiment_device_memory_reserved_bytes",
    )
    _HELP = (
        "Device memory held by tensors now.",
        "Most device memory held by tensors since start.",
        "Device memory reserved by Paddle's caching allocator.",
    )

    def describe(self) -> list[Metric]:
        return [
            GaugeMetricFamily(n, h, labels=["device"]) for n, h in zip(self.NAMES, self._HELP, strict=True)
        ]

    def collect(self) -> list[Metric]:
        paddle = sys.modules.get("paddle")  # never import Paddle just to be scraped
        if paddle is None:
            return []
        try:
            device = str(paddle.device.get_device())
            if not device.startswith("gpu"):
                return []
            index = int(device.split(":", 1)[1]) if ":" in device else 0
            cuda = paddle.device.cuda
            values = (
                cuda.memory_allocated(index),
                cuda.max_memory_allocated(index),
                cuda.memory_reserved(index),
            )
        except Exception:  # noqa: BLE001 - a scrape must never fail because the device query did
            return []
        families: list[Metric] = []
        for name, help_text, value in zip(self.NAMES, self._HELP, values, strict=True):
            family = GaugeMetricFamily(name, help_text, labels=["device"])
            family.add_metric([device], float(value))
            families.append(family)
        return families
