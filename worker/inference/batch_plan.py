"""The batch plan: a group of submitted texts split into token-budget, length-sorted inference batches.

Pure logic (no Kafka, no Paddle). The front doors decide *when* texts are submitted (the Kafka door's consume
window, an HTTP request); `plan_batches` decides *how* to split a group's texts into model calls so that
padding is small and each call fits a token budget. Grouping by length reorders texts only inside the group:
every submission gets its outputs in input order, so publishing order within a partition is never changed.
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_batches(
    token_counts: Sequence[int],
    *,
    max_batch_size: int | None,
    max_batch_tokens: int,
    call_overhead_tokens: int | None = None,
) -> list[list[int]]:
    """Group item indices into inference batches.

    Items are sorted by token count (stable, so equal lengths keep input order) and cut into consecutive
    batches of at most `max_batch_size` items (None: no count cap, as on a GPU) and at most
    `max_batch_tokens` padded tokens (`len(batch) * max(token_count in batch)`, what the model actually
    computes on). An item that alone
    exceeds `max_batch_tokens` gets a batch of its own; the caller decides what to do with it (truncate,
    chunk, or dead-letter). Every index appears exactly once. Batches come out shortest first; the caller
    restores window input order when it publishes results.

    Where to cut: `call_overhead_tokens` None packs greedily, as few batches as the bounds allow. A number
    is what one more model call costs, in padded tokens (the backend's fixed cost per call, see
    `TextClassifierBase.call_overhead_tokens`): the cuts then minimise padded tokens + calls x that cost,
    exactly (dynamic programming over the sorted items: under 1 ms for a 256-item window). A backend whose
    calls are cheap gets more, tighter batches from a small window instead of a few padded to their
    longest review.
    """
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    if call_overhead_tokens is not None and call_overhead_tokens < 0:
        raise ValueError(f"call_overhead_tokens must be >= 0, got {call_overhead_tokens}")
    for index, n_tokens in enumerate(token_counts):
        if n_tokens < 0:
            raise ValueError(f"token count must be >= 0, got {n_tokens} at index {index}")
    order = sorted(range(len(token_counts)), key=token_counts.__getitem__)
    most = len(order) if max_batch_size is None else max_batch_size  # the token bound alone: no count cap
    if call_overhead_tokens is None:
        return _pack_greedily(order, token_counts, most, max_batch_tokens)
    return _cut_cheapest(order, token_counts, most, max_batch_tokens, call_overhead_tokens)


def _pack_greedily(
    order: list[int], token_counts: Sequence[int], max_batch_size: int, max_batch_tokens: int
) -> list[list[int]]:
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        # Ascending order: this item is the longest in the batch, so it sets the padded length.
        size = len(current) + 1
        if current and (size > max_batch_size or size * token_counts[index] > max_batch_tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def _cut_cheapest(
    order: list[int], token_counts: Sequence[int], max_batch_size: int, max_batch_tokens: int, per_call: int
) -> list[list[int]]:
    """The cuts of `order` (ascending token counts) into batches within the bounds that minimise padded
    tokens + `per_call` per batch: cost[j] = min over the last batch order[i:j] of cost[i] + per_call +
    (j - i) * count(order[j - 1])."""
    lengths = [token_counts[index] for index in order]
    n = len(lengths)
    cost = [0] * (n + 1)
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[j - 1]
        best, best_start = cost[j - 1] + per_call + longest, j - 1  # order[j - 1] alone always fits
        for i in range(j - 2, max(0, j - max_batch_size) - 1, -1):
            size = j - i
            if size * longest > max_batch_tokens:
                break  # a longer batch ending here pads even more
            candidate = cost[i] + per_call + size * longest
            if candidate <= best:  # ties: the longer batch, fewer calls
                best, best_start = candidate, i
        cost[j], start[j] = best, best_start
    batches: list[list[int]] = []
    j = n
    while j > 0:
        batches.append(order[start[j] : j])
        j = start[j]
    batches.reverse()
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
