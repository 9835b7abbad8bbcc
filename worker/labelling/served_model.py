"""One model the Labeller serves: its identity, its classifier, and the engine that batches for it. The one
place an `Engine` is built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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
    ) -> Engine:
        """Builds and starts the model's engine (warmed up unless `warm_up` is False)."""
        if self._engine is not None:
            raise RuntimeError(f"the {self.role} model {self.ref.name} is already started")
        engine = Engine(self.classifier, options, on_labelled=on_labelled, name=self.engine_name)
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
