"""The composition root: settings → the Labeller (the models) → the front doors, and the process start-up the
long-running commands share. `run` and `serve` parse their arguments (worker/cli) and call here.

Start-up, in order: the model threads' idle policy (before Paddle loads), thread names, logging, the stop
handlers (a signal during loading stops at once), the models loaded, the loaded heap frozen, the stop handlers
again (loading Paddle replaced them), then the door runs until stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from threading import Event

from worker.config import WorkerSettings
from worker.http.serving import SentimentApi, ServeSummary, WorkerApi
from worker.kafka.app import SentimentWorker
from worker.kafka.run_tracker import RunSummary
from worker.labelling.labeller import Labeller
from worker.runtime.logs import configure_logging
from worker.runtime.process import (
    freeze_loaded_heap,
    install_stop_handlers,
    name_os_threads,
    rest_idle_threads,
)

__all__ = ["run_worker", "serve"]


def _started(settings: WorkerSettings) -> tuple[Event, Labeller]:
    """The shared start-up of `run` and `serve`: process set-up, the Labeller's models loaded, the heap
    frozen. Returns the stop event (set by SIGTERM/SIGINT) and the Labeller, not yet started."""
    s = settings.sections
    rest_idle_threads()  # before Paddle loads
    name_os_threads()  # before the engine and the HTTP server start their threads
    configure_logging(s.observability.log_level)
    stop = Event()
    reinstall = install_stop_handlers(stop.set)  # before the models load: a signal then stops at once
    labeller = Labeller.from_settings(s.model, s.batching, shutdown_timeout_s=s.delivery.shutdown_timeout_s)
    freeze_loaded_heap()
    reinstall()  # loading Paddle replaced them
    return stop, labeller


def run_worker(
    settings: WorkerSettings, *, max_messages: int | None, idle_exit_s: float | None
) -> RunSummary:
    """`run`: the Kafka door (with the HTTP API on its port when `http_api`) until stopped, `max_messages`
    inputs are done, or `idle_exit_s` passes without input."""
    stop, labeller = _started(settings)
    sections = settings.sections
    api = WorkerApi() if sections.http.http_api else None  # the API on the worker's port, when asked for
    worker = SentimentWorker(sections, labeller, stop=stop, api=api)
    return worker.run(max_messages=max_messages, idle_exit_s=idle_exit_s)


def serve(settings: WorkerSettings, *, on_listening: Callable[[tuple[str, int]], None]) -> ServeSummary:
    """`serve`: the HTTP door until stopped; `on_listening(address)` once it listens."""
    stop, labeller = _started(settings)
    return SentimentApi(settings.sections, labeller, stop=stop, on_listening=on_listening).run()
