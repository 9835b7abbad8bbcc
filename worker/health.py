"""Health state and what /metrics, /healthz (liveness) and /readyz (readiness) answer, for both servers
that serve them: the worker's own (`HealthServer`, http.server) and the FastAPI app (worker/http/api.py)."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from worker.config import WorkerSettings
from worker.errors import ConfigurationError

_LINGER_S = 1.0
"""After a refusal, how long what the client still sends is read and dropped before the close (closing on
unread data resets the connection, and the client could lose the answer)."""


class HealthState:
    """What the poll loop reports about itself; read by the HTTP thread.

    Plain attribute writes of immutable values are atomic in CPython, so no lock is needed.
    """

    def __init__(
        self, liveness_timeout_s: float, clock: Callable[[], float] = time.monotonic, *, kafka: bool = True
    ) -> None:
        self._clock = clock
        self._kafka = kafka  # False for `serve`: ready needs no partitions and no broker
        self._liveness_timeout_s = liveness_timeout_s
        self.last_loop_at: float = clock()
        self.model_warm = False
        self.assigned_partitions = 0
        self.broker_reachable = False
        self.stopping = False
        self.stuck_partitions: dict[str, float] = {}  # "topic[partition]" → seconds without progress
        self.registry_problem: str | None = None  # why the Schema Registry cannot be used now, if it cannot
        self.undecodable_batches: dict[str, str] = {}  # "topic[partition]" → the batch it is held by
        self.delivery_problem: str | None = None  # why results cannot be published now (exactly_once)

    def loop_turned(self) -> None:
        self.last_loop_at = self._clock()

    def liveness(self) -> tuple[bool, dict[str, object]]:
        """Alive while the poll loop turned within the liveness timeout."""
        stalled_s = self._clock() - self.last_loop_at
        ok = stalled_s <= self._liveness_timeout_s
        return ok, {"poll_loop_stalled_s": round(stalled_s, 3), "limit_s": self._liveness_timeout_s}

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Ready: model warm, partitions assigned, broker answering, not stopping, no partition stuck (its
        work has not moved for longer than `stuck_partition_s` while inputs wait; named with its seconds
        under "stuck_partitions") nor held by a record batch the consumer cannot read ("undecodable_batches"),
        the Schema Registry answering when a window needs it (else its trouble under "schema_registry"),
        results publishable (else why under "delivery": transactions that do not go through) (serve: warm
        and not stopping)."""
        if not self._kafka:
            return self.model_warm and not self.stopping, {
                "model_warm": self.model_warm,
                "stopping": self.stopping,
            }
        checks: dict[str, object] = {
            "model_warm": self.model_warm,
            "partitions_assigned": self.assigned_partitions,
            "broker_reachable": self.broker_reachable,
            "stopping": self.stopping,
        }
        stuck = self.stuck_partitions
        if stuck:
            checks["stuck_partitions"] = {name: round(seconds, 1) for name, seconds in sorted(stuck.items())}
        if self.registry_problem is not None:
            checks["schema_registry"] = self.registry_problem
        undecodable = self.undecodable_batches
        if undecodable:
            checks["undecodable_batches"] = dict(sorted(undecodable.items()))
        if self.delivery_problem is not None:
            checks["delivery"] = self.delivery_problem
        ok = self.model_warm and self.assigned_partitions > 0 and self.broker_reachable and not self.stopping
        trouble = self.registry_problem is not None or self.delivery_problem is not None
        return ok and not stuck and not undecodable and not trouble, checks


@dataclass(frozen=True)
class EndpointAnswer:
    """One answer of /metrics, /healthz or /readyz, whichever server sends it."""

    status: int
    body: bytes
    content_type: str


NOT_FOUND = EndpointAnswer(404, b'{"error": "try /metrics, /healthz or /readyz"}', "application/json")


def endpoint_answer(path: str, registry: CollectorRegistry, health: HealthState) -> EndpointAnswer:
    """What `GET path` answers: /metrics the registry's exposition (200); /healthz and /readyz 200 with
    `{"status": "ok", <checks>}` when live / ready, else 503 with `{"status": "fail", <checks>}`; any other
    path 404."""
    if path == "/metrics":
        return EndpointAnswer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
    if path in ("/healthz", "/readyz"):
        ok, checks = health.liveness() if path == "/healthz" else health.readiness()
        body = json.dumps({"status": "ok" if ok else "fail", **checks}).encode()
        return EndpointAnswer(200 if ok else 503, body, "application/json")
    return NOT_FOUND


class _HeadTooLarge(Exception):
    pass


class _BoundedHead(io.RawIOBase):
    """The connection's bytes, at most `max_bytes` of them and until `deadline` (monotonic): a GET is all
    head, and the server reads one request per connection (HTTP/1.0)."""

    def __init__(self, sock: socket.socket, max_bytes: int, deadline: float) -> None:
        self._sock, self._room, self._deadline = sock, max_bytes, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._room <= 0:
            raise _HeadTooLarge
        left_s = self._deadline - time.monotonic()
        if left_s <= 0:
            raise TimeoutError("request head not complete in time")
        self._sock.settimeout(left_s)  # each read waits at most what is left, not a full timeout each
        with memoryview(buffer) as view:
            got = self._sock.recv_into(view[: self._room])
        self._room -= got
        return got


def _make_handler(
    registry: CollectorRegistry, health: HealthState, max_header_bytes: int, header_timeout_s: float
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def setup(self) -> None:
            super().setup()
            deadline = time.monotonic() + header_timeout_s
            self.rfile = io.BufferedReader(_BoundedHead(self.connection, max_header_bytes, deadline))

        def handle_one_request(self) -> None:
            # A head past the deadline: http.server closes the connection (TimeoutError); past the size: 431.
            try:
                super().handle_one_request()
            except _HeadTooLarge:
                self.requestline, self.request_version = "", "HTTP/1.0"
                self.close_connection = True
                reason = f"the request head is larger than {max_header_bytes} bytes (http_max_header_bytes)"
                self.send_error(431, explain=reason)
                self.wfile.flush()
                self._linger()

        def _linger(self) -> None:
            self.connection.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + _LINGER_S
            drop = bytearray(65536)
            while (left_s := deadline - time.monotonic()) > 0:
                self.connection.settimeout(left_s)
                try:
                    if not self.connection.recv_into(drop):
                        return
                except OSError:
                    return

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            answer = endpoint_answer(self.path.split("?", 1)[0], registry, health)
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            """No API on this port: say which setting puts it here, as the API's refusals say things."""
            if self.path.split("?", 1)[0].startswith("/v1/"):
                status, error = 404, "no_api"
                reason = (
                    "this worker serves only /metrics, /healthz and /readyz on this port: set "
                    "SENTIMENT_HTTP_API=true to answer the API here, or run `sentiment-worker serve`"
                )
            else:
                status, error, reason = 405, "method_not_allowed", "this port answers GET only"
            body = json.dumps({"error": error, "reason": reason}).encode()
            self.close_connection = True  # the request body is not read
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815 (http.server's names)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # scrapes every few seconds would flood the log

    return Handler


_DEFAULTS = WorkerSettings.model_fields


class PortInUseError(ConfigurationError):
    """The HTTP port cannot be had (another replica or program holds it): a setting to change."""


def check_port(host: str, port: int) -> None:
    """Raises PortInUseError, in one line naming the setting, when `host:port` cannot be listened on (as
    a server binds it: SO_REUSEADDR on); port 0 (any free port) always can."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise PortInUseError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}; another replica or program holds "
                "it: give each replica on this host its own SENTIMENT_HTTP_PORT (0: no HTTP port)"
            ) from None


class HealthServer:
    """Serves the endpoints from a daemon thread (one more per connection); `close()` stops it. A
    connection's request head must be at most `max_header_bytes` (else 431) and complete within
    `header_timeout_s` of its opening (else the connection is closed)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: HealthState,
        *,
        max_header_bytes: int = _DEFAULTS["http_max_header_bytes"].default,
        header_timeout_s: float = _DEFAULTS["http_header_timeout_s"].default,
    ) -> None:
        handler = _make_handler(registry, health, max_header_bytes, header_timeout_s)
        check_port(host, port)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-http", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
