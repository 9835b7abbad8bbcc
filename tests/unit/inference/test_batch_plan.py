"""Batch planning (token budget, length sorting)."""

from __future__ import annotations

import random

import pytest

from worker.inference.batch_plan import padded_tokens, padding_efficiency, plan_batches

# --- plan_batches ------------------------------------------------------------------------------------


def test_groups_similar_lengths_within_budget() -> None:
    counts = [100, 10, 12, 98, 11, 101]
    batches = plan_batches(counts, max_batch_size=8, max_batch_tokens=320)
    assert batches == [[1, 4, 2], [3, 0, 5]]
    assert [padded_tokens(b, counts) for b in batches] == [36, 303]


def test_respects_max_batch_size() -> None:
    batches = plan_batches([5] * 10, max_batch_size=4, max_batch_tokens=10_000)
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_equal_lengths_keep_input_order() -> None:
    counts = [7, 3, 7, 3, 7]
    assert plan_batches(counts, max_batch_size=10, max_batch_tokens=1000) == [[1, 3, 0, 2, 4]]


def test_item_over_budget_gets_its_own_batch() -> None:
    counts = [10, 600, 10, 700]
    batches = plan_batches(counts, max_batch_size=8, max_batch_tokens=512)
    assert batches == [[0, 2], [1], [3]]


def test_empty_input_gives_no_batches() -> None:
    assert plan_batches([], max_batch_size=4, max_batch_tokens=100) == []


def test_zero_token_items_are_planned_not_rejected() -> None:
    # Only a negative count is an error: an item with no tokens is packed like any other.
    assert plan_batches([3, 0], max_batch_size=4, max_batch_tokens=6) == [[1, 0]]


def test_a_one_token_budget_is_valid() -> None:
    # The smallest budget allowed: two one-token items would pad to 2, so each gets its own batch.
    assert plan_batches([1, 1], max_batch_size=4, max_batch_tokens=1) == [[0], [1]]


@pytest.mark.parametrize(
    ("kwargs", "counts"),
    [
        ({"max_batch_size": 0, "max_batch_tokens": 10}, [1]),
        ({"max_batch_size": 1, "max_batch_tokens": 0}, [1]),
        ({"max_batch_size": 1, "max_batch_tokens": 10}, [1, -1]),
    ],
)
def test_invalid_arguments(kwargs: dict[str, int], counts: list[int]) -> None:
    with pytest.raises(ValueError):
        plan_batches(counts, **kwargs)


@pytest.mark.parametrize("seed", range(20))
def test_random_plans_cover_every_index_once_within_bounds(seed: int) -> None:
    rng = random.Random(seed)
    counts = [rng.randint(1, 600) for _ in range(rng.randint(0, 400))]
    max_batch_size = rng.choice([1, 4, 16, 64])
    max_batch_tokens = rng.choice([256, 512, 4096])
    batches = plan_batches(counts, max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(counts)))
    for batch in batches:
        assert batch, "no empty batches"
        assert len(batch) <= max_batch_size
        assert padded_tokens(batch, counts) <= max_batch_tokens or len(batch) == 1
    # Greedy packing: a batch was only closed because the next item did not fit.
    for batch, following in zip(batches, batches[1:], strict=False):
        size = len(batch) + 1
        assert size > max_batch_size or size * counts[following[0]] > max_batch_tokens


def test_skewed_lengths_pad_far_less_than_padding_to_the_max() -> None:
    rng = random.Random(7)
    # Realistic review mix: mostly short, a long tail.
    counts = [rng.randint(8, 40) for _ in range(900)] + [rng.randint(200, 512) for _ in range(100)]
    rng.shuffle(counts)
    batches = plan_batches(counts, max_batch_size=64, max_batch_tokens=8192)
    planned = padding_efficiency(batches, counts)
    naive = sum(counts) / (len(counts) * max(counts))  # one padded shape for everything
    assert planned > 0.9
    assert naive < 0.15
    # Fixed-size batches in arrival order (no sorting) are also much worse.
    arrival = [list(range(i, min(i + 64, len(counts)))) for i in range(0, len(counts), 64)]
    assert padding_efficiency(arrival, counts) < 0.2


def _plan_cost(batches: list[list[int]], counts: list[int], per_call: int) -> int:
    return sum(per_call + padded_tokens(batch, counts) for batch in batches)


def _cheapest_by_brute_force(counts: list[int], size: int, budget: int, per_call: int) -> int:
    """The least padded tokens + calls x per_call over every cut of the sorted items into batches."""
    order = sorted(range(len(counts)), key=counts.__getitem__)
    best = None
    for mask in range(2 ** max(0, len(order) - 1)):
        batches, current = [], [order[0]] if order else []
        for position, index in enumerate(order[1:]):
            if mask >> position & 1:
                batches.append(current)
                current = []
            current.append(index)
        batches += [current] if current else []
        if all(len(b) <= size and (padded_tokens(b, counts) <= budget or len(b) == 1) for b in batches):
            cost = _plan_cost(batches, counts, per_call)
            best = cost if best is None else min(best, cost)
    return best or 0


@pytest.mark.parametrize("seed", range(30))
def test_a_call_cost_gives_the_cheapest_plan_within_bounds(seed: int) -> None:
    rng = random.Random(seed)
    counts = [rng.randint(0, 130) for _ in range(rng.randint(0, 11))]
    size, budget, per_call = rng.choice([1, 3, 32]), rng.choice([1, 200, 2048]), rng.choice([0, 8, 30, 320])
    batches = plan_batches(
        counts, max_batch_size=size, max_batch_tokens=budget, call_overhead_tokens=per_call
    )
    assert sorted(i for batch in batches for i in batch) == list(range(len(counts)))
    for batch in batches:
        assert batch and len(batch) <= size
        assert padded_tokens(batch, counts) <= budget or len(batch) == 1
    assert _plan_cost(batches, counts, per_call) == _cheapest_by_brute_force(counts, size, budget, per_call)


def test_cheap_calls_split_short_reviews_from_long_ones_that_greedy_packing_pads() -> None:
    counts = [120, 10, 10, 10, 10, 10, 10, 10, 10, 118]  # a 10-review window: 8 short, 2 long
    greedy = plan_batches(counts, max_batch_size=32, max_batch_tokens=2048)
    assert greedy == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 0]]  # one call, every review padded to 120: 1,200 tokens
    cut = plan_batches(counts, max_batch_size=32, max_batch_tokens=2048, call_overhead_tokens=30)
    assert cut == [[1, 2, 3, 4, 5, 6, 7, 8], [9, 0]]  # 80 + 240 padded tokens in two calls
    assert padding_efficiency(cut, counts) > 0.99 > 0.4 > padding_efficiency(greedy, counts)
    # A call dearer than the padding it saves (Paddle Inference's ~320 tokens here) keeps one batch.
    assert plan_batches(counts, max_batch_size=32, max_batch_tokens=2048, call_overhead_tokens=1000) == greedy


def test_a_negative_call_cost_is_refused() -> None:
    with pytest.raises(ValueError, match="call_overhead_tokens must be >= 0"):
        plan_batches([1, 2], max_batch_size=2, max_batch_tokens=10, call_overhead_tokens=-1)


def test_padding_helpers() -> None:
    counts = [2, 4, 0]
    assert padded_tokens([], counts) == 0
    assert padded_tokens([0, 1], counts) == 8
    assert padding_efficiency([[0, 1]], counts) == 6 / 8
    assert padding_efficiency([], counts) == 1.0
    assert padding_efficiency([[2]], counts) == 1.0
