"""The Labeller the worker's composition root builds, around a test's own classifier: what the doors take in
the tests that hand them a tiny, slowed or fake model instead of loading one from settings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schemas.review_input import Review
from schemas.sentiment_result import ModelRef
from worker.config import Sections, WorkerSettings
from worker.inference.classifier import Classifier
from worker.inference.engine import EngineOptions
from worker.inference.tuning.probes import MemoryProbe
from worker.labelling.labeller import Labeller
from worker.labelling.loading import LoadedModel


def labeller_for(
    classifier: Classifier | Any,
    settings: WorkerSettings | None = None,
    ref: ModelRef | None = None,
    *,
    memory_probe: MemoryProbe | None = None,
) -> Labeller:
    """A Labeller serving `classifier` as `ref` (default: the classifier's own name and version), its engine
    options chosen from `settings` when it starts, as `Labeller.from_settings` chooses them."""
    s = (settings if settings is not None else WorkerSettings()).sections
    if ref is None:
        ref = ModelRef(
            name=str(getattr(classifier, "name", "model")), version=str(getattr(classifier, "version", "1"))
        )

    def options(model: Classifier) -> EngineOptions:
        return engine_options(s, model, memory_probe=memory_probe)

    return Labeller(LoadedModel(classifier, ref), options)


def engine_options(
    settings: WorkerSettings | Sections,
    classifier: Classifier | Any,
    *,
    memory_probe: MemoryProbe | None = None,
) -> EngineOptions:
    """`EngineOptions.from_settings` of the sections the composition root passes it (batching, model, and the
    delivery section's shutdown timeout)."""
    s = settings.sections if isinstance(settings, WorkerSettings) else settings
    return EngineOptions.from_settings(
        s.batching,
        s.model,
        classifier,
        shutdown_timeout_s=s.delivery.shutdown_timeout_s,
        memory_probe=memory_probe,
    )


def reviews(texts: Sequence[str]) -> list[Review]:
    """Texts as the Labeller takes them: each a review with its position as id and no metadata."""
    return [Review(str(i), text, {}) for i, text in enumerate(texts)]
