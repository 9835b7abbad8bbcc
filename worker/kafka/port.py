"""The worker's HTTP port: the API with the probes (`http_api`), or the probes and metrics alone."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import Protocol

from prometheus_client import CollectorRegistry

from worker.config import Sections
from worker.health import HealthServer, HealthState
from worker.labelling.labeller import Labeller
from worker.metrics import WorkerMetrics

__all__ = ["PortApi", "open_port"]

log = logging.getLogger(__name__)


class PortApi(Protocol):
    """The HTTP API on the worker's own port (`run` with http_api), answered by the worker's Labeller:
    `worker.http.serving.WorkerApi`, handed in by the caller (the run path never imports http)."""

    def open(
        self, stack: ExitStack, settings: Sections, registry: CollectorRegistry, health: HealthState
    ) -> tuple[str, int]:
        """Listens on `http_host:http_port` (the API says 503 until `attach`); `stack` closes it."""
        ...

    def attach(self, stack: ExitStack, *, labeller: Labeller, metrics: WorkerMetrics) -> None:
        """Starts answering requests through `labeller`."""
        ...


def open_port(
    stack: ExitStack,
    settings: Sections,
    api: PortApi | None,
    registry: CollectorRegistry,
    health: HealthState,
) -> tuple[PortApi | None, tuple[str, int] | None]:
    """The HTTP port: the API with the probes (http_api), or the probes and metrics alone; the API answers
    503 until it is attached to the Labeller. Returns the API to attach, if any, and the address."""
    http = settings.http
    api = api if http.http_port and http.http_api else None
    if api is not None:  # the API on the same port, through this worker's Labeller
        address = api.open(stack, settings, registry, health)
        log.info("HTTP API, metrics and health on http://%s:%d (/v1/sentiment /metrics ...)", *address)
        return api, address
    if http.http_port:
        server = HealthServer(
            http.http_host,
            http.http_port,
            registry,
            health,
            max_header_bytes=http.http_max_header_bytes,
            header_timeout_s=http.http_header_timeout_s,
        )
        stack.callback(server.close)
        log.info("metrics and health on http://%s:%d (/metrics /healthz /readyz)", *server.address)
        return None, server.address
    return None, None
