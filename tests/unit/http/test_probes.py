"""/metrics, /healthz and /readyz answer the same from the worker's health server (http.server) and from the
FastAPI app (`serve`, or the worker with http_api): one builder, `worker.health.endpoint_answer`."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, Counter

from worker.config import WorkerSettings
from worker.health import HealthServer, HealthState
from worker.http.api import ApiState, build_app
from worker.http.server import HttpServer
from worker.metrics import create_http_metrics


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Servers:
    health_server: str
    fastapi_server: str
    health: HealthState
    clock: FakeClock


def _servers(kafka: bool) -> Iterator[Servers]:
    registry = CollectorRegistry()
    Counter("probe_things", "things", registry=registry).inc(3)
    clock = FakeClock()
    health = HealthState(30, clock, kafka=kafka)
    s = WorkerSettings().sections
    api = ApiState(s.http, s.limits, registry, health, create_http_metrics(registry))
    plain = HealthServer("127.0.0.1", 0, registry, health)
    fast = HttpServer(build_app(api), "127.0.0.1", 0, graceful_timeout_s=1)
    try:
        yield Servers(
            "http://{}:{}".format(*plain.address), "http://{}:{}".format(*fast.address), health, clock
        )
    finally:
        fast.close()
        plain.close()


@pytest.fixture
def worker_servers() -> Iterator[Servers]:
    yield from _servers(kafka=True)


@pytest.fixture
def serve_servers() -> Iterator[Servers]:
    yield from _servers(kafka=False)


def _get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers["Content-Type"]


def _same_answer(servers: Servers, path: str) -> tuple[int, dict[str, object]]:
    """The (status, JSON body) both servers answer for `path`, after checking they are byte-identical."""
    plain = _get(servers.health_server + path)
    fast = _get(servers.fastapi_server + path)
    assert plain == fast, f"{path}: health server {plain} != FastAPI {fast}"
    status, body, content_type = plain
    assert content_type == "application/json"
    return status, json.loads(body)


def test_not_ready_then_ready_then_stopping(worker_servers: Servers) -> None:
    health = worker_servers.health
    assert _same_answer(worker_servers, "/readyz") == (
        503,
        {
            "status": "fail",
            "model_warm": False,
            "partitions_assigned": 0,
            "broker_reachable": False,
            "stopping": False,
        },
    )
    health.model_warm, health.broker_reachable, health.assigned_partitions = True, True, 3
    status, body = _same_answer(worker_servers, "/readyz")
    assert (status, body["status"], body["partitions_assigned"]) == (200, "ok", 3)
    health.stopping = True
    status, body = _same_answer(worker_servers, "/readyz")
    assert (status, body["status"], body["stopping"]) == (503, "fail", True)


def test_healthy_then_stalled(worker_servers: Servers) -> None:
    worker_servers.clock.now += 12.5
    assert _same_answer(worker_servers, "/healthz") == (
        200,
        {"status": "ok", "poll_loop_stalled_s": 12.5, "limit_s": 30},
    )
    worker_servers.clock.now += 20
    assert _same_answer(worker_servers, "/healthz") == (
        503,
        {"status": "fail", "poll_loop_stalled_s": 32.5, "limit_s": 30},
    )
    worker_servers.health.loop_turned()
    assert _same_answer(worker_servers, "/healthz")[0] == 200


def test_serve_readiness_needs_no_broker(serve_servers: Servers) -> None:
    assert _same_answer(serve_servers, "/readyz") == (
        503,
        {"status": "fail", "model_warm": False, "stopping": False},
    )
    serve_servers.health.model_warm = True
    assert _same_answer(serve_servers, "/readyz") == (
        200,
        {"status": "ok", "model_warm": True, "stopping": False},
    )


def test_metrics_are_the_same_exposition(worker_servers: Servers) -> None:
    plain = _get(worker_servers.health_server + "/metrics")
    fast = _get(worker_servers.fastapi_server + "/metrics")
    assert plain == fast
    status, body, content_type = plain
    assert status == 200 and b"probe_things_total 3.0" in body
    assert content_type.startswith("text/plain")
