"""The Schema Registry as the decode path asks it: `GET /schemas/ids/{id}`, one answer within a deadline.

confluent-kafka's client times each socket read, not the answer: a registry sending a byte every 3 s held
the poll loop for minutes. Here a request runs on a helper thread of its own while the caller waits at most
`timeout_s` for the whole answer (and no longer than a stop request): past that, the connection is shut
down under the helper (which then ends) and the caller gets `RegistryUnavailable`.

What an answer means (docs/schema-registry.md):
- 200 with a JSON object holding a `schema` string: the schema (`RegisteredSchema`); whether it can be read
  is the decoder's question (a bad schema the registry accepted is the producer's).
- 404 with the registry's error code 40403: no schema of that id (`UnknownSchemaId`), remembered for
  `UNKNOWN_ID_TTL_S` so a flood of one unknown id costs one request per period, not one per value.
- Anything else is registry trouble (`RegistryUnavailable`; the caller holds the values back and retries):
  unreachable, slower than the deadline, 401/403, 5xx, any other status, and an answer that is not the
  registry's (HTML, `{}`, a 404 without 40403: a proxy's page or a wrong URL path).
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from worker.errors import OperationError

UNKNOWN_ID_TTL_S: Final = 10.0
"""How long an answer "no schema of that id" stands before the id is asked again."""
MAX_ANSWER_BYTES: Final = 4 * 1_048_576
"""Bytes of one answer read at most; a longer one is a schema past the limits (`OversizedSchema`)."""
_UNKNOWN_IDS_KEPT: Final = 4096
_SCHEMA_NOT_FOUND: Final = 40403
_WAIT_SLICE_S: Final = 0.05  # how often the waiting caller looks at the stop request


class RegistryUnavailable(OperationError):
    """The Schema Registry did not answer, or not as a registry (unreachable, too slow, 5xx, refused our
    credentials, HTML): the value is not at fault. `str()` says what happened and what to check."""


class RegistryWaitStopped(RegistryUnavailable):
    """A stop was requested while a request waited for the registry: the request was given up."""


class UnknownSchemaId(OperationError, LookupError):
    """The registry holds no schema of that id (404, error code 40403)."""


class OversizedSchema(OperationError, ValueError):
    """The registry's answer for a schema id is longer than `MAX_ANSWER_BYTES`."""


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """A schema as the registry answered it: its type (`AVRO` when the answer leaves it out), its text, and
    how many references to other subjects it has."""

    schema_id: int
    schema_type: str
    schema_str: str
    references: int = 0


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    content_type: str
    body: bytes


class RegistryClient:
    """Asks one registry (base URL `url`, with `basic_auth` as `user:password` or the URL's user info, and
    a CA file for https) for schemas by id, each answer within `timeout_s` seconds and given up when `stop`
    is set. Used by one thread at a time (the poll loop, or a tool)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        basic_auth: str | None = None,
        ca_location: str | None = None,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(url.split(",")[0].strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not a Schema Registry URL: {url!r}; expected http(s)://host[:port][/path]")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._stop = stop
        self._clock = clock
        self._headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        credentials = basic_auth or (
            f"{unquote(parts.username or '')}:{unquote(parts.password or '')}" if parts.username else None
        )
        if credentials:
            token = base64.b64encode(credentials.encode("utf-8")).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
        self._tls = ssl.create_default_context(cafile=ca_location) if self._https else None
        self._unknown_until: dict[int, float] = {}

    @classmethod
    def from_conf(cls, conf: dict[str, Any], stop: threading.Event | None = None) -> RegistryClient:
        """From `WorkerSettings.schema_registry_conf()` (url, timeout, credentials, CA)."""
        return cls(
            conf["url"],
            timeout_s=float(conf["timeout"]),
            basic_auth=conf.get("basic.auth.user.info"),
            ca_location=conf.get("ssl.ca.location"),
            stop=stop,
        )

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema of `schema_id`. Raises `UnknownSchemaId`, `OversizedSchema` or `RegistryUnavailable`."""
        until = self._unknown_until.get(schema_id)
        if until is not None:
            if self._clock() < until:
                raise UnknownSchemaId(schema_id)
            del self._unknown_until[schema_id]
        answer = self._get(f"/schemas/ids/{schema_id}")
        if answer.status == 200:
            return self._registered(schema_id, answer)
        if answer.status == 404 and _error_code(answer) == _SCHEMA_NOT_FOUND:
            self._remember_unknown(schema_id)
            raise UnknownSchemaId(schema_id)
        raise RegistryUnavailable(self._status_trouble(answer))

    def _registered(self, schema_id: int, answer: _Answer) -> RegisteredSchema:
        if len(answer.body) > MAX_ANSWER_BYTES:
            raise OversizedSchema(f"the registry's answer is more than {MAX_ANSWER_BYTES:,} bytes")
        document = _json_object(answer.body)
        schema_str = document.get("schema") if document is not None else None
        schema_type = (document or {}).get("schemaType") or "AVRO"
        references = (document or {}).get("references") or []
        if (
            not isinstance(schema_str, str)
            or not isinstance(schema_type, str)
            or not isinstance(references, list)
        ):
            raise RegistryUnavailable(
                f"Schema Registry at {self.url} answered 200 for schema id {schema_id} with "
                f"{_shown(answer)}, not a schema: check that SENTIMENT_SCHEMA_REGISTRY_URL is the registry's "
                "API (Apicurio: .../apis/ccompat/v7); the worker retries"
            )
        return RegisteredSchema(schema_id, schema_type.upper(), schema_str, len(references))

    def _status_trouble(self, answer: _Answer) -> str:
        status = answer.status
        if status in (401, 403):
            fix = "check SENTIMENT_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO"
        elif status == 404:
            fix = "a 404 without the registry's 'schema not found' (40403): check the URL's path"
        else:
            fix = "the worker retries"
        return f"Schema Registry at {self.url} answered {status} ({_shown(answer)}): {fix}"

    def _remember_unknown(self, schema_id: int) -> None:
        now = self._clock()
        if len(self._unknown_until) >= _UNKNOWN_IDS_KEPT:
            self._unknown_until = {i: t for i, t in self._unknown_until.items() if t > now}
            while len(self._unknown_until) >= _UNKNOWN_IDS_KEPT:
                del self._unknown_until[next(iter(self._unknown_until))]  # the oldest
        self._unknown_until[schema_id] = now + UNKNOWN_ID_TTL_S

    def _get(self, path: str) -> _Answer:
        """One GET within the deadline, on a helper thread; the caller waits, watching the stop request."""
        if self._stop is not None and self._stop.is_set():
            raise RegistryWaitStopped(f"stop requested before asking the Schema Registry at {self.url}")
        exchange = _Exchange(self._connection(), self._path + path, self._headers)
        helper = threading.Thread(target=exchange.run, name="schema-registry-request", daemon=True)
        deadline = self._clock() + self._timeout_s
        helper.start()
        while not exchange.done.wait(max(0.0, min(_WAIT_SLICE_S, deadline - self._clock()))):
            if self._stop is not None and self._stop.is_set():
                exchange.abort()
                raise RegistryWaitStopped(
                    f"stop requested while waiting for the Schema Registry at {self.url}"
                )
            if self._clock() >= deadline:
                exchange.abort()
                raise RegistryUnavailable(
                    f"Schema Registry at {self.url} did not answer within {self._timeout_s:g} s "
                    "(SENTIMENT_SCHEMA_REGISTRY_TIMEOUT_S, for the whole answer): the worker retries"
                )
        if exchange.answer is not None:
            return exchange.answer
        error = exchange.error
        raise RegistryUnavailable(
            f"Schema Registry at {self.url} cannot be reached ({type(error).__name__}: {error}): start it "
            "or fix SENTIMENT_SCHEMA_REGISTRY_URL; the worker retries"
        )

    def _connection(self) -> _Abortable:
        if self._tls is not None:
            return _AbortableHTTPS(self._host, self._port, timeout=self._timeout_s, context=self._tls)
        return _AbortableHTTP(self._host, self._port, timeout=self._timeout_s)


class _Abortable(http.client.HTTPConnection):
    """A connection another thread can end: `abort()` shuts its socket down, which wakes a read blocked on
    it; one aborted before it connected refuses to go on once connected."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._aborted = False

    def connect(self) -> None:
        super().connect()
        with self._lock:
            if self._aborted:
                _shut(self.sock)
                raise ConnectionAbortedError("given up before it connected")

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            _shut(self.sock)


class _AbortableHTTP(_Abortable):
    pass


class _AbortableHTTPS(_Abortable, http.client.HTTPSConnection):
    pass


def _shut(sock: socket.socket | None) -> None:
    if sock is not None:
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _Exchange:
    """One request and its answer (at most `MAX_ANSWER_BYTES` + 1 bytes of body), run by a helper thread."""

    def __init__(self, connection: _Abortable, path: str, headers: dict[str, str]) -> None:
        self._connection = connection
        self._path = path or "/"
        self._headers = headers
        self.done = threading.Event()
        self.answer: _Answer | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._connection.request("GET", self._path, headers=self._headers)
            response = self._connection.getresponse()
            body = response.read(MAX_ANSWER_BYTES + 1)
            self.answer = _Answer(response.status, response.getheader("Content-Type") or "", body)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            self.error = exc
        finally:
            self._connection.close()
            self.done.set()

    def abort(self) -> None:
        self._connection.abort()


def _json_object(body: bytes) -> dict[str, Any] | None:
    """The answer as a JSON object, or None (not JSON, not an object, nested absurdly deep)."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def _error_code(answer: _Answer) -> object:
    document = _json_object(answer.body)
    return document.get("error_code") if document is not None else None


def _shown(answer: _Answer) -> str:
    """An answer in a few words for a reason: its content type and first characters."""
    start = answer.body[:80].decode("utf-8", "replace").replace("\n", " ")
    return f"{answer.content_type or 'no content type'}, {len(answer.body)} bytes: {start!r}"
