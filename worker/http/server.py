"""uvicorn in a thread of its own: the process keeps its own signal handling and lifecycle (the worker's
ExitStack, serve's stop event); `close()` stops accepting, lets requests in progress finish, and returns."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from worker.errors import ConfigurationError
from worker.health import check_port
from worker.http.connections import BoundedProtocol, ConnectionLimits

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 30.0


class HttpServerError(ConfigurationError):
    """The server did not start (e.g. the port is taken)."""


class HttpServer:
    """Serves an ASGI `app` on `host:port` (0: a free port) from a daemon thread until `close()`, each
    connection bounded by `limits` (head size, timeouts, how many at once; default: the settings'
    defaults); `on_refusal(error)` is called for each connection a bound refused."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        *,
        graceful_timeout_s: float = 30.0,
        limits: ConnectionLimits | None = None,
        on_refusal: Callable[[str], None] | None = None,
    ) -> None:
        protocol: Any = functools.partial(
            BoundedProtocol, limits=limits or ConnectionLimits.defaults(), on_refusal=on_refusal
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            http=protocol,
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=max(1, round(graceful_timeout_s)),
        )
        check_port(host, port)  # one clear line, before uvicorn would log its own traceback
        self._server = uvicorn.Server(config)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                raise HttpServerError(f"cannot serve HTTP on {host}:{port} (is the port taken?)")
            time.sleep(0.01)

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port)."""
        sock = self._server.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        return str(host), int(port)

    def close(self, timeout_s: float = 35.0) -> None:
        """Stops accepting connections, waits for the requests in progress, then returns (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("HTTP server still closing after %.0f s; leaving it (daemon)", timeout_s)

    def _serve(self) -> None:
        try:
            self._server.run()
        except SystemExit:  # uvicorn exits on a bind failure; __init__ reports it
            log.error("HTTP server failed to start", exc_info=True)
