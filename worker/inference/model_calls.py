"""One batch on the model, split in halves on failure (out of memory lowering the running token budget), and
the measurements of the work. The engine (`engine.py`) is the only caller."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from schemas.dead_letter import DeadLetterKind
from worker.inference.classifier import Classifier, InferenceFailure, Output

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchStats:
    size: int
    padded_tokens: int
    seconds: float


@dataclass
class GroupStats:
    """Measurements of one group of submissions labelled together (a Kafka window, HTTP requests gathered
    together, a `predict` chunk), for metrics and benchmarks."""

    tokenize_seconds: float = 0.0
    real_tokens: int = 0
    padded_tokens: int = 0
    batches: list[BatchStats] = field(default_factory=list)
    splits: int = 0
    out_of_memory_events: int = 0

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0


def is_out_of_memory(exc: BaseException) -> bool:
    """True for allocator failures (host MemoryError, Paddle's ResourceExhausted / CUDA out of memory)."""
    if isinstance(exc, MemoryError):
        return True
    text = f"{type(exc).__name__} {exc}".lower()
    return "out of memory" in text or "resourceexhausted" in text or "resource exhausted" in text


class TokenBudget:
    """The running padded-token budget of inference batches; lowered when a batch runs out of memory.

    Owned by the engine (its lanes update it under a lock). `lowered` counts the out-of-memory events that
    lowered it.
    """

    def __init__(self, max_batch_tokens: int, *, floor_tokens: int = 16) -> None:
        self.current = max_batch_tokens
        self.floor_tokens = floor_tokens
        self.lowered = 0

    def on_out_of_memory(self, padded_tokens: int) -> None:
        """A batch of `padded_tokens` did not fit: keep future batches at half of it."""
        target = max(self.floor_tokens, padded_tokens // 2)
        if target < self.current:
            log.warning(
                "out of memory at %d padded tokens: token budget %d -> %d",
                padded_tokens,
                self.current,
                target,
            )
            self.current = target
            self.lowered += 1


def predict_splitting(
    classifier: Classifier,
    ids: Sequence[Sequence[int]],
    lengths: list[int],
    batch: list[int],
    outputs: list[Output | None],
    stats: GroupStats,
    budget: TokenBudget,
    lock: threading.Lock,
    clock: Callable[[], float],
) -> None:
    """Runs the model on the sequences `batch` indexes and writes their rows into `outputs`. A batch that
    fails is split in halves and retried (out of memory also lowers `budget`); a single sequence that still
    fails gets an `InferenceFailure`. `stats` and `budget` are updated under `lock` (lanes run side by
    side)."""
    padded = len(batch) * max(lengths[i] for i in batch)
    started = clock()
    try:
        probs = classifier.predict_ids([ids[i] for i in batch])
        if len(probs) != len(batch):
            raise RuntimeError(f"model returned {len(probs)} outputs for {len(batch)} inputs")
    except Exception as exc:  # noqa: BLE001 - any model failure is split, then dead-lettered
        oom = is_out_of_memory(exc)
        if oom:
            with lock:
                stats.out_of_memory_events += 1
                budget.on_out_of_memory(padded)
        if len(batch) == 1:
            kind = DeadLetterKind.TOO_LONG_FOR_MEMORY if oom else DeadLetterKind.INFERENCE_FAILED
            reason = (
                f"the model failed on this review ({lengths[batch[0]]} tokens): {type(exc).__name__}: {exc}"
            )
            log.warning("dead-lettering one review: %s", reason)
            outputs[batch[0]] = InferenceFailure(kind, reason[:500])
            return
        with lock:
            stats.splits += 1
        log.warning(
            "batch of %d failed (%s); retrying in halves", len(batch), "out of memory" if oom else exc
        )
        half = len(batch) // 2
        predict_splitting(classifier, ids, lengths, batch[:half], outputs, stats, budget, lock, clock)
        predict_splitting(classifier, ids, lengths, batch[half:], outputs, stats, budget, lock, clock)
        return
    with lock:
        stats.padded_tokens += padded
        stats.batches.append(BatchStats(len(batch), padded, clock() - started))
    for row, index in zip(probs, batch, strict=True):
        outputs[index] = row
