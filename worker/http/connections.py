"""Bounded connections for the uvicorn server: what uvicorn's own HTTP/1.1 protocol (httptools) leaves open.

uvicorn reads a request head of any size, waits for it (and for a body) forever, keeps a connection that
never sent a byte, and times out an idle keep-alive connection only until its first byte. `BoundedProtocol`
adds, per connection:
- a head of at most `max_header_bytes` (request line and headers; past it: 431, closed);
- the head complete within `header_timeout_s` of the connection's opening, or of the first byte after the
  previous answer (else 408, closed; a connection that never sent a byte is just closed);
- the body complete within `body_timeout_s` of its head (else 408, closed; the app sees a disconnect);
- at most `keep_alive_s` idle after an answer (uvicorn's keep-alive timeout);
- at most `max_connections` open at once: past it, a new connection gets 503 with Retry-After and is closed
  before anything of it is parsed.
A refused connection is answered, then the rest of what the client sends is read and dropped for at most
`_LINGER_S` before the close: closing on unread data would reset the connection, and the client could
lose the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from schemas.http_api import ErrorResponse
from worker.config import HttpSettings, WorkerSettings

_LINGER_S = 1.0


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds of every connection: the settings `http_max_header_bytes`, `http_header_timeout_s`,
    `http_body_timeout_s`, `http_keep_alive_s` and `http_max_connections`."""

    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    keep_alive_s: float
    max_connections: int

    @classmethod
    def from_settings(cls, http: HttpSettings) -> ConnectionLimits:
        return cls(
            max_header_bytes=http.http_max_header_bytes,
            header_timeout_s=http.http_header_timeout_s,
            body_timeout_s=http.http_body_timeout_s,
            keep_alive_s=http.http_keep_alive_s,
            max_connections=http.http_max_connections,
        )

    @classmethod
    def defaults(cls) -> ConnectionLimits:
        """The settings' defaults (without reading the environment)."""
        fields = WorkerSettings.model_fields
        return cls(
            max_header_bytes=fields["http_max_header_bytes"].default,
            header_timeout_s=fields["http_header_timeout_s"].default,
            body_timeout_s=fields["http_body_timeout_s"].default,
            keep_alive_s=fields["http_keep_alive_s"].default,
            max_connections=fields["http_max_connections"].default,
        )


REFUSED_STATUS = "sentiment.refused_status"
"""The ASGI scope key under which a bound records the status it answered a request with itself (408 for a
body too slow): its app sees only a disconnect, and counts the request under this status, not as a client
that went away."""


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of `ConnectionLimits` (uvicorn builds one per
    connection: pass `functools.partial(BoundedProtocol, limits=...)` as its `http`); `on_refusal` is called
    with the reason of each connection a bound closes (`header_too_large`, `header_timeout`, `body_timeout`,
    `too_many_connections`; not the idle ones)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ConnectionLimits,
        on_refusal: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._limits = limits
        self._on_refusal = on_refusal
        self.timeout_keep_alive = limits.keep_alive_s  # type: ignore[assignment]  # uvicorn's says int
        self._reading_head = True  # every byte fed from here to the end of the head counts against the limit
        self._head_bytes = 0
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False  # answered and closing: what still arrives is dropped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self._limits.max_connections:
            self.transport = transport
            reason = f"{len(self.connections)} connections are open (http_max_connections); retry shortly"
            self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, "too_many_connections", reason, retry_after_s=1)
            return
        super().connection_made(transport)
        self._arm(self._limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._reading_head:
            super().data_received(data)
            return
        if self._deadline is None:  # the first byte of a request after an answer: its head has a deadline
            self._arm(self._limits.header_timeout_s, self._head_timed_out)
        # Feed at most what is left of the head's allowance; what follows is fed only once the head ended.
        room = self._limits.max_header_bytes - self._head_bytes
        self._head_bytes += min(room, len(data))
        super().data_received(data[:room] if len(data) > room else data)
        if len(data) <= room or self.transport.is_closing():
            return
        if self._reading_head:
            limit = self._limits.max_header_bytes
            reason = f"the request head is larger than {limit} bytes (http_max_header_bytes)"
            self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "header_too_large", reason)
            return
        self.data_received(data[room:])

    def on_message_begin(self) -> None:
        if self._deadline is None:  # a head begun after an answer, or right behind the previous request
            self._arm(self._limits.header_timeout_s, self._head_timed_out)
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._head_bytes = 0
        self._arm(self._limits.body_timeout_s, self._body_timed_out)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._reading_head = True
        super().on_message_complete()

    def _head_timed_out(self) -> None:
        self._deadline = None
        if self._head_bytes == 0 and (self.cycle is None or self.cycle.response_complete):
            self.transport.close()  # idle: nothing sent since the opening or since the last answer
            return
        limit_s = self._limits.header_timeout_s
        reason = f"the request head was not complete within {limit_s:g} s (http_header_timeout_s)"
        self._refuse(HTTPStatus.REQUEST_TIMEOUT, "header_timeout", reason)

    def _body_timed_out(self) -> None:
        self._deadline = None
        cycle = self.cycle
        if cycle is not None and cycle.response_started:  # answered before its body came (e.g. 413): closed
            if self._on_refusal is not None:
                self._on_refusal("body_timeout")
            cycle.disconnected = True
            cycle.message_event.set()
            self._linger_then_close()
            return
        limit_s = self._limits.body_timeout_s
        reason = f"the request body was not complete within {limit_s:g} s (http_body_timeout_s)"
        self._refuse(HTTPStatus.REQUEST_TIMEOUT, "body_timeout", reason)

    def _arm(self, seconds: float, callback: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _refuse(
        self, status: HTTPStatus, error: str, reason: str, *, retry_after_s: int | None = None
    ) -> None:
        """Answers `status` with the API's error body and closes the connection. A request in progress on it
        is dropped (its app sees a disconnect); if its answer is already being sent, no other follows."""
        if self._on_refusal is not None:
            self._on_refusal(error)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if not cycle.response_started:
                cycle.scope[REFUSED_STATUS] = status.value  # type: ignore[literal-required]
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                self._linger_then_close()
                return
        body = ErrorResponse(error=error, reason=reason).model_dump_json().encode()
        head = [
            f"HTTP/1.1 {status.value} {status.phrase}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
        ]
        if retry_after_s is not None:
            head.append(f"retry-after: {retry_after_s}")
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body)
        self._linger_then_close()

    def _linger_then_close(self) -> None:
        self._refused = True
        self._disarm()
        self._unset_keepalive_if_required()
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the answer, then end of stream; reading goes on (dropped)
        self.transport.resume_reading()
        self._deadline = self.loop.call_later(_LINGER_S, self.transport.close)
