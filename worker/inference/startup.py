"""What must hold before a model labels anything, for every entry point (the Kafka worker and `serve`): a
token budget and a warm model. Each failure is a StartupError saying what to change (the CLI exits 2 with
it)."""

from __future__ import annotations

import logging
import time

from worker.config import WorkerSettings
from worker.inference.labelling import Classifier, TokenBudget, label_texts
from worker.inference.tuning import TuningError, resolve_token_budget

log = logging.getLogger(__name__)


class StartupError(RuntimeError):
    """The worker cannot start as configured; the message says what to change."""


def calibrated_token_budget(settings: WorkerSettings, classifier: Classifier) -> TokenBudget:
    """max_batch_tokens=auto: a measured budget (GPU: memory; CPU: throughput), usually from the cache."""
    try:
        result = resolve_token_budget(settings, classifier, progress=log.info)
    except TuningError as exc:
        raise StartupError(f"max_batch_tokens=auto: {exc}") from exc
    what = "device memory budget" if result.mode == "gpu-memory" else "CPU throughput (not memory)"
    log.info(
        "token budget %d padded tokens, calibrated for %s%s",
        result.max_batch_tokens,
        what,
        " (cached)" if result.from_cache else "",
    )
    return TokenBudget(result.max_batch_tokens)


def warm_up(classifier: Classifier, model_name: str) -> None:
    """Runs the tokenizer and the model once, so the first window does not pay for lazy initialisation."""
    started = time.monotonic()
    classifier.token_ids(["这个商品很好，物流也快"])
    label_texts(classifier, ["这个商品很好，物流也快", "太差了"], max_batch_size=2, max_batch_tokens=4096)
    log.info("model %s warmed up in %.2f s", model_name, time.monotonic() - started)
