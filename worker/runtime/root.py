"""The composition root: settings → the Labeller (the models) → the front doors, and the process start-up the
long-running commands share. `run` and `serve` parse their arguments (worker/cli) and call here.

Start-up, in order: the model threads' idle policy (before Paddle loads), thread names, logging, the stop
handlers (a signal during loading stops at once), the control topic read (a replica serves what it says),
the models loaded, the loaded heap frozen (released again after a replaced model is closed), the stop handlers
again (loading Paddle replaced them), then the door runs until stopped while the control thread follows
the control topic (or `serve`'s admin route takes the changes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from threading import Event

from schemas.control import DesiredState
from worker.config import Sections, WorkerSettings
from worker.http.serving import SentimentApi, ServeSummary, WorkerApi
from worker.kafka.app import SentimentWorker
from worker.kafka.run_tracker import RunSummary
from worker.labelling.control import ControlReader, ModelControl, load_choice, model_control_mode
from worker.labelling.labeller import Labeller, ModelChangeRefused
from worker.labelling.loading import LoadedModel, load_model
from worker.runtime.logs import configure_logging
from worker.runtime.process import (
    freeze_loaded_heap,
    install_stop_handlers,
    name_os_threads,
    release_heap,
    rest_idle_threads,
)

__all__ = ["models_for", "run_worker", "serve"]

log = logging.getLogger(__name__)

_READ_CONTROL_S = 10.0


def _started(settings: WorkerSettings, command: str) -> tuple[Event, Labeller, ModelControl | None]:
    """The shared start-up of `run` and `serve`: process set-up, the models (`models_for`), the heap frozen.
    Returns the stop event (set by SIGTERM/SIGINT), the Labeller (not started) and the model control (None:
    off)."""
    s = settings.sections
    rest_idle_threads()  # before Paddle loads
    name_os_threads()  # before the engine and the HTTP server start their threads
    configure_logging(s.observability.log_level)
    stop = Event()
    # Before the models load: a signal then stops at once; a stop overdue by the shutdown timeout exits 1.
    reinstall = install_stop_handlers(stop.set, stop_timeout_s=s.delivery.shutdown_timeout_s)
    labeller, control = models_for(s, command)
    freeze_loaded_heap()
    reinstall()  # loading Paddle replaced them
    return stop, labeller, control


def models_for(sections: Sections, command: str) -> tuple[Labeller, ModelControl | None]:
    """The Labeller of a replica of `command` (run | serve): the primary the control topic names when it
    follows it (else the settings' model), and the model control that keeps it current (None: off)."""
    mode = model_control_mode(sections, command)
    reader = ControlReader(sections) if mode == "topic" else None
    desired = reader.read(timeout_s=_READ_CONTROL_S) if reader is not None else None
    loaded, problem = _first_primary(sections, desired)
    labeller = Labeller.from_settings(
        sections.model,
        sections.batching,
        shutdown_timeout_s=sections.delivery.shutdown_timeout_s,
        loaded=loaded,
        on_released=release_heap,
        shadow_max_groups=sections.live.shadow_max_groups,
    )
    if mode == "off":
        return labeller, None
    control = ModelControl(sections, labeller, reader=reader, problem=problem)
    control.apply(desired)  # the shadow too, before the door consumes anything
    return labeller, control


def _first_primary(sections: Sections, desired: DesiredState | None) -> tuple[LoadedModel, str | None]:
    """The primary a starting replica serves: the control topic's, when it names one that loads; else the
    settings' model (and why the topic's was not served)."""
    configured = sections.model, sections.batching
    if desired is not None and desired.primary is not None:
        try:
            loaded = load_choice(sections, desired.primary, "primary")
            log.info("serving %s as the control topic says", desired.primary.path)
            return loaded, None
        except ModelChangeRefused as exc:
            log.error("%s; serving the configured model %s instead", exc, sections.model.model)
            return load_model(*configured), str(exc)
    return load_model(*configured), None


def run_worker(
    settings: WorkerSettings, *, max_messages: int | None, idle_exit_s: float | None
) -> RunSummary:
    """`run`: the Kafka door (with the HTTP API on its port when `http_api`) until stopped, `max_messages`
    inputs are done, or `idle_exit_s` passes without input; the control topic followed meanwhile."""
    stop, labeller, control = _started(settings, "run")
    sections = settings.sections
    api = WorkerApi() if sections.http.http_api else None  # the API on the worker's port, when asked for
    worker = SentimentWorker(sections, labeller, stop=stop, api=api)
    if control is not None:
        control.start()
    try:
        return worker.run(max_messages=max_messages, idle_exit_s=idle_exit_s)
    finally:
        if control is not None:
            control.stop()


def serve(settings: WorkerSettings, *, on_listening: Callable[[tuple[str, int]], None]) -> ServeSummary:
    """`serve`: the HTTP door until stopped; `on_listening(address)` once it listens. Model changes come by
    the admin route (or the control topic, with model_control=topic)."""
    stop, labeller, control = _started(settings, "serve")
    if control is not None:
        control.start()
    # The admin route takes the changes when no control topic does (model_control=api).
    admin = control if model_control_mode(settings.sections, "serve") == "api" else None
    try:
        return SentimentApi(
            settings.sections, labeller, stop=stop, on_listening=on_listening, control=admin
        ).run()
    finally:
        if control is not None:
            control.stop()
