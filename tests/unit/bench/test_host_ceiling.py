"""`bench --host-ceiling` without a broker: which thread counts as what, CPU per review over the steady part
of a drain (start-up and shutdown left out), the samples, the flags, the table."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from worker.bench.bench_table import format_host_ceiling_table
from worker.bench.host_ceiling import (
    ROLES,
    HostCeilingOptions,
    ThreadSample,
    ThreadSampler,
    conserved,
    cpu_per_review,
    host_ceiling_settings,
    steady_window,
    thread_role,
)
from worker.bench.worker_process import thread_cpu
from worker.cli.bench import host_ceiling_options
from worker.cli.main import build_parser
from worker.config import WorkerSettings
from worker.errors import ConfigurationError

PID = 100


def test_threads_count_under_their_roles() -> None:
    def role(tid: int, name: str) -> str:
        return thread_role(tid, name, PID, "python")

    assert role(PID, "python") == "poll"  # the main thread: its id is the process id
    assert role(PID, "anything") == "poll"
    assert role(101, "engine-queue") == "tokenization"
    assert role(102, "engine-lane_0") == role(103, "engine-lane_11") == "lanes"
    assert role(104, "rdk:main") == role(105, "rdk:broker-1") == "librdkafka"
    assert role(106, "python") == "native-pool"  # started by the main thread, named by nobody
    assert role(107, "health-http") == "other"
    assert set(ROLES) == {"poll", "tokenization", "lanes", "librdkafka", "native-pool", "other"}


def sample(t: float, done: float, poll: float, queue: float, lane: float | None = None) -> ThreadSample:
    threads = {PID: ("python", poll), 101: ("engine-queue", queue), 104: ("rdk:main", t / 10)}
    if lane is not None:
        threads[102] = ("engine-lane_0", lane)
    return ThreadSample(t, done, threads)


# 1,000 reviews: loading burns 5 s of the main thread before the first result; the drain is steady after.
SAMPLES = [
    sample(0.0, 0, poll=0.5, queue=0.0),
    sample(1.0, 0, poll=5.0, queue=0.1),  # loading, warm-up: never counted
    sample(2.0, 50, poll=5.01, queue=0.11),
    sample(3.0, 100, poll=5.02, queue=0.12, lane=0.0),  # the last at <= 10 %
    sample(4.0, 500, poll=5.06, queue=0.16, lane=0.004),
    sample(5.0, 900, poll=5.10, queue=0.20, lane=0.008),  # the first at >= 90 %
    sample(6.0, 1000, poll=5.30, queue=0.21, lane=0.009),  # shutdown: not counted
]


def test_the_steady_window_leaves_out_start_up_and_shutdown() -> None:
    first, last = steady_window(SAMPLES, 1000) or (None, None)
    assert (first, last) == (SAMPLES[3], SAMPLES[5])
    figures = cpu_per_review(SAMPLES, 1000, PID)
    assert figures is not None
    roles = figures["roles"]
    assert roles["poll"]["us_per_review"] == pytest.approx(0.08 * 1e6 / 800)  # 100 µs, not the loading
    assert roles["tokenization"]["us_per_review"] == pytest.approx(0.08 * 1e6 / 800)
    assert roles["lanes"]["us_per_review"] == pytest.approx(0.008 * 1e6 / 800)
    assert roles["librdkafka"]["us_per_review"] == pytest.approx(0.2 * 1e6 / 800)
    assert roles["poll"]["threads"] == roles["lanes"]["threads"] == 1 and roles["other"]["threads"] == 0
    assert roles["tokenization"]["names"] == ["engine-queue"]
    assert figures["total_us_per_review"] == pytest.approx(sum(r["us_per_review"] for r in roles.values()))
    assert figures["window"] == {"from_done": 100, "to_done": 900, "seconds": 2.0, "samples": 7}
    assert {t["tid"] for t in figures["threads"]} == {PID, 101, 102, 104}


def test_a_lane_born_inside_the_window_counts_from_zero() -> None:
    late_lane = [SAMPLES[2], sample(3.0, 100, 5.02, 0.12), SAMPLES[5]]
    figures = cpu_per_review(late_lane, 1000, PID)
    assert figures is not None and figures["roles"]["lanes"]["us_per_review"] == pytest.approx(
        8e-3 * 1e6 / 800
    )


def test_short_drains_fall_back_to_the_samples_they_have() -> None:
    # No sample between 0 and 10 %: from the first with results; none past 90 %: to the last.
    few = [SAMPLES[1], SAMPLES[4], sample(4.5, 700, 5.08, 0.18, 0.006)]
    assert steady_window(few, 1000) == (few[1], few[2])
    assert steady_window([SAMPLES[0], SAMPLES[1]], 1000) is None  # nothing published yet
    assert steady_window([SAMPLES[4]], 1000) is None  # one sample: no interval
    assert cpu_per_review([SAMPLES[4]], 1000, PID) is None


def test_the_sampler_reads_a_live_process_and_its_progress() -> None:
    ticks = iter([10.0, 10.5])
    sampler = ThreadSampler(clock=lambda: next(ticks))
    busy_until = time.process_time() + 0.05
    while time.process_time() < busy_until:
        pass
    sampler(os.getpid(), {'sentiment_results_published_total{"topic": "r"}': 40.0})
    sampler(os.getpid(), {"sentiment_results_published_total{}": 90.0, "sentiment_dead_letters_total{}": 3.0})
    sampler(999_999_999, {})  # gone: no sample
    assert [(s.t, s.done) for s in sampler.samples] == [(0.0, 40.0), (0.5, 93.0)]
    assert sampler.pid == os.getpid()
    me = sampler.samples[0].threads[threading.get_native_id()]
    assert me[1] > 0.04  # CPU seconds of this thread, in nanoseconds' precision


def test_thread_cpu_lists_every_live_thread() -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="waiting")
    other.start()
    try:
        threads = thread_cpu(os.getpid())
        assert {threading.get_native_id(), other.native_id} <= set(threads)
    finally:
        stop.set()
        other.join()
    assert thread_cpu(999_999_999) == {}


def test_the_worker_is_started_on_the_identity_model_allowed() -> None:
    settings = host_ceiling_settings(WorkerSettings(model="models/x", backend="onnx"))
    assert (settings.model, settings.backend, settings.allow_identity_model) == ("models/x", "identity", True)


def test_flags_choose_the_sizes() -> None:
    def options(*flags: str) -> HostCeilingOptions:
        return host_ceiling_options(build_parser().parse_args(["bench", "--host-ceiling", *flags]))

    assert (options().messages, options().rounds) == (40_000, 3)
    quick = options("--quick")
    assert (quick.messages, quick.rounds) == (2000, 1)
    chosen = options("--quick", "--messages", "500", "--drains", "2", "--partitions", "4", "--keep-topics")
    assert (chosen.messages, chosen.rounds, chosen.partitions, chosen.keep_topics) == (500, 2, 4, True)
    with pytest.raises(ConfigurationError, match="--drains: 1 or more"):
        options("--drains", "0")


def report(threads: dict[str, Any] | None, ok: bool = True) -> dict[str, Any]:
    conservation = {"ok": ok}
    return {
        "model": {
            "name": "identity",
            "tokenizer_from": "models/default-int8",
            "in_results": ["identity tokenizer-of-m@v1"],
            "every_result_names_identity": True,
        },
        "max_window_messages": 256,
        "max_wait_ms": 50,
        "max_batch_size": 32,
        "max_batch_tokens": 4096,
        "machine": {"cpu_description": "Some CPU x2: AVX2"},
        "host_ceiling": {
            "messages": 1000,
            "messages_per_second": 8000.0,
            "rates_of_every_drain": [7900.0, 8000.0, 8100.0],
            "steady_messages_per_second": 8200.0,
            "conservation": conservation,
            "threads": threads,
        },
        "anchor": {
            "messages": 1000,
            "messages_per_second": 50000.0,
            "rates_of_every_drain": [50000.0],
            "loop": "consume -> produce",
            "conservation": {"ok": True},
            "cpu_us_per_review": {"loop_thread": 7.0, "process": 14.0},
        },
        "host_vs_anchor": 0.16,
        "host_vs_anchor_by_round": [0.158, 0.16, 0.162],
        "targets": {
            "host_vs_anchor": {"value": 0.16, "target": 0.4, "at_least": True, "met": False},
            "poll_us_per_review": {"value": 31.0, "target": 25.0, "at_least": False, "met": False},
        },
    }


def test_the_table_names_the_identity_model_and_each_thread_role() -> None:
    figures = cpu_per_review(SAMPLES, 1000, PID)
    table = format_host_ceiling_table(report(figures))
    assert "identity tokenizer-of-m@v1 (NO INFERENCE" in table and "every result names it: yes" in table
    assert "8,000.0 msg/s" in table and "50,000.0 msg/s" in table and "16.0%" in table
    for role in ROLES:
        assert f"  {role} " in table
    assert "anchor: loop thread 7.0 µs/review, whole process 14.0 µs/review" in table
    assert "host_vs_anchor" in table and "MISSED" in table and "31.0 µs" in table
    assert "too few samples" in format_host_ceiling_table(report(None))


def test_conserved_needs_every_review_once_and_the_identity_name() -> None:
    assert conserved(report(None))
    assert not conserved(report(None, ok=False))
    unnamed = report(None)
    unnamed["model"]["every_result_names_identity"] = False
    assert not conserved(unnamed)
