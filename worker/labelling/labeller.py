"""The Labeller: the one door to the models.

Every front door (Kafka, HTTP, files) turns its input into `Review`s and hands them to `label()`; it gets one
prediction per review back, in review order, naming the model that made them. The Labeller owns the models
being served, by role: today exactly one, the primary, with its engine (`worker.inference.Engine`:
token-budget batches on the model's lanes). A shadow, a swap and a route by field belong here.

    door ─ label(reviews) ─► the primary's engine ─► Future[Predictions]: outputs in review order + the model
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType

from schemas.review_input import Review
from schemas.sentiment_result import ModelRef
from worker.config import BatchingSettings, ModelSettings
from worker.inference.batch_shape import on_gpu
from worker.inference.classifier import Classifier, Output
from worker.inference.engine import EngineOptions, Labelled
from worker.inference.model_calls import GroupStats
from worker.inference.tuning.probes import MemoryProbe
from worker.labelling.loading import LoadedModel, device_name, load_model
from worker.labelling.served_model import ServedModel
from worker.metrics import WorkerMetrics

__all__ = ["Labeller", "OptionsFor", "Predictions"]

OptionsFor = Callable[[Classifier], EngineOptions]
"""The engine options of a model, chosen when it starts (the token budget may be calibrated on it)."""


@dataclass(frozen=True)
class Predictions:
    """One `label()` call's answer: one output per review, in review order (a probability row, or the
    failure that replaced it), the model that made them, and where the time went."""

    outputs: list[Output]
    model: ModelRef
    stats: GroupStats
    """Measurements of the work these reviews were labelled in (shared with what was batched with them)."""
    queued_seconds: float
    """From `label()` to the engine taking them."""
    labelling_seconds: float
    """From the engine taking them to their outputs (tokenizing and the model, wall time)."""


class Labeller:
    """Serves `primary` (engine options: `options`, or `options(classifier)` when it starts). Start it (or use
    `with`) before `label()`; `close()` labels what was submitted, then stops."""

    def __init__(
        self, primary: LoadedModel, options: EngineOptions | OptionsFor, *, name: str = "engine"
    ) -> None:
        self._primary = ServedModel("primary", primary.ref, primary.classifier, engine_name=name)
        self._options = options
        self._metrics: WorkerMetrics | None = None

    @classmethod
    def from_settings(
        cls,
        model: ModelSettings,
        batching: BatchingSettings,
        *,
        shutdown_timeout_s: float,
        memory_probe: MemoryProbe | None = None,
    ) -> Labeller:
        """The model the model section names, loaded now; its engine options (the token budget, calibrated
        when asked for; `close()` waiting at most `shutdown_timeout_s`) chosen when it starts. `memory_probe`
        replaces the device-memory probe (tests)."""
        loaded = load_model(model, batching)

        def options(classifier: Classifier) -> EngineOptions:
            return EngineOptions.from_settings(
                batching, model, classifier, shutdown_timeout_s=shutdown_timeout_s, memory_probe=memory_probe
            )

        return cls(loaded, options)

    @classmethod
    def of(
        cls, classifier: Classifier, options: EngineOptions | None = None, *, name: str = "engine"
    ) -> Labeller:
        """A Labeller serving `classifier` as it is (a model already loaded, or a test's), with `options`
        (default: the CPU's 32 texts and 4,096 padded tokens per model call)."""
        ref = ModelRef(
            name=str(getattr(classifier, "name", "model")),
            version=str(getattr(classifier, "version", "unknown")),
        )
        return cls(LoadedModel(classifier, ref), options or EngineOptions(32, 4096), name=name)

    # ----- what the doors read -----
    @property
    def labels(self) -> list[str]:
        """The label names, in the order of every output's probabilities."""
        return list(self._primary.classifier.labels)

    @property
    def primary(self) -> ModelRef:
        """The primary model's identity."""
        return self._primary.ref

    @property
    def on_gpu(self) -> bool:
        """True when the primary runs on a GPU (batches and Kafka windows take the device's shape)."""
        return on_gpu(self._primary.classifier)

    @property
    def device(self) -> str:
        """The primary's device as Paddle names it (`cpu`, `gpu:0`)."""
        return device_name(self._primary.classifier)

    @property
    def token_budget(self) -> int:
        """The primary's padded-token budget per batch now (lowered by out-of-memory events)."""
        return self._primary.engine.token_budget

    @property
    def tokens_per_text(self) -> float | None:
        """The mean tokens per review the primary labelled lately (None before the first)."""
        return self._primary.engine.tokens_per_text

    def stalled_s(self) -> float:
        """Seconds the primary's lanes have worked without finishing a batch (0 when idle): liveness."""
        return self._primary.engine.stalled_s()

    # ----- lifecycle -----
    def observe(self, metrics: WorkerMetrics) -> None:
        """Reports to `metrics` from now on: the model's info, its predictions' series at 0, and every group
        labelled (batches, tokens, padding, out of memory). Call before `start` to count from the first."""
        self._metrics = metrics
        ref = self._primary.ref
        metrics.model.info({"name": ref.name, "version": ref.version, "device": self.device})
        metrics.start_predictions(self.labels, ref.version)

    def start(self, *, warm_up: bool = True) -> Labeller:
        """Starts the primary's engine (its options chosen now), warmed up unless `warm_up` is False."""
        served = self._primary
        options = (
            self._options if isinstance(self._options, EngineOptions) else self._options(served.classifier)
        )
        on_labelled = self._metrics.observe_group if self._metrics is not None else None
        served.start(options, on_labelled=on_labelled, warm_up=warm_up)
        return self

    def close(self, timeout_s: float | None = None) -> None:
        """Labels everything submitted (within `timeout_s`, by default the engine's shutdown timeout), then
        stops; what is still unlabelled then fails with EngineClosed."""
        self._primary.close(timeout_s)

    @contextmanager
    def session(self, *, warm_up: bool = True) -> Iterator[Labeller]:
        """Started for the block (unless it already was: then the block leaves it running); closed after it
        only if the block started it."""
        if self._primary.started:
            yield self
            return
        self.start(warm_up=warm_up)
        try:
            yield self
        finally:
            self.close()

    def __enter__(self) -> Labeller:
        return self if self._primary.started else self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # ----- the door -----
    def label(self, reviews: Sequence[Review], *, gather_ms: float | None = None) -> Future[Predictions]:
        """Queues `reviews` for the primary; the future gets one output per review, in order.

        `gather_ms` None: labelled at once, as a group of their own (the caller gathered them: a Kafka
        window, a file chunk). A number: they wait for a free lane and, while the model is idle, up to
        `gather_ms` for other submissions to share their batches (HTTP requests). Thread-safe, never blocks.
        Cancelling the future before the engine takes the reviews drops them. Raises EngineClosed once
        `close()` began."""
        served = self._primary
        labelling = served.engine.submit([review.text for review in reviews], gather_ms=gather_ms)
        answer: Future[Predictions] = Future()
        answer.add_done_callback(lambda done: labelling.cancel() if done.cancelled() else None)
        labelling.add_done_callback(lambda done: _answer(done, answer, served.ref))
        return answer


def _answer(labelling: Future[Labelled], answer: Future[Predictions], model: ModelRef) -> None:
    """On the engine's thread (or the canceller's): `answer` from the engine's `labelling`."""
    if labelling.cancelled():
        answer.cancel()
        return
    if not answer.set_running_or_notify_cancel():
        return
    error = labelling.exception()
    if error is not None:
        answer.set_exception(error)
        return
    labelled = labelling.result()
    answer.set_result(
        Predictions(
            labelled.outputs, model, labelled.stats, labelled.queued_seconds, labelled.labelling_seconds
        )
    )
