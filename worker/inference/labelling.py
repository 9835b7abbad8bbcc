"""Labelling a window of texts: tokenize, group into token-budget batches, run the model, split on failure."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from schemas.dead_letter import DeadLetterKind
from worker.inference.batch_plan import plan_batches
from worker.model.long_text import flatten_chunks, merge_chunk_outputs

log = logging.getLogger(__name__)


class Classifier(Protocol):
    """What the inference stage needs of a model (see worker.model.SentimentClassifier)."""

    labels: list[str]
    call_overhead_tokens: int | None
    """One model call's fixed cost in padded tokens, for the batch planner (None: fewest batches)."""
    parallel_calls: int
    """How many `predict_ids` calls may run side by side: a window's batches run on that many threads."""

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]: ...

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray: ...


@dataclass(frozen=True)
class InferenceFailure:
    """Why one text got no prediction; becomes a dead letter."""

    kind: DeadLetterKind
    reason: str


@dataclass(frozen=True)
class BatchStats:
    size: int
    padded_tokens: int
    seconds: float


@dataclass
class WindowStats:
    """Measurements of one window, for metrics and benchmarks."""

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

    Owned by the inference thread (its lanes update it under a lock). `lowered` counts the out-of-memory
    events that lowered it.
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


def sequences_for(classifier: Classifier, texts: Sequence[str]) -> tuple[list[list[int]], list[int] | None]:
    """The token-id sequences to label for `texts`, and how many belong to each text when a classifier in
    long_text=chunk mode splits long texts into windows (None: exactly one per text, in order)."""
    if not texts:
        return [], None
    chunker: Callable[[Sequence[str]], list[list[list[int]]]] | None = getattr(
        classifier, "token_id_chunks", None
    )
    if chunker is None:
        return classifier.token_ids(texts), None
    flat, counts = flatten_chunks(chunker(texts))
    return flat, (counts if len(flat) != len(texts) else None)


def merge_sequences(
    outputs: list[np.ndarray | InferenceFailure], counts: list[int] | None
) -> list[np.ndarray | InferenceFailure]:
    """One output per text from the outputs of `sequences_for`'s sequences: a text's window probabilities
    are averaged; a text with any failed window gets that failure (it is dead-lettered, not half-labelled)."""
    return outputs if counts is None else merge_chunk_outputs(outputs, counts)


Labelled = tuple[list[np.ndarray | InferenceFailure], WindowStats]
"""One output per sequence (or text), in input order, and the measurements of the work."""


def label_texts(
    classifier: Classifier,
    texts: Sequence[str],
    *,
    max_batch_size: int,
    max_batch_tokens: int,
    clock: Callable[[], float] = time.perf_counter,
) -> Labelled:
    """Tokenizes `texts` and labels them (see `label_ids`) with a fixed token budget: one output per text,
    in input order (chunked long texts averaged back into one)."""
    started = clock()
    ids, counts = sequences_for(classifier, texts)
    tokenize_seconds = clock() - started
    budget = TokenBudget(max_batch_tokens)
    outputs, stats = begin_label_ids(
        classifier, ids, counts=counts, max_batch_size=max_batch_size, budget=budget, clock=clock
    )()
    stats.tokenize_seconds = tokenize_seconds
    return outputs, stats


def label_ids(
    classifier: Classifier,
    ids: Sequence[Sequence[int]],
    *,
    max_batch_size: int,
    budget: TokenBudget,
    clock: Callable[[], float] = time.perf_counter,
) -> Labelled:
    """Probabilities (one row per token-id sequence, in input order) or a failure for each sequence.

    Sequences are grouped by length into batches of at most `max_batch_size` sequences and
    `budget.current` padded tokens; the output order is the input order whatever the grouping. A batch
    that fails is split in halves and retried (out of memory also lowers the budget); a single sequence
    that still fails gets an `InferenceFailure`.
    """
    return begin_label_ids(classifier, ids, max_batch_size=max_batch_size, budget=budget, clock=clock)()


def begin_label_ids(
    classifier: Classifier,
    ids: Sequence[Sequence[int]],
    *,
    max_batch_size: int,
    budget: TokenBudget,
    counts: list[int] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Callable[[], Labelled]:
    """`label_ids` in two steps: plans the batches and queues them on the model lanes now, on the caller's
    thread, and returns the function that waits for them and returns what `label_ids` returns — or, given
    `sequences_for`'s `counts`, one output per text (`merge_sequences`).

    The lanes take batches in the order they were queued, so the next window's batches begun while this
    one runs start the moment a lane is free: no lane idles at a window's boundary waiting for the
    inference thread (which, on a busy interpreter, waited for the lock at each step). A classifier whose
    calls cannot run side by side (`parallel_calls` 1) runs its batches in the returned function instead.
    """
    stats = WindowStats()
    outputs: list[np.ndarray | InferenceFailure | None] = [None] * len(ids)
    if not ids:
        return lambda: ([], stats)
    lengths = [len(row) for row in ids]
    stats.real_tokens = sum(lengths)
    batches = plan_batches(
        lengths,
        max_batch_size=max_batch_size,
        max_batch_tokens=budget.current,
        call_overhead_tokens=classifier.call_overhead_tokens,
    )

    def predict(batch: list[int]) -> None:
        _predict_splitting(classifier, ids, lengths, batch, outputs, stats, budget, clock)

    def labelled() -> Labelled:
        if any(out is None for out in outputs):
            raise AssertionError("inference left sequences without an output")  # a bug, never bad input
        return merge_sequences([out for out in outputs if out is not None], counts), stats

    if min(classifier.parallel_calls, len(batches)) <= 1:

        def in_turn() -> Labelled:
            for batch in batches:
                predict(batch)
            return labelled()

        return in_turn
    # Each batch writes its own rows of `outputs`; `stats` and `budget` are updated under their lock.
    # Dearest batches first, so the lanes finish the window close together (not on the longest batch).
    pool = _lanes(classifier.parallel_calls)
    dearest_first = sorted(batches, key=lambda batch: -len(batch) * max(lengths[i] for i in batch))
    queued = [pool.submit(predict, batch) for batch in dearest_first]

    def side_by_side() -> Labelled:
        for future in queued:
            future.result()  # a bug in a lane surfaces here; model failures were split and dead-lettered
        return labelled()

    return side_by_side


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()
_STATS_LOCK = threading.Lock()
"""Guards `WindowStats` and `TokenBudget` updates from lanes running side by side."""


def _lanes(size: int) -> ThreadPoolExecutor:
    """The threads that run a window's batches side by side: one pool per classifier width (`parallel_calls`),
    made once, whatever the window's batch count (threads named ``model-lane-{size}_N``)."""
    with _POOLS_LOCK:
        if size not in _POOLS:
            _POOLS[size] = ThreadPoolExecutor(max_workers=size, thread_name_prefix=f"model-lane-{size}")
        return _POOLS[size]


def _predict_splitting(
    classifier: Classifier,
    ids: Sequence[Sequence[int]],
    lengths: list[int],
    batch: list[int],
    outputs: list[np.ndarray | InferenceFailure | None],
    stats: WindowStats,
    budget: TokenBudget,
    clock: Callable[[], float],
) -> None:
    padded = len(batch) * max(lengths[i] for i in batch)
    started = clock()
    try:
        probs = classifier.predict_ids([ids[i] for i in batch])
        if len(probs) != len(batch):
            raise RuntimeError(f"model returned {len(probs)} outputs for {len(batch)} inputs")
    except Exception as exc:  # noqa: BLE001 - any model failure is split, then dead-lettered
        oom = is_out_of_memory(exc)
        if oom:
            with _STATS_LOCK:
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
        with _STATS_LOCK:
            stats.splits += 1
        log.warning(
            "batch of %d failed (%s); retrying in halves", len(batch), "out of memory" if oom else exc
        )
        half = len(batch) // 2
        _predict_splitting(classifier, ids, lengths, batch[:half], outputs, stats, budget, clock)
        _predict_splitting(classifier, ids, lengths, batch[half:], outputs, stats, budget, clock)
        return
    with _STATS_LOCK:
        stats.padded_tokens += padded
        stats.batches.append(BatchStats(len(batch), padded, clock() - started))
    for row, index in zip(probs, batch, strict=True):
        outputs[index] = row
