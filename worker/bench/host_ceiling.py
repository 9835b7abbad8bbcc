"""`sentiment-worker bench --host-ceiling`: how fast the worker's host path goes with no model in it, beside
the fastest Kafka loop that does the same broker work (the anchor).

1. The host ceiling: a backlog of N reviews produced to fresh topics and drained end to end by a
   `sentiment-worker run` subprocess serving the identity backend (worker.model.identity_backend: the model
   directory's real tokenizer, fixed probabilities, no inference), with `run`'s defaults otherwise (window,
   batch size, token budget unless given). Timed as `bench`'s end-to-end phase: first consume to the last
   result's broker append time. Every result must name the model `identity`.
2. The anchor: in the bench process, the same reviews on their own topics through a minimal confluent-kafka
   loop: consume up to 1,000, `json.loads` each value, produce a small JSON result per review (to the input's
   partition, idempotent, lz4, linger 5 ms, as the worker's producer), flush, commit synchronously. Timed the
   same way, from its first consume to the last result's broker append time.
Rounds alternate (drain i, then anchor i); the ratio is the median of the rounds' host / anchor ratios.

Per-thread CPU: while the worker drains, the bench reads each of its threads' CPU time from
/proc/<pid>/task/<tid>/schedstat (nanoseconds) with the results published so far (its /metrics), every
`sample_interval_s`. CPU µs per review of a thread = its CPU between the last sample at or below 10 % of the
results (and above none) and the first at or above 90 %, over the results published between them: the steady
drain, without start-up, warm-up and shutdown. Threads are told apart by their kernel names, which `run`
sets from the Python thread names (`name_os_threads`): the main thread (thread id = process id) runs the poll
loop; `engine-queue` tokenizes and plans batches (native pools it starts, such as the Rust tokenizer's,
inherit its name); `engine-lane_N` call the model; `rdk:*` are librdkafka's (consumer and producer alike);
native threads that nobody named carry the name of the thread that started them: the Rust tokenizer's pool,
started by the model's load-time probe on the main thread, is named like the process.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

from confluent_kafka import Consumer, KafkaException, Producer

from worker.bench.bench import (
    BenchOptions,
    Phase,
    bench_end_to_end,
    flag,
    median_drain,
    phase_json,
    review_texts,
)
from worker.bench.options import DrainOptions
from worker.bench.topic_io import (
    conservation,
    create_run_topics,
    delete_run_topics,
    produce_backlog,
    read_topic,
    result_rows,
)
from worker.bench.worker_process import metric_sum, thread_cpu
from worker.config import WorkerSettings
from worker.model.backend_choice import cpu_description, cpu_identity
from worker.model.identity_backend import IDENTITY_MODEL_NAME

log = logging.getLogger(__name__)

ANCHOR_BATCH = 1000
"""Messages the anchor consumes at once."""
STEADY_TRIM = 0.10
"""Share of the results left out at each end of a drain when measuring CPU per review."""
TARGETS = {"host_vs_anchor": 0.40, "poll_us_per_review_max": 25.0}
"""The Done-when of the "feed the GPU" work: flagged in the report, never enforced."""

ROLES = {
    "poll": "poll loop (main thread): consume, decode, windows, records, produce, commit",
    "tokenization": "engine-queue: tokenization and batch planning (and native pools it started)",
    "lanes": "engine-lane_N: model calls (none: identity), merge, metrics",
    "librdkafka": "rdk:* threads of the consumer and the producer",
    "native-pool": "native threads named like the process: the Rust tokenizer's batch-encoding pool, started "
    "by the model's load-time probe on the main thread (TOKENIZERS_PARALLELISM=false removes it)",
    "other": "every other thread (health-http answers the bench's metric scrapes)",
}
"""The roles a worker thread is counted under, in table order, with what each does."""


@dataclass(frozen=True)
class HostCeilingOptions(DrainOptions):
    """`messages` reviews drained `rounds` times by the worker on the identity model and by the anchor, on
    fresh topics each time; per-thread CPU sampled every `sample_interval_s`."""

    messages: int = 40_000
    rounds: int = 3
    sample_interval_s: float = 0.25
    worker_timeout_s: float = 1800.0

    # A smoke run: 2,000 reviews, one round (well under a minute on 2 cores).
    QUICK: ClassVar[dict[str, Any]] = {"messages": 2000, "rounds": 1, "sample_interval_s": 0.02}


@dataclass(frozen=True)
class ThreadSample:
    """The worker's threads at one moment: seconds since the drain began, reviews done, and
    {thread id: (kernel name, CPU seconds)}."""

    t: float
    done: float
    threads: dict[int, tuple[str, float]]


@dataclass
class ThreadSampler:
    """Collects `ThreadSample`s of the worker while it drains (`bench_end_to_end`'s `on_sample`)."""

    clock: Callable[[], float] = time.monotonic
    samples: list[ThreadSample] = field(default_factory=list)
    pid: int | None = None
    started: float | None = None

    def __call__(self, pid: int, scrape: dict[str, float]) -> None:
        threads = thread_cpu(pid)
        if not threads:
            return
        now = self.clock()
        self.pid = pid
        self.started = now if self.started is None else self.started
        results = metric_sum(scrape, "sentiment_results_published_total") or 0.0
        dead = metric_sum(scrape, "sentiment_dead_letters_total") or 0.0
        self.samples.append(ThreadSample(now - self.started, results + dead, threads))


@dataclass(frozen=True)
class ThreadCpu:
    """One worker thread's CPU seconds over the steady window, and the role it counts under."""

    tid: int
    name: str
    role: str
    seconds: float


def thread_role(tid: int, name: str, pid: int, process_name: str) -> str:
    """The `ROLES` key a worker thread counts under, by its kernel name (see the module docstring)."""
    if tid == pid:
        return "poll"
    if name == "engine-queue":
        return "tokenization"
    if name.startswith("engine-lane"):
        return "lanes"
    if name.startswith("rdk:"):
        return "librdkafka"
    if name == process_name:
        return "native-pool"
    return "other"


def steady_window(
    samples: Sequence[ThreadSample], total: int, trim: float = STEADY_TRIM
) -> tuple[ThreadSample, ThreadSample] | None:
    """The two samples the per-review CPU is measured between: the last with 0 < done <= `trim` x total (or
    the first with done > 0), and the first with done >= (1 - `trim`) x total (or the last). None when no
    results were published between two samples (too few samples: raise the message count)."""
    started = [s for s in samples if s.done > 0]
    if not started:
        return None
    early = [s for s in started if s.done <= trim * total]
    late = [s for s in started if s.done >= (1 - trim) * total]
    first = early[-1] if early else started[0]
    last = late[0] if late else started[-1]
    return (first, last) if last.done > first.done else None


def cpu_per_review(samples: Sequence[ThreadSample], total: int, pid: int) -> dict[str, Any] | None:
    """Per role and per thread, CPU µs per review over the steady window (`steady_window`), with the
    window's bounds; None without a window. A thread born inside the window counts from zero."""
    window = steady_window(samples, total)
    if window is None:
        return None
    first, last = window
    reviews = last.done - first.done
    process_name = last.threads.get(pid, first.threads.get(pid, ("", 0.0)))[0]
    threads = [
        ThreadCpu(
            tid,
            name,
            thread_role(tid, name, pid, process_name),
            seconds - first.threads.get(tid, (name, 0.0))[1],
        )
        for tid, (name, seconds) in sorted(last.threads.items())
    ]
    roles = {
        role: {
            "us_per_review": sum(t.seconds for t in threads if t.role == role) * 1e6 / reviews,
            "threads": sum(1 for t in threads if t.role == role),
            "names": sorted({t.name for t in threads if t.role == role}),
            "what": what,
        }
        for role, what in ROLES.items()
    }
    return {
        "window": {
            "from_done": first.done,
            "to_done": last.done,
            "seconds": round(last.t - first.t, 3),
            "samples": len(samples),
        },
        "roles": roles,
        "total_us_per_review": sum(t.seconds for t in threads) * 1e6 / reviews,
        "threads": [
            {"tid": t.tid, "name": t.name, "role": t.role, "us_per_review": t.seconds * 1e6 / reviews}
            for t in threads
        ],
    }


def host_ceiling_settings(settings: WorkerSettings) -> WorkerSettings:
    """`settings` with the identity backend, allowed: what the worker subprocess is started with."""
    return settings.model_copy(update={"backend": "identity", "allow_identity_model": True})


def drain_on_identity(
    settings: WorkerSettings,
    texts: Sequence[str],
    options: HostCeilingOptions,
    prefix: str,
    workdir: Path,
    say: Callable[[str], None],
    phase: str,
) -> Phase:
    """`bench`'s end-to-end phase with the worker on the identity model, its threads sampled; the phase's
    extra gains `threads` (`cpu_per_review`) and `identity_results` (every result names the identity
    model)."""
    sampler = ThreadSampler()
    drain_options = BenchOptions(
        messages=len(texts),
        partitions=options.partitions,
        rss_interval_s=options.sample_interval_s,
        worker_timeout_s=options.worker_timeout_s,
    )
    phase_result = bench_end_to_end(
        host_ceiling_settings(settings), texts, drain_options, prefix, workdir, say, phase, sampler
    )
    models = phase_result.extra["models_in_results"]
    phase_result.extra["identity_results"] = bool(models) and all(
        model.split(" ", 1)[0] == IDENTITY_MODEL_NAME for model in models
    )
    phase_result.extra["threads"] = (
        cpu_per_review(sampler.samples, len(texts), sampler.pid) if sampler.pid is not None else None
    )
    return phase_result


def bench_anchor(common: dict[str, Any], texts: Sequence[str], prefix: str, phase: str, partitions: int,
                 timeout_s: float) -> Phase:  # fmt: skip
    """The minimal loop over `texts` on its own topics (see the module docstring); conservation by id, CPU
    µs per review of the loop thread and of the whole bench process while it ran."""
    reviews, results_topic = f"{prefix}-{phase}-reviews", f"{prefix}-{phase}-results"
    create_run_topics(common, [reviews, results_topic], partitions)
    produce_backlog(common, reviews, texts, "a")
    consumer = Consumer(
        {
            **common,
            "group.id": f"{prefix}-{phase}-group",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,  # committed after each batch's results are flushed
        }
    )
    producer = Producer({**common, "enable.idempotence": True, "linger.ms": 5, "compression.type": "lz4"})
    consumer.subscribe([reviews])
    done, first_consume_ms = 0, None
    deadline = time.monotonic() + timeout_s
    thread_cpu0, process_cpu0 = time.thread_time(), time.process_time()
    try:
        while done < len(texts) and time.monotonic() < deadline:
            batch = consumer.consume(ANCHOR_BATCH, 1.0)
            if not batch:
                continue
            if first_consume_ms is None:
                first_consume_ms = time.time() * 1000.0
            for message in batch:
                if message.error() is not None:
                    raise KafkaException(message.error())
                review = json.loads(message.value() or b"{}")
                value = json.dumps({"id": review["id"], "label": "negative", "confidence": 0.5}).encode()
                while True:
                    try:
                        producer.produce(results_topic, value=value, partition=message.partition() or 0)
                        break
                    except BufferError:
                        producer.poll(0.01)
            if producer.flush(60):
                raise RuntimeError("the anchor's results were not acknowledged within 60 s")
            consumer.commit(asynchronous=False)
            done += len(batch)
        thread_s, process_s = time.thread_time() - thread_cpu0, time.process_time() - process_cpu0
    finally:
        consumer.close()
    rows = result_rows(read_topic(common, results_topic, expected=len(texts), timeout_s=120))
    check = conservation({f"a-{i}" for i in range(len(texts))}, [r for r, _ in rows], [])
    appended = [ts for _, ts in rows if ts is not None]
    seconds = (max(appended) - first_consume_ms) / 1000.0 if appended and first_consume_ms else 0.0
    return Phase(
        messages=len(texts),
        seconds=seconds,
        results=len(rows),
        extra={
            "conservation": check,
            "loop": f"consume {ANCHOR_BATCH} -> json.loads -> produce (idempotent, lz4, linger 5 ms) -> "
            "flush -> commit",
            "cpu_us_per_review": {
                "loop_thread": thread_s * 1e6 / done if done else None,
                "process": process_s * 1e6 / done if done else None,
            },
            "timed_from": "first consume to the last result's broker append",
        },
    )


def run_host_ceiling(
    settings: WorkerSettings, options: HostCeilingOptions, *, say: Callable[[str], None] = lambda _line: None
) -> dict[str, Any]:
    """Rounds of a worker drain on the identity model and the anchor over the same reviews; the report."""
    prefix = f"bench-hc-{datetime.now(timezone.utc):%Y%m%d%H%M%S}-{os.getpid()}"
    texts = review_texts(options.messages, options.seed)
    common = settings.librdkafka_common()
    batching = settings.sections.batching
    report: dict[str, Any] = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "instrument": "host-ceiling",
        "model": {
            "backend": "identity",
            "name": IDENTITY_MODEL_NAME,
            "tokenizer_from": settings.sections.model.model,
            "note": "no inference: the directory's tokenizer, then fixed probabilities",
        },
        "options": asdict(options),
        "max_batch_tokens": batching.max_batch_tokens,
        "max_batch_size": batching.max_batch_size,
        "max_window_messages": batching.max_window_messages,
        "max_wait_ms": batching.max_wait_ms,
        "machine": {"cpu": cpu_identity(), "cpu_description": cpu_description(), "cpus": os.cpu_count()},
    }
    drains: list[Phase] = []
    anchors: list[Phase] = []
    with tempfile.TemporaryDirectory(prefix="sentiment-host-ceiling-") as tmp:
        try:
            for i in range(options.rounds):
                say(f"round {i + 1} of {options.rounds}: {len(texts)} reviews, worker on the identity model")
                drains.append(drain_on_identity(settings, texts, options, prefix, Path(tmp), say, f"host{i}"))
                say(f"round {i + 1} of {options.rounds}: the anchor loop over the same reviews")
                anchor_run = bench_anchor(
                    common, texts, prefix, f"anchor{i}", options.partitions, options.worker_timeout_s
                )
                anchors.append(anchor_run)
        finally:
            if not options.keep_topics:
                report["deleted_topics"] = delete_run_topics(common, prefix)
    host, anchor = median_drain(drains), median_drain(anchors)
    by_round = [
        d.messages_per_second / a.messages_per_second if a.messages_per_second > 0 else None
        for d, a in zip(drains, anchors, strict=True)
    ]
    known = [r for r in by_round if r is not None]
    ratio = statistics.median(known) if known else None
    threads = host.extra["threads"]
    poll = threads["roles"]["poll"]["us_per_review"] if threads is not None else None
    models = sorted({m for d in drains for m in d.extra["models_in_results"]})
    report["model"]["in_results"] = models
    report["model"]["every_result_names_identity"] = all(d.extra["identity_results"] for d in drains)
    report["host_ceiling"] = phase_json(host)
    report["anchor"] = phase_json(anchor)
    report["host_vs_anchor"] = ratio
    report["host_vs_anchor_by_round"] = [None if r is None else round(r, 4) for r in by_round]
    report["targets"] = {
        "host_vs_anchor": flag(ratio, TARGETS["host_vs_anchor"], at_least=True),
        "poll_us_per_review": flag(poll, TARGETS["poll_us_per_review_max"], at_least=False),
    }
    return report


def conserved(report: dict[str, Any]) -> bool:
    """Every review came out once in every drain and every anchor run, and every result named identity."""
    return bool(
        report["host_ceiling"]["conservation"]["ok"]
        and report["anchor"]["conservation"]["ok"]
        and report["model"]["every_result_names_identity"]
    )
