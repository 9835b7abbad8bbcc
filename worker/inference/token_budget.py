"""The token budget of inference batches, chosen in one place (`choose_token_budget`) for every entry point
(the Kafka worker, `serve`, `bench`) before the engine starts. A failure is a StartupError saying what to
change (the CLI exits 2 with it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from worker.config import WorkerSettings
from worker.errors import ConfigurationError
from worker.inference.labelling import Classifier
from worker.inference.tuning import TuningError, resolve_token_budget

log = logging.getLogger(__name__)


class StartupError(ConfigurationError):
    """The worker cannot start as configured; the message says what to change."""


@dataclass(frozen=True)
class BudgetChoice:
    """The padded-token budget of inference batches and how it was chosen (for logs and reports)."""

    max_batch_tokens: int
    source: str  # "max_batch_tokens", or "tuned for VRAM" / "tuned for CPU throughput" (+ ", cached")


def choose_token_budget(
    settings: WorkerSettings,
    classifier: Classifier,
    *,
    requested: int | Literal["auto"] | None = None,
    progress: Callable[[str], None] | None = log.info,
) -> BudgetChoice:
    """The one place max_batch_tokens is decided: a number as it is, `auto` calibrated (GPU: to the device
    memory budget; CPU: to throughput), usually from the tuning cache. `requested` None: as the settings say
    (SENTIMENT_MAX_BATCH_TOKENS=auto sets max_batch_tokens_auto). A failed calibration is a StartupError."""
    if requested is None:
        requested = "auto" if settings.max_batch_tokens_auto else settings.max_batch_tokens
    if requested != "auto":
        return BudgetChoice(requested, "max_batch_tokens")
    try:
        result = resolve_token_budget(settings, classifier, progress=progress)
    except TuningError as exc:
        raise StartupError(f"max_batch_tokens=auto: {exc}") from exc
    what = "device memory budget" if result.mode == "gpu-memory" else "CPU throughput (not memory)"
    log.info(
        "token budget %d padded tokens, calibrated for %s%s",
        result.max_batch_tokens,
        what,
        " (cached)" if result.from_cache else "",
    )
    source = f"tuned for {'VRAM' if result.mode == 'gpu-memory' else 'CPU throughput'}"
    return BudgetChoice(result.max_batch_tokens, source + (", cached" if result.from_cache else ""))
