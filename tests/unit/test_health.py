"""Health state: liveness follows the poll loop, readiness needs model, partitions and broker."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from tests.clocks import FakeClock
from worker.health import HealthServer, HealthState


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


def _read_to_end(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def test_a_head_over_the_limit_gets_431_before_it_is_read_to_the_end() -> None:
    server = HealthServer("127.0.0.1", 0, CollectorRegistry(), HealthState(liveness_timeout_s=30))
    try:
        # 40 header lines of 30 KB (each under http.server's own 64 KiB line limit), 1.2 MB in all.
        with socket.create_connection(server.address, timeout=20) as sock:
            try:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")
                for i in range(40):
                    sock.sendall(b"X-Pad-%d: " % i + b"a" * 30_000 + b"\r\n")
            except OSError:
                pass  # closed while we were still sending; its answer is read below
            answer = _read_to_end(sock)
        assert answer.startswith(b"HTTP/1.0 431 ")
        host, port = server.address
        request = urllib.request.Request(f"http://{host}:{port}/healthz", headers={"X-Pad": "a" * 12_000})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
    finally:
        server.close()


def test_slow_heads_are_cut_off_at_the_header_timeout_while_others_are_served() -> None:
    server = HealthServer(
        "127.0.0.1", 0, CollectorRegistry(), HealthState(liveness_timeout_s=30), header_timeout_s=0.5
    )
    try:
        host, port = server.address
        stalled = socket.create_connection(server.address, timeout=20)
        stalled.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")  # then nothing
        idle = socket.create_connection(server.address, timeout=20)
        dripping = socket.create_connection(server.address, timeout=20)
        assert _get(f"http://{host}:{port}/healthz")[0] == 200  # served meanwhile
        for byte in b"GET /healthz HTTP/1.1\r\nHost: test\r\n" * 10:  # one byte every 0.1 s
            try:
                dripping.sendall(bytes([byte]))
            except OSError:
                break  # cut off
            time.sleep(0.1)
        for sock in (stalled, idle, dripping):
            assert _closed_without_answer(sock)
            sock.close()
    finally:
        server.close()


def _closed_without_answer(sock: socket.socket) -> bool:
    """The server closed the connection (http.server's way on a timeout: no answer); a reset (the client's
    bytes reached it closed) is closed too. A connection never closed fails on the read's timeout."""
    try:
        return _read_to_end(sock) == b""
    except ConnectionResetError:
        return True


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


def test_a_post_to_the_api_path_of_a_plain_worker_names_the_setting_in_json() -> None:
    """Issue 40: POST /v1/sentiment to `run` without the API answered an HTML 501."""
    server = HealthServer("127.0.0.1", 0, CollectorRegistry(), HealthState(liveness_timeout_s=30))
    try:
        host, port = server.address
        request = urllib.request.Request(
            f"http://{host}:{port}/v1/sentiment", data=b'{"text": "ok"}', method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 404
        body = json.loads(refused.value.read())
        assert body["error"] == "no_api" and "SENTIMENT_HTTP_API=true" in body["reason"]
        assert _get(f"http://{host}:{port}/healthz")[0] == 200  # still serving
    finally:
        server.close()
