"""One model the Labeller serves: its identity, its classifier, and the engine that batches for it. The one
place an `Engine` is built."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from schemas.sentiment_result import ModelRef
from worker.inference.classifier import Classifier
from worker.inference.engine import Engine, EngineOptions
from worker.inference.model_calls import GroupStats

__all__ = ["ServedModel"]


@dataclass
class ServedModel:
    """`role` (primary today) names what the model does in the Labeller; `engine` exists between `start`
    and `close`."""

    role: str
    ref: ModelRef
    classifier: Classifier
    engine_name: str = "engine"
    _engine: Engine | None = field(default=None, repr=False)

    def start(
        self,
        options: EngineOptions,
        *,
        on_labelled: Callable[[GroupStats, int], None] | None = None,
        warm_up: bool = True,
        niceness: int = 0,
    ) -> Engine:
        """Builds and starts the model's engine (warmed up unless `warm_up` is False; its threads `niceness`
        lower in priority)."""
        if self._engine is not None:
            raise RuntimeError(f"the {self.role} model {self.ref.name} is already started")
        engine = Engine(
            self.classifier, options, on_labelled=on_labelled, name=self.engine_name, niceness=niceness
        )
        self._engine = engine.start(warm_up=warm_up)
        return self._engine

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError(f"the {self.role} model {self.ref.name} is not started")
        return self._engine

    @property
    def started(self) -> bool:
        return self._engine is not None

    def close(self, timeout_s: float | None = None) -> None:
        """Labels what was submitted (within `timeout_s`), then stops the engine's threads."""
        if self._engine is not None:
            self._engine.close(timeout_s)

    def forget(self) -> None:
        """After `close`: drops the engine and the classifier, so a replaced model's memory can be freed."""
        self._engine = None
        self.classifier = _Released()


class _Released:
    """Stands in for the classifier of a model that was replaced and closed: nothing may label with it."""

    labels: list[str] = []
    call_overhead_tokens: int | None = None
    parallel_calls = 1

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        raise RuntimeError("this model was replaced and released")

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        raise RuntimeError("this model was replaced and released")
