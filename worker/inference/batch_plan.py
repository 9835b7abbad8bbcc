"""The batch plan: a window's items split into token-budget, length-sorted inference batches.

Pure logic (no Kafka, no Paddle). The consume window (`consume_window.py`) decides *when* to run inference;
`plan_batches` decides *how* to split the window's items into model calls so that padding is small and each
call fits a token budget. Grouping by length reorders items only inside the window: the caller emits results
in window input order, so publishing order within a partition is never changed.
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_batches(
    token_counts: Sequence[int], *, max_batch_size: int, max_batch_tokens: int
) -> list[list[int]]:
    """Group item indices into inference batches.

    Items are sorted by token count (stable, so equal lengths keep input order) and packed greedily so that
    each batch has at most `max_batch_size` items and at most `max_batch_tokens` padded tokens
    (`len(batch) * max(token_count in batch)`, what the model actually computes on). An item that alone
    exceeds `max_batch_tokens` gets a batch of its own; the caller decides what to do with it (truncate,
    chunk, or dead-letter). Every index appears exactly once. Batches come out shortest first; the caller
    restores window input order when it publishes results.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    order = sorted(range(len(token_counts)), key=token_counts.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        n_tokens = token_counts[index]
        if n_tokens < 0:
            raise ValueError(f"token count must be >= 0, got {n_tokens} at index {index}")
        # Ascending order: this item is the longest in the batch, so it sets the padded length.
        size = len(current) + 1
        if current and (size > max_batch_size or size * n_tokens > max_batch_tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def padded_tokens(batch: Sequence[int], token_counts: Sequence[int]) -> int:
    """Tokens the model computes for `batch` (indices into `token_counts`) padded to its longest item."""
    if not batch:
        return 0
    return len(batch) * max(token_counts[i] for i in batch)


def padding_efficiency(batches: Sequence[Sequence[int]], token_counts: Sequence[int]) -> float:
    """Real tokens / padded tokens over all `batches`, in (0, 1]; 1.0 when there is nothing to pad."""
    padded = sum(padded_tokens(batch, token_counts) for batch in batches)
    if padded == 0:
        return 1.0
    real = sum(token_counts[i] for batch in batches for i in batch)
    return real / padded
