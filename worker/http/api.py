"""The HTTP serving of the model: a FastAPI app with `POST /v1/sentiment` (through the `RequestAdmission`),
the page at `/`, and `/metrics`, `/healthz`, `/readyz` as in the worker.

`POST /v1/sentiment` has one route: `ApiGuard` answers it from the body it read, past FastAPI's routing,
dependency and exception layers (on a 2-core machine they cost more of the event loop's time than the
endpoint itself); FastAPI's route for it only documents it (OpenAPI, /docs). The body is validated in one
place, `validation.validate_body`.

With a token set, `/openapi.json` needs it too and `/docs`, `/redoc` are off (404): they would run a CDN's
scripts in the origin where the page keeps the token. The page, `/metrics` and the probes stay open.

Refusals, each with `{"error": ..., "reason": ...}`: 401 without the bearer token (when one is set), 413 for
a body over `http_max_body_bytes` or more than `http_max_texts` texts, 415 for a body not sent as
`Content-Type: application/json` (naming the header to send), 422 for malformed JSON, a missing or
non-string text, a single `text` that is empty, blank or over `max_text_chars` (in a `texts` list such a
text gets its own `error` and the others are labelled), 503 with `Retry-After` when the queue is
full (or the server is starting or stopping), 504 after `http_request_timeout_s`.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPBearer
from prometheus_client import CollectorRegistry
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException

from schemas.http_api import (
    ErrorResponse,
    ItemError,
    SentimentRequest,
    SentimentResponse,
    TextSentiment,
    Timing,
)
from schemas.review_input import Review
from schemas.sentiment_result import ModelRef
from worker.config import HttpSettings, LimitsSettings
from worker.health import HealthState, endpoint_answer
from worker.http.admin import ModelsAdmin
from worker.http.admission import AdmissionClosed, Overloaded, RequestAdmission, RequestOutcome
from worker.http.connections import REFUSED_STATUS
from worker.http.page import FAVICON_MEDIA_TYPE, favicon_ico, render_page
from worker.http.validation import Refusal, RequestItem, RequestLimits, validate_body
from worker.inference.classifier import InferenceFailure
from worker.inference.label_fields import label_fields
from worker.metrics import HttpMetrics, WorkerMetrics

Scope = MutableMapping[str, Any]
AsgiMessage = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[AsgiMessage]]
Send = Callable[[AsgiMessage], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

API_PATH = "/v1/sentiment"
OPENAPI_PATH = "/openapi.json"
CLIENT_CLOSED = 499
"""What `sentiment_http_requests_total` counts a request under when its client closed the connection
before sending the whole body (nginx's "client closed request"; nothing is answered)."""
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": what}
    for code, what in (
        (401, "missing or wrong bearer token"),
        (413, "body too large, or too many texts"),
        (415, "the body is not sent as Content-Type: application/json"),
        (422, "malformed JSON, missing / non-string text; a single `text` empty, blank or too long"),
        (503, "queue full, starting or stopping (see Retry-After)"),
        (504, "not answered in time"),
    )
}


class ApiState:
    """What the routes use: the http section and the input limits, health, metrics, and (once the model is
    warm) the admission."""

    def __init__(
        self,
        http: HttpSettings,
        limits: LimitsSettings,
        registry: CollectorRegistry,
        health: HealthState,
        http_metrics: HttpMetrics,
        admin: ModelsAdmin | None = None,
    ) -> None:
        self.http = http
        self.admin = admin  # serve's admin route (model_control=api), None without
        self.limits = limits
        self.registry = registry
        self.health = health
        self.http_metrics = http_metrics
        self._limits = RequestLimits.from_settings(http, limits)
        self._admission: RequestAdmission | None = None
        self._labels: list[str] = []
        self._metrics: WorkerMetrics | None = None  # set by attach

    def attach(self, admission: RequestAdmission, labels: list[str], metrics: WorkerMetrics) -> None:
        """The model is warm: requests go to `admission` from now on; their results are counted in `metrics`
        as the Kafka worker counts its own (by label and model version, confidence)."""
        self._labels, self._metrics = list(labels), metrics
        self._admission = admission

    def early_refusal(self) -> JSONResponse | None:
        """A 503 decided before the body is read or parsed (overload must be cheap to refuse): not ready,
        stopping, or the queue already full."""
        admission = self._admission
        if admission is None:
            return error_response(503, "not_ready", "the model is still loading", retry_after_s=1)
        if admission.closing:
            return error_response(503, "stopping", "the server is stopping", retry_after_s=1)
        if admission.is_full:
            reason = f"{admission.queued_texts} texts are already waiting for the model"
            return error_response(503, "overloaded", reason, retry_after_s=admission.retry_after_s)
        return None

    async def respond(self, body: bytes) -> Response:
        """The answer to `POST /v1/sentiment` with this raw body: the results in request order (a bad text of
        a list gets its own error), or the refusal (`validate_body`'s, or 503 / 504 from the admission)."""
        items = validate_body(body, self._limits)
        if isinstance(items, Refusal):
            return error_response(items.status, items.error, items.reason)
        accepted = time.perf_counter()
        admission = self._admission
        if admission is None:
            return error_response(503, "not_ready", "the model is still loading", retry_after_s=1)
        timeout_s = self.http.http_request_timeout_s
        reviews = [Review(item.id, item.text, {}) for item in items if item.problem is None]
        outcome = RequestOutcome(
            outputs=[], model=None, queue_seconds=0.0, labelling_seconds=0.0, batch_texts=0
        )
        if reviews:
            try:
                future = admission.submit(reviews)
                outcome = await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
            except (Overloaded, AdmissionClosed) as exc:
                return status_of(exc)
            except TimeoutError:
                return error_response(504, "timeout", f"not labelled within {timeout_s:g} s")
        self.http_metrics.texts.inc(len(items))
        answer = self._response(items, outcome, admission.model, time.perf_counter() - accepted)
        return Response(answer.model_dump_json(), media_type="application/json")

    def _response(
        self, items: list[RequestItem], outcome: RequestOutcome, primary: ModelRef, seconds: float
    ) -> SentimentResponse:
        """`outcome.model` made the labels; a request of only odd texts names the primary."""
        model = outcome.model or primary
        outputs = iter(outcome.outputs)
        results = [
            result_of(item.id, next(outputs), self._labels)
            if item.problem is None
            else TextSentiment(
                id=item.id, error=ItemError(kind=item.problem.kind.value, reason=item.problem.reason)
            )
            for item in items
        ]
        if self._metrics is not None:
            for result in results:
                if result.label is not None and result.confidence is not None:
                    self._metrics.observe_prediction(result.label, result.confidence, model.version)
        timing = Timing(
            total_ms=round(seconds * 1000, 3),
            queue_ms=round(outcome.queue_seconds * 1000, 3),
            inference_ms=round(outcome.labelling_seconds * 1000, 3),
            batch_texts=outcome.batch_texts,
        )
        return SentimentResponse(model=model, results=results, timing=timing)


def result_of(item_id: str, output: Any, labels: list[str]) -> TextSentiment:
    """One text's result: the label fields of a Kafka result, or the error that replaced them."""
    if isinstance(output, InferenceFailure):
        return TextSentiment(id=item_id, error=ItemError(kind=output.kind.value, reason=output.reason))
    return TextSentiment(id=item_id, **label_fields(output, labels))


def status_of(error: Overloaded | AdmissionClosed) -> JSONResponse:
    """The one mapping of the project's errors to HTTP answers (refusals of the body are `validation`'s):
    the model's queue is full, or the server is stopping; both 503 with when to retry."""
    if isinstance(error, Overloaded):
        return error_response(503, "overloaded", str(error), retry_after_s=error.retry_after_s)
    return error_response(503, "stopping", str(error), retry_after_s=1)


def error_response(status: int, error: str, reason: str, *, retry_after_s: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    if status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="sentiment"'}
    return JSONResponse(ErrorResponse(error=error, reason=reason).model_dump(), status, headers=headers)


_HTTP_ERRORS = {404: "not_found", 405: "method_not_allowed"}


def build_app(api: ApiState) -> FastAPI:
    """The FastAPI app: the API, the page, metrics and probes; guarded as the settings say."""
    s = api.http
    # With a token, /docs and /redoc are off: they load Swagger UI / ReDoc scripts from a CDN into this
    # origin, where the page keeps the token; /openapi.json is for token holders (ApiGuard).
    guarded = s.api_token is not None
    app = FastAPI(
        title="sentiment-worker",
        summary="Sentiment of Chinese reviews, batched by the Kafka worker's own engine.",
        version="1",
        docs_url=None if guarded else "/docs",
        redoc_url=None if guarded else "/redoc",
        openapi_url=OPENAPI_PATH,
    )
    _add_error_shape(app)
    _add_api_route(app, guarded)
    _add_page_routes(app, api)
    if api.admin is not None:
        api.admin.add_routes(app)
    _add_probe_routes(app, api)
    _add_middleware(app, api)
    return app


def _add_error_shape(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def as_error_response(_request: Request, exc: StarletteHTTPException) -> Response:
        """FastAPI's own refusals (404, 405) in the API's `{error, reason}` shape, not `{"detail": ...}`."""
        error = _HTTP_ERRORS.get(exc.status_code, "http_error")
        answer = error_response(exc.status_code, error, str(exc.detail))
        for name, value in (exc.headers or {}).items():
            answer.headers[name] = value  # e.g. 405's Allow
        return answer


def _add_api_route(app: FastAPI, guarded: bool) -> None:
    # Documents the bearer scheme in OpenAPI; ApiGuard enforces it before the body is read.
    security = [Depends(HTTPBearer(auto_error=False))] if guarded else []

    @app.post(
        API_PATH,
        response_model=SentimentResponse,
        responses=_ERRORS,
        dependencies=security,
        summary="Label one review or a list of reviews (results in request order)",
    )
    async def sentiment(request: SentimentRequest) -> SentimentResponse:
        # OpenAPI only (request and response models, refusals): ApiGuard answers every POST /v1/sentiment
        # (`api.respond`) before FastAPI routes it.
        raise RuntimeError(f"POST {API_PATH} is answered by ApiGuard, which build_app puts in front")


def _add_page_routes(app: FastAPI, api: ApiState) -> None:
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(render_page(api.http, api.limits))

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        # Browsers ask for it on every page; without it each visit logs a 404.
        cached = {"Cache-Control": "max-age=86400"}
        return Response(favicon_ico(), media_type=FAVICON_MEDIA_TYPE, headers=cached)


def _add_probe_routes(app: FastAPI, api: ApiState) -> None:
    def answer(path: str) -> Response:
        # The worker's own health server answers the same (worker/health.py builds both answers).
        said = endpoint_answer(path, api.registry, api.health)
        return Response(said.body, said.status, media_type=said.content_type)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return answer("/metrics")

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> Response:
        return answer("/healthz")

    @app.get("/readyz", summary="Readiness")
    async def readyz() -> Response:
        return answer("/readyz")


def _add_middleware(app: FastAPI, api: ApiState) -> None:
    s = api.http
    token = s.api_token.get_secret_value() if s.api_token is not None else None
    app.add_middleware(
        ApiGuard,
        token=token,
        max_body_bytes=s.http_max_body_bytes,
        metrics=api.http_metrics,
        early_refusal=api.early_refusal,
        route=api.respond,
    )
    if s.http_cors_origins:  # added last: outermost, so every answer carries its headers, the guard's too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=s.http_cors_origins,
            allow_methods=["GET", "POST", "PUT"] if api.admin is not None else ["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )


async def _unauthorized(scope: Scope, receive: Receive, send: Send) -> None:
    await error_response(401, "unauthorized", "send the header `Authorization: Bearer <token>`")(
        scope, receive, send
    )


def is_json_media_type(content_type: str | None) -> bool:
    """True for `application/json` and `application/<anything>+json`, with any parameters (charset)."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


class ApiGuard:
    """ASGI middleware in front of /v1/ and /openapi.json (the bearer token, when one is set: 401), and the
    one route of `POST /v1/sentiment`: the bearer token (401),
    then for that route the early 503s (not ready, stopping, queue full), a body not declared as JSON (415)
    and the body's size (413), all before the body is parsed; then `route` answers from the body read. It
    counts every answer under /v1/ and the latency of each 200. Other methods and paths under /v1/ go on to
    FastAPI (405, 404)."""

    def __init__(
        self,
        app: Asgi,
        *,
        token: str | None,
        max_body_bytes: int,
        metrics: HttpMetrics,
        early_refusal: Callable[[], Response | None],
        route: Callable[[bytes], Awaitable[Response]],
    ) -> None:
        self._app = app
        self._route = route
        self._early_refusal = early_refusal
        self._token = token.encode() if token is not None else None
        self._max_body_bytes = max_body_bytes
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope["path"]).startswith("/v1/"):
            if scope["type"] == "http" and scope["path"] == OPENAPI_PATH and not self._let_in(scope):
                await _unauthorized(scope, receive, send)
                return
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        status: list[int] = []

        async def counted_send(message: AsgiMessage) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        client_gone = False
        try:
            client_gone = await self._guarded(scope, receive, counted_send)
        finally:
            if status:
                code = str(status[0])
            elif client_gone:  # the connection's bound answered it (408), or the client closed it (499)
                code = str(scope.get(REFUSED_STATUS, CLIENT_CLOSED))
            else:
                code = "500"  # an exception before any answer
            self._metrics.requests.labels(code).inc()
            if code == "200":
                self._metrics.request_seconds.observe(time.perf_counter() - started)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answers the request; True when the connection went away before its body was read whole."""
        if not self._let_in(scope):
            await _unauthorized(scope, receive, send)
            return False
        headers = Headers(scope=scope)
        if scope.get("method") != "POST" or scope["path"] != API_PATH:
            await self._app(scope, receive, send)
            return False
        refusal = self._early_refusal()
        if refusal is not None:
            await refusal(scope, receive, send)
            return False
        content_type = headers.get("content-type")
        if not is_json_media_type(content_type):
            sent = f"sent as {content_type}" if content_type else "sent with no Content-Type"
            reason = (
                f"the body was {sent}: send the header `Content-Type: application/json` "
                "(curl: --json '{\"text\": \"...\"}' or -H 'Content-Type: application/json')"
            )
            await error_response(415, "unsupported_media_type", reason)(scope, receive, send)
            return False
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_body_bytes:
            await self._too_large(scope, receive, send)
            return False
        body = bytearray()
        while True:  # read the body here, bounded, so a streamed body cannot pass the limit either
            message = await receive()
            if message["type"] == "http.disconnect":
                return True
            body += message.get("body", b"")
            if len(body) > self._max_body_bytes:
                await self._too_large(scope, receive, send)
                return False
            if not message.get("more_body", False):
                break
        await (await self._route(bytes(body)))(scope, receive, send)
        return False

    def _let_in(self, scope: Scope) -> bool:
        """True without a token, or with the request's `Authorization: Bearer <token>` (compared in constant
        time)."""
        if self._token is None:
            return True
        scheme, _, given = Headers(scope=scope).get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        reason = f"the body is larger than {self._max_body_bytes} bytes (http_max_body_bytes)"
        await error_response(413, "body_too_large", reason)(scope, receive, send)
