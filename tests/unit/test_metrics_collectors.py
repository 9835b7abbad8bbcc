"""Scrape-time metrics: seconds to drain the backlog, device memory, process RSS."""

from __future__ import annotations

import math
import sys
import types

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from tests.clocks import FakeClock
from worker.metrics import DeviceMemoryCollector, DrainTimeCollector, create_metrics


def _drain(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("sentiment_consumer_drain_seconds")


def test_drain_seconds_is_backlog_over_recent_rate() -> None:
    registry, clock = CollectorRegistry(), FakeClock(1000.0)
    lag = Gauge("lag", "", ["topic", "partition"], registry=registry)
    results = Counter("results", "", ["topic"], registry=registry)
    dead = Counter("dead", "", ["kind"], registry=registry)
    registry.register(DrainTimeCollector(lag, [results, dead], window_s=60, clock=clock))

    assert _drain(registry) == 0.0  # no backlog: nothing to drain
    lag.labels("t", "0").set(300)
    lag.labels("t", "1").set(100)
    assert _drain(registry) is None  # a backlog, but no rate yet (one scrape)
    clock.now += 10
    results.labels("out").inc(150)
    dead.labels("invalid_json").inc(50)  # 200 done in 10 s = 20/s; 400 behind → 20 s
    assert _drain(registry) == pytest.approx(20.0)
    clock.now += 10  # nothing done for 10 s: the rate over the window halves
    assert _drain(registry) == pytest.approx(40.0)


def test_drain_seconds_is_infinite_when_a_backlog_makes_no_progress_for_a_window() -> None:
    registry, clock = CollectorRegistry(), FakeClock(1000.0)
    lag = Gauge("lag", "", ["topic", "partition"], registry=registry)
    results = Counter("results", "", ["topic"], registry=registry)
    registry.register(DrainTimeCollector(lag, [results], window_s=30, clock=clock))
    results.labels("out").inc(500)
    lag.labels("t", "0").set(10)
    for _ in range(5):
        _drain(registry)
        clock.now += 15
    assert _drain(registry) == math.inf


def test_device_memory_is_absent_on_cpu_and_reported_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    registry.register(DeviceMemoryCollector())
    cuda = types.SimpleNamespace(
        memory_allocated=lambda i: 1024 * (i + 1),
        max_memory_allocated=lambda i: 4096,
        memory_reserved=lambda i: 8192,
    )
    fake_paddle = types.SimpleNamespace(device=types.SimpleNamespace(get_device=lambda: "cpu", cuda=cuda))
    monkeypatch.setitem(sys.modules, "paddle", fake_paddle)
    assert list(registry.collect()) == []

    fake_paddle.device.get_device = lambda: "gpu:1"
    values = {s.name: (s.labels, s.value) for f in registry.collect() for s in f.samples}
    assert values == {
        "sentiment_device_memory_allocated_bytes": ({"device": "gpu:1"}, 2048.0),
        "sentiment_device_memory_peak_bytes": ({"device": "gpu:1"}, 4096.0),
        "sentiment_device_memory_reserved_bytes": ({"device": "gpu:1"}, 8192.0),
    }


def test_worker_registry_reports_process_rss() -> None:
    registry = CollectorRegistry()
    create_metrics(registry)
    rss = registry.get_sample_value("process_resident_memory_bytes")
    assert rss is not None and rss > 10 * 1024 * 1024
