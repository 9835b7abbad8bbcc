"""The token budget of inference batches, chosen in one place (`choose_token_budget`) for every entry point
(the Kafka worker, `serve`, `bench`) before the engine starts. A failure is a StartupError saying what to
change (the CLI exits 2 with it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from worker.config import BatchingSettings, ModelSettings
from worker.errors import ConfigurationError
from worker.inference.batch_shape import on_gpu
from worker.inference.classifier import Classifier
from worker.inference.tuning import TuningError, resolve_token_budget
from worker.inference.tuning.probes import MemoryProbe, memory_is_measured

log = logging.getLogger(__name__)

GPU_UNMEASURED_TOKENS = 65_536
"""A GPU's token budget when its memory cannot be measured (not a Paddle backend) and none is set: this
model's batches gained the most up to it on an H200 (54,523 reviews/s against 9,657 at 4,096; 0.9 GB in
fp16); an out-of-memory batch lowers it."""


class StartupError(ConfigurationError):
    """The worker cannot start as configured; the message says what to change."""


@dataclass(frozen=True)
class BudgetChoice:
    """The padded-token budget of inference batches and how it was chosen (for logs and reports)."""

    max_batch_tokens: int
    source: str  # "max_batch_tokens", or "tuned for VRAM" / "tuned for CPU throughput" (+ ", cached")


def choose_token_budget(
    batching: BatchingSettings,
    model: ModelSettings,
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
    default (a backend whose memory the probe cannot see gets `GPU_UNMEASURED_TOKENS`). `memory_probe`
    replaces the real device-memory probe. A failed calibration is a StartupError."""
    asked = "max_batch_tokens=auto"
    if requested is None and _gpu_default(batching, classifier):
        if memory_probe is None and not memory_is_measured(classifier):
            return _unmeasured_gpu_budget(classifier)
        requested, asked = "auto", "on a GPU max_batch_tokens is calibrated unless set"
    elif requested is None:
        requested = "auto" if batching.max_batch_tokens_auto else batching.max_batch_tokens
    if requested != "auto":
        return BudgetChoice(requested, "max_batch_tokens")
    try:
        result = resolve_token_budget(
            batching, model, classifier, progress=progress, memory_probe=memory_probe
        )
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


def _gpu_default(batching: BatchingSettings, classifier: Classifier) -> bool:
    """On a GPU with neither max_batch_tokens nor max_batch_tokens_auto set: calibrated, not 4,096."""
    return on_gpu(classifier) and not batching.token_budget_given


def _unmeasured_gpu_budget(classifier: Classifier) -> BudgetChoice:
    backend = getattr(classifier, "backend", "?")
    log.info(
        "token budget %d padded tokens, the GPU default for the %s backend (its device memory is not "
        "measured; an out-of-memory batch lowers it): set SENTIMENT_MAX_BATCH_TOKENS to choose",
        GPU_UNMEASURED_TOKENS,
        backend,
    )
    return BudgetChoice(GPU_UNMEASURED_TOKENS, f"GPU default ({backend} backend)")
