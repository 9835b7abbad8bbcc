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
from worker.inference.batch_shape import is_set, on_gpu
from worker.inference.labelling import Classifier
from worker.inference.tuning import TuningError, resolve_token_budget
from worker.inference.tuning.probes import MemoryProbe

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
    memory_probe: MemoryProbe | None = None,
) -> BudgetChoice:
    """The one place max_batch_tokens is decided: a number as it is, `auto` calibrated (GPU: to the device
    memory budget; CPU: to throughput), usually from the tuning cache. `requested` None: as the settings say
    (SENTIMENT_MAX_BATCH_TOKENS=auto sets max_batch_tokens_auto); on a GPU `auto` unless either is set,
    since the measured memory budget allows batches far larger (65,536 tokens and more) than the CPU
    default. `memory_probe` replaces the real device-memory probe. A failed calibration is a StartupError."""
    asked = "max_batch_tokens=auto"
    if requested is None:
        gpu_default = on_gpu(classifier) and not (
            is_set(settings, "max_batch_tokens") or is_set(settings, "max_batch_tokens_auto")
        )
        if gpu_default and not settings.max_batch_tokens_auto:
            asked = "on a GPU max_batch_tokens is calibrated unless set"
        requested = "auto" if settings.max_batch_tokens_auto or gpu_default else settings.max_batch_tokens
    if requested != "auto":
        return BudgetChoice(requested, "max_batch_tokens")
    try:
        result = resolve_token_budget(settings, classifier, progress=progress, memory_probe=memory_probe)
    except TuningError as exc:
        raise StartupError(f"{asked}: {exc} (or set SENTIMENT_MAX_BATCH_TOKENS to a number)") from exc
    what = "device memory budget" if result.mode == "gpu-memory" else "CPU throughput (not memory)"
    log.info(
        "token budget %d padded tokens, calibrated for %s%s",
        result.max_batch_tokens,
        what,
        " (cached)" if result.from_cache else "",
    )
    source = f"tuned for {'VRAM' if result.mode == 'gpu-memory' else 'CPU throughput'}"
    return BudgetChoice(result.max_batch_tokens, source + (", cached" if result.from_cache else ""))
