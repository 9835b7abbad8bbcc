"""The Labeller: the one door to the models.

Every front door (Kafka, HTTP, files) turns its input into `Review`s and hands them to `label()`; it gets one
prediction per review back, in review order, naming the model that made them. The Labeller owns the models
being served, by role: the primary, and a shadow beside it when one is set, each with its engine
(`worker.inference.Engine`: token-budget batches on the model's lanes). It swaps a model without a restart
(`replace_primary`, `set_shadow`: the control topic's changes, `worker.labelling.control`); a route by field
belongs here too.

    door ─ label(reviews) ─┬► the primary's engine ─► Future[Predictions]: outputs in review order + the model
                           └► the shadow's engine (niced, bounded; skipped when behind) ─► agreement counted
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import TracebackType

import numpy as np

from schemas.control import Agreement
from schemas.review_input import Review
from schemas.sentiment_result import ModelRef
from worker.config import BatchingSettings, ModelSettings
from worker.errors import OperationError
from worker.inference.batch_shape import on_gpu
from worker.inference.classifier import Classifier, Output
from worker.inference.engine import EngineOptions, Labelled
from worker.inference.model_calls import GroupStats
from worker.inference.tuning.probes import MemoryProbe
from worker.labelling.loading import LoadedModel, device_name, load_model
from worker.labelling.served_model import ServedModel
from worker.labelling.shadow import ShadowAgreement
from worker.metrics import WorkerMetrics

__all__ = ["Labeller", "ModelChangeRefused", "OptionsFor", "Predictions"]

log = logging.getLogger(__name__)

PROBE_REVIEWS = ["外卖送得很快，饭菜还是热的", "等了两个小时，菜都凉了", "一般般"]
"""What a model about to serve must label (each with its probabilities) before it takes over."""
PROBE_TIMEOUT_S = 120.0

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
    shadow: Future[Predictions] | None = None
    """The shadow's predictions of the same reviews, when a shadow labelled them (never waited for by the
    Labeller: a door that publishes them collects them when they are done)."""


class ModelChangeRefused(OperationError):
    """A model change the Labeller will not make (it keeps serving what it served); the message says why."""


class Labeller:
    """Serves `primary` (engine options: `options`, or `options(classifier)` when a model starts), and a
    shadow beside it when one is set. Start it (or use `with`) before `label()`; `close()` labels what was
    submitted, then stops.

    A change (`replace_primary`, `set_shadow`) starts the new model's engine beside the running ones and warms
    it up, then takes over for every later `label()`: what was submitted before finishes on the model it was
    submitted to. A Kafka window is one submission, so it is labelled by one model, and the windows of a
    partition (submitted in offset order) change model once. A replaced model's engine closes once its work is
    done, and `on_released()` (the composition root's heap policy) runs after it, so its memory is returned.
    The shadow's engine runs its threads at a lower priority (`shadow_niceness`) and takes at most
    `shadow_in_flight` submissions at a time: a group arriving while it is behind is not shadowed (it is
    counted)."""

    def __init__(
        self,
        primary: LoadedModel,
        options: EngineOptions | OptionsFor,
        *,
        name: str = "engine",
        shadow_niceness: int = 10,
        shadow_in_flight: int = 2,
        on_released: Callable[[], None] | None = None,
    ) -> None:
        self._name = name
        self._primary = ServedModel("primary", primary.ref, primary.classifier, engine_name=name)
        self._primary_source = primary
        self._shadow: ServedModel | None = None
        self._shadow_source: LoadedModel | None = None
        self._agreement: ShadowAgreement | None = None
        self._options = options
        self._metrics: WorkerMetrics | None = None
        self._shadow_niceness = shadow_niceness
        self._shadow_in_flight_max = shadow_in_flight
        self._shadow_in_flight = 0
        self._on_released = on_released
        self._lock = threading.Lock()  # the served models, and what label() submits to
        self._changing = threading.Lock()  # one change at a time
        self._retiring: list[threading.Thread] = []
        self._started = False

    @classmethod
    def from_settings(
        cls,
        model: ModelSettings,
        batching: BatchingSettings,
        *,
        shutdown_timeout_s: float,
        loaded: LoadedModel | None = None,
        memory_probe: MemoryProbe | None = None,
        on_released: Callable[[], None] | None = None,
        shadow_max_groups: int = 2,
    ) -> Labeller:
        """Serves `loaded`, else the model the model section names, loaded now; engine options (the token
        budget, calibrated when asked for; `close()` waiting at most `shutdown_timeout_s`) chosen as each
        model starts. `memory_probe` replaces the device-memory probe (tests); `on_released` runs after a
        replaced model is closed (the heap policy); the shadow takes at most `shadow_max_groups` groups at
        once."""
        loaded = loaded if loaded is not None else load_model(model, batching)

        def options(classifier: Classifier) -> EngineOptions:
            return EngineOptions.from_settings(
                batching, model, classifier, shutdown_timeout_s=shutdown_timeout_s, memory_probe=memory_probe
            )

        return cls(loaded, options, on_released=on_released, shadow_in_flight=shadow_max_groups)

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
    def serving(self) -> tuple[LoadedModel, LoadedModel | None]:
        """The primary and the shadow (None: none) as loaded: identity, classifier, directory and hash."""
        with self._lock:
            return self._primary_source, self._shadow_source

    @property
    def started(self) -> bool:
        """True once `start()` ran (the primary's engine labels)."""
        return self._started

    @property
    def agreement(self) -> Agreement | None:
        """The shadow's agreement figures on the traffic so far (None without a shadow)."""
        agreement = self._agreement
        return agreement.snapshot() if agreement is not None else None

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
        self._describe_primary()
        shadow = self._shadow_source
        if shadow is not None:
            metrics.live.shadow_model.labels(shadow.ref.name, shadow.ref.version).set(1)
            for outcome in ("shadowed", "skipped"):
                metrics.live.shadow_groups.labels(outcome)

    def start(self, *, warm_up: bool = True) -> Labeller:
        """Starts the primary's engine (its options chosen now), warmed up unless `warm_up` is False."""
        self._start(self._primary, warm_up=warm_up)
        self._started = True
        return self

    def close(self, timeout_s: float | None = None) -> None:
        """Labels everything submitted (within `timeout_s`, by default the engine's shutdown timeout), then
        stops; what is still unlabelled then fails with EngineClosed."""
        with self._lock:
            served = [self._primary] + ([self._shadow] if self._shadow is not None else [])
        for model in served:
            model.close(timeout_s)
        for thread in list(self._retiring):
            thread.join(timeout_s)

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

    # ----- changes -----
    def replace_primary(self, loaded: LoadedModel) -> None:
        """`loaded` becomes the primary for every later `label()` (see the class docstring). Raises
        ModelChangeRefused (the Labeller keeps serving what it served) when its labels differ or its engine
        cannot start and label the warm-up reviews."""
        with self._changing:
            self._check_labels(loaded, "primary")
            new = ServedModel("primary", loaded.ref, loaded.classifier, engine_name=self._name)
            if self._started:
                self._start_or_refuse(new, "primary")
            with self._lock:
                old, self._primary, self._primary_source = self._primary, new, loaded
            self._describe_primary()
            self._retire(old)

    def set_shadow(self, loaded: LoadedModel | None) -> None:
        """`loaded` labels every later group beside the primary (None: no shadow); the one it replaces is
        retired. Raises ModelChangeRefused like `replace_primary`."""
        with self._changing:
            new: ServedModel | None = None
            if loaded is not None:
                self._check_labels(loaded, "shadow")
                new = ServedModel("shadow", loaded.ref, loaded.classifier, engine_name="shadow")
                self._start_or_refuse(new, "shadow", niceness=self._shadow_niceness)
            agreement = (
                ShadowAgreement(self.labels, loaded.content_hash, loaded.ref.version)
                if loaded is not None
                else None
            )
            with self._lock:
                old, self._shadow, self._shadow_source = self._shadow, new, loaded
                self._agreement = agreement
            self._describe_shadow(old, loaded)
            if old is not None:
                self._retire(old)

    # ----- the door -----
    def label(self, reviews: Sequence[Review], *, gather_ms: float | None = None) -> Future[Predictions]:
        """Queues `reviews` for the primary (and the shadow, when it has room); the future gets one output
        per review, in order, naming the primary that made them.

        `gather_ms` None: labelled at once, as a group of their own (the caller gathered them: a Kafka
        window, a file chunk). A number: they wait for a free lane and, while the model is idle, up to
        `gather_ms` for other submissions to share their batches (HTTP requests). Thread-safe, never blocks.
        Cancelling the future before the engine takes the reviews drops them. Raises EngineClosed once
        `close()` began."""
        texts = [review.text for review in reviews]
        with self._lock:
            served = self._primary
            labelling = served.engine.submit(texts, gather_ms=gather_ms)
            shadowing = (
                self._shadow_submit(texts, labelling, served.ref) if self._shadow is not None else None
            )
        answer: Future[Predictions] = Future()
        answer.add_done_callback(lambda done: labelling.cancel() if done.cancelled() else None)
        labelling.add_done_callback(lambda done: _answer(done, answer, served.ref, shadowing))
        return answer

    # ----- helpers -----
    def _shadow_submit(
        self, texts: list[str], primary: Future[Labelled], primary_ref: ModelRef
    ) -> Future[Predictions] | None:
        """Under the lock: `texts` to the shadow too, unless it is behind (then counted as skipped)."""
        shadow, agreement = self._shadow, self._agreement
        assert shadow is not None and agreement is not None
        metrics = self._metrics.live if self._metrics is not None else None
        if self._shadow_in_flight >= self._shadow_in_flight_max:
            agreement.skipped(metrics)
            return None
        self._shadow_in_flight += 1
        labelling = shadow.engine.submit(texts)
        answer: Future[Predictions] = Future()
        join = _Both(lambda: agreement.compare(
            primary.result().outputs, labelling.result().outputs, primary_ref.version, metrics
        ))  # fmt: skip
        primary.add_done_callback(lambda _done: join.arrived(primary))
        labelling.add_done_callback(lambda done: self._shadow_done(done, answer, shadow.ref, join))
        return answer

    def _shadow_done(
        self, labelling: Future[Labelled], answer: Future[Predictions], ref: ModelRef, join: _Both
    ) -> None:
        with self._lock:
            self._shadow_in_flight -= 1
        _answer(labelling, answer, ref, None)
        join.arrived(labelling)

    def _start(self, served: ServedModel, *, warm_up: bool = True, niceness: int = 0) -> None:
        options = (
            self._options if isinstance(self._options, EngineOptions) else self._options(served.classifier)
        )
        on_labelled = (
            self._metrics.observe_group if self._metrics is not None and served.role == "primary" else None
        )
        served.start(options, on_labelled=on_labelled, warm_up=warm_up, niceness=niceness)

    def _start_or_refuse(self, served: ServedModel, role: str, *, niceness: int = 0) -> None:
        """Starts `served` and labels the probe reviews with it: every one must get its probabilities. Else
        its engine is closed and the change refused."""
        try:
            self._start(served, niceness=niceness)
            probe = served.engine.submit(PROBE_REVIEWS).result(PROBE_TIMEOUT_S)
            failed = [output for output in probe.outputs if not isinstance(output, np.ndarray)]
            if failed:
                raise RuntimeError(f"{len(failed)} of {len(PROBE_REVIEWS)} probe reviews failed: {failed[0]}")
        except Exception as exc:  # noqa: BLE001 - any failure to start refuses the change, loses nothing
            served.close(0.0)
            self.count_change(role, "refused")
            raise ModelChangeRefused(
                f"the {role} model {served.ref.name} {served.ref.version} could not label the warm-up "
                f"reviews: {type(exc).__name__}: {exc}"
            ) from exc

    def _check_labels(self, loaded: LoadedModel, role: str) -> None:
        theirs = list(loaded.classifier.labels)
        if theirs != self.labels:
            self.count_change(role, "refused")
            raise ModelChangeRefused(
                f"the {role} model {loaded.ref.name} labels {theirs}, the served one {self.labels}: a model "
                "that "
                "replaces or shadows it must have the same labels in the same order"
            )

    def _retire(self, old: ServedModel) -> None:
        """Closes `old` once its submissions are labelled (on a thread of its own), then releases it."""

        def retire() -> None:
            old.close()
            old.forget()
            if self._on_released is not None:
                self._on_released()

        thread = threading.Thread(target=retire, name=f"retire-{old.role}", daemon=True)
        self._retiring = [t for t in self._retiring if t.is_alive()] + [thread]
        thread.start()

    def _describe_primary(self) -> None:
        metrics = self._metrics
        if metrics is None:
            return
        ref = self._primary.ref
        metrics.model.info({"name": ref.name, "version": ref.version, "device": self.device})
        metrics.start_predictions(self.labels, ref.version)
        if self._started:
            self.count_change("primary", "applied")

    def _describe_shadow(self, old: ServedModel | None, loaded: LoadedModel | None) -> None:
        self.count_change("shadow", "applied")
        metrics = self._metrics
        if metrics is None:
            return
        if old is not None:
            with suppress(KeyError):
                metrics.live.shadow_model.remove(old.ref.name, old.ref.version)
        if loaded is not None:
            metrics.live.shadow_model.labels(loaded.ref.name, loaded.ref.version).set(1)
            for outcome in ("shadowed", "skipped"):  # exported at 0 from the start, for rate()
                metrics.live.shadow_groups.labels(outcome)
            for primary_label in self.labels:
                for shadow_label in self.labels:
                    metrics.live.shadow_predictions.labels(primary_label, shadow_label, loaded.ref.version)

    def count_change(self, role: str, outcome: str) -> None:
        """Counts a model change of `role` (primary, shadow) with its outcome (applied, refused)."""
        if self._metrics is not None:
            self._metrics.live.model_changes.labels(role, outcome).inc()


class _Both:
    """Calls `then()` once both of two futures arrived, both with a result (a failure on either side:
    never)."""

    def __init__(self, then: Callable[[], None]) -> None:
        self._then = then
        self._lock = threading.Lock()
        self._arrived = 0
        self._failed = False

    def arrived(self, future: Future[Labelled]) -> None:
        with self._lock:
            self._arrived += 1
            self._failed = self._failed or future.cancelled() or future.exception() is not None
            ready = self._arrived == 2 and not self._failed
        if ready:
            try:
                self._then()
            except Exception:  # noqa: BLE001 - a comparison must never lose a label
                log.warning("comparing the shadow with the primary failed", exc_info=True)


def _answer(
    labelling: Future[Labelled],
    answer: Future[Predictions],
    model: ModelRef,
    shadow: Future[Predictions] | None,
) -> None:
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
            labelled.outputs,
            model,
            labelled.stats,
            labelled.queued_seconds,
            labelled.labelling_seconds,
            shadow,
        )
    )
