"""`sentiment-worker serve`: the model over HTTP only (no Kafka), and the one way both `serve` and the Kafka
worker (`http_api`) put the API on their HTTP port in front of their Labeller.

Start: HTTP up (probes answer, the API says 503 not_ready), the Labeller started (token budget, warm model),
request admission, ready. Stop (in this order): stop accepting connections and let the requests in progress
finish, answer every accepted request, stop the Labeller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from threading import Event

from prometheus_client import CollectorRegistry

from worker.config import Sections
from worker.health import HealthState
from worker.http.admin import ModelsAdmin
from worker.http.admission import RequestAdmission
from worker.http.api import ApiState, build_app
from worker.http.connections import ConnectionLimits
from worker.http.server import HttpServer
from worker.labelling.control import ModelControl
from worker.labelling.labeller import Labeller
from worker.metrics import WorkerMetrics, create_http_metrics, create_metrics

log = logging.getLogger(__name__)


def open_api_server(
    stack: ExitStack,
    settings: Sections,
    registry: CollectorRegistry,
    health: HealthState,
    *,
    control: ModelControl | None = None,
) -> tuple[ApiState, HttpServer]:
    """The API app served on `http_host:http_port` (the http section, the input limits; requests in progress
    finish within shutdown_timeout_s on close), closed by `stack`; 503 until `attach_admission`. With
    `control`, the admin route /v1/admin/models changes the models it serves."""
    http = settings.http
    admin = ModelsAdmin(control, token_set=http.api_token is not None) if control is not None else None
    api = ApiState(http, settings.limits, registry, health, create_http_metrics(registry), admin)
    server = HttpServer(
        build_app(api),
        http.http_host,
        http.http_port,
        graceful_timeout_s=settings.delivery.shutdown_timeout_s,
        limits=ConnectionLimits.from_settings(http),
        on_refusal=lambda error: api.http_metrics.connections_refused.labels(error).inc(),
    )
    stack.callback(server.close)
    return api, server


def attach_admission(
    stack: ExitStack,
    api: ApiState,
    server: HttpServer,
    *,
    labeller: Labeller,
    metrics: WorkerMetrics,
    shutdown_timeout_s: float,
) -> RequestAdmission:
    """Starts admitting requests to `labeller` and hands the admission to the API. On exit `stack` first
    closes the server (in-progress requests finish), then the admission (every accepted request is
    answered, within `shutdown_timeout_s`)."""
    http = api.http
    admission = RequestAdmission(
        labeller,
        max_wait_ms=http.http_max_wait_ms,
        max_queued_texts=http.http_max_queued_texts,
        http_metrics=api.http_metrics,
    )
    stack.callback(admission.close, shutdown_timeout_s)
    stack.callback(
        server.close
    )  # runs before admission.close (LIFO); the earlier registration is then a no-op
    api.attach(admission, labeller.labels, metrics)
    return admission


class WorkerApi:
    """The API on the Kafka worker's port, in front of the worker's Labeller (`run` with http_api):
    what `SentimentWorker` takes as `api`, so that the run path does not import the HTTP serving."""

    def __init__(self) -> None:
        self._opened: tuple[ApiState, HttpServer] | None = None
        self._shutdown_timeout_s = 0.0

    def open(
        self, stack: ExitStack, settings: Sections, registry: CollectorRegistry, health: HealthState
    ) -> tuple[str, int]:
        """`open_api_server`; returns the address it listens on."""
        self._opened = open_api_server(stack, settings, registry, health)
        self._shutdown_timeout_s = settings.delivery.shutdown_timeout_s
        return self._opened[1].address

    def attach(self, stack: ExitStack, *, labeller: Labeller, metrics: WorkerMetrics) -> None:
        """`attach_admission` on the server `open` started."""
        if self._opened is None:
            raise RuntimeError("WorkerApi.attach() before open()")
        attach_admission(
            stack,
            *self._opened,
            labeller=labeller,
            metrics=metrics,
            shutdown_timeout_s=self._shutdown_timeout_s,
        )


@dataclass
class ServeSummary:
    """What one `serve` run did."""

    seconds: float = 0.0
    address: tuple[str, int] | None = None


class SentimentApi:
    """The HTTP front door (`serve`): the model behind `POST /v1/sentiment` until stopped; `address` is set
    once it listens. (The Kafka front door is `worker.kafka.SentimentWorker`; `WorkerApi` puts this API on
    the worker's own port.)"""

    def __init__(
        self,
        settings: Sections,
        labeller: Labeller,
        *,
        registry: CollectorRegistry | None = None,
        stop: Event | None = None,
        on_listening: Callable[[tuple[str, int]], None] | None = None,
        control: ModelControl | None = None,
    ) -> None:
        self._settings = settings
        self._labeller = labeller
        self._control = control  # the admin route's (model_control=api)
        self._registry = registry if registry is not None else CollectorRegistry()
        self._metrics = create_metrics(self._registry, low_confidence=settings.observability.low_confidence)
        self._health = HealthState(settings.observability.liveness_timeout_s, kafka=False)
        self._stop = stop if stop is not None else Event()
        self._on_listening = on_listening
        self.address: tuple[str, int] | None = None

    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    def request_stop(self) -> None:
        """Safe from a signal handler (it only sets an event)."""
        self._stop.set()

    def run(self) -> ServeSummary:
        """Serves until `request_stop()`; returns after the accepted requests are answered."""
        s = self._settings
        started = time.monotonic()
        labeller = self._labeller
        labeller.observe(self._metrics)
        with ExitStack() as stack:
            api, server = open_api_server(stack, s, self._registry, self._health, control=self._control)
            self.address = server.address
            docs = "/openapi.json with the token" if s.http.api_token is not None else "/docs"
            log.info(
                "serving on http://%s:%d (/ /v1/sentiment %s /metrics /healthz /readyz)", *self.address, docs
            )
            if self._on_listening is not None:
                self._on_listening(self.address)
            stack.enter_context(labeller)  # started and warm; closed on the way out
            attach_admission(
                stack,
                api,
                server,
                labeller=labeller,
                metrics=self._metrics,
                shutdown_timeout_s=s.delivery.shutdown_timeout_s,
            )
            self._health.model_warm = True
            self._metrics.ready.set(1)
            while not self._stop.wait(0.5):
                # Alive while the model makes progress (a lane stuck in one call for longer is not).
                if labeller.stalled_s() <= s.observability.liveness_timeout_s:
                    self._health.loop_turned()
            self._health.stopping = True
            self._metrics.ready.set(0)
            log.info("stopping: answering the accepted requests")
        return ServeSummary(seconds=time.monotonic() - started, address=self.address)
