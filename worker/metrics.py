"""Every metric of the worker, created against a registry that is passed in.

Names follow Prometheus conventions: base units (seconds, bytes), `_total` counters, labels only of low
cardinality (topic, partition, kind). Tests build their own `CollectorRegistry`.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


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
    in_flight_messages: Gauge
    last_poll_timestamp_seconds: Gauge
    ready: Gauge
    model: Info
    out_of_memory_events: Counter
    token_budget: Gauge
    inference_queue_windows: Gauge
    paused: Gauge
    transactions: Counter


def create_metrics(registry: CollectorRegistry) -> WorkerMetrics:
    """Creates every metric of the worker in `registry`."""
    tp = ["topic", "partition"]
    return WorkerMetrics(
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
            "High watermark minus the next offset this worker will consume, per assigned partition.",
            tp,
            registry=registry,
        ),
        consumer_lag_seconds=Gauge(
            "sentiment_consumer_lag_seconds",
            "Age of the oldest consumed message not yet acknowledged downstream (0 when caught up).",
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
            "sentiment_ready", "1 when the model is warm and partitions are assigned.", registry=registry
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
            "Windows handed to the inference thread and not yet published.",
            registry=registry,
        ),
        paused=Gauge(
            "sentiment_consumer_paused",
            "1 while the partitions are paused because the inference queue is full (backpressure).",
            registry=registry,
        ),
        transactions=Counter(
            "sentiment_transactions_total",
            "Exactly-once transactions, by outcome (committed, aborted).",
            ["outcome"],
            registry=registry,
        ),
    )
