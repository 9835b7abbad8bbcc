"""Health state: liveness follows the poll loop, readiness needs model, partitions and broker."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from worker.health import HealthServer, HealthState


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_liveness_fails_when_the_loop_stalls() -> None:
    clock = FakeClock()
    health = HealthState(liveness_timeout_s=30, clock=clock)
    assert health.liveness()[0]
    clock.now += 31
    assert not health.liveness()[0]
    health.loop_turned()
    assert health.liveness()[0]


def test_readiness_needs_every_condition() -> None:
    health = HealthState(liveness_timeout_s=30)
    assert not health.readiness()[0]
    health.model_warm, health.broker_reachable = True, True
    assert not health.readiness()[0]  # no partitions yet
    health.assigned_partitions = 2
    assert health.readiness()[0]
    health.stopping = True
    assert not health.readiness()[0]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_endpoints_serve_metrics_and_status_codes() -> None:
    registry = CollectorRegistry()
    Counter("probe_things_total", "things", registry=registry).inc(3)
    health = HealthState(liveness_timeout_s=30)
    server = HealthServer("127.0.0.1", 0, registry, health)
    try:
        host, port = server.address
        base = f"http://{host}:{port}"
        status, body = _get(base + "/metrics")
        assert status == 200 and b"probe_things_total 3.0" in body
        status, body = _get(base + "/readyz")
        assert status == 503 and json.loads(body)["model_warm"] is False
        assert _get(base + "/healthz")[0] == 200
        assert _get(base + "/nope")[0] == 404
    finally:
        server.close()


def test_a_stuck_partition_fails_readiness_and_is_named() -> None:
    health = HealthState(liveness_timeout_s=30)
    health.model_warm, health.broker_reachable, health.assigned_partitions = True, True, 3
    ready, checks = health.readiness()
    assert ready and "stuck_partitions" not in checks
    health.stuck_partitions = {"reviews[2]": 130.04}
    ready, checks = health.readiness()
    assert not ready and checks["stuck_partitions"] == {"reviews[2]": 130.0}
    health.stuck_partitions = {}
    assert health.readiness()[0]
