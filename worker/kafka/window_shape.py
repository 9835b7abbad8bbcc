"""How many messages a Kafka window gathers for the device the model runs on (pure logic): on CPU, or when
set, `max_window_messages`; on a GPU by default about one batch of the token budget at the mean review length
(see `worker.inference.batch_shape` for why a count is the wrong bound there)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from worker.config import BatchingSettings


@dataclass(frozen=True)
class WindowShape:
    """How many messages a Kafka window gathers at most (besides `max_wait_ms` and its bytes bound)."""

    max_messages: int
    """`max_window_messages`: the cap, or with `fills_token_budget` the least cap."""
    fills_token_budget: bool = False
    """GPU default: the cap grows to about one batch of the token budget."""

    def __post_init__(self) -> None:
        if self.max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {self.max_messages}")

    @classmethod
    def for_device(cls, batching: BatchingSettings, *, on_gpu: bool) -> WindowShape:
        """`max_window_messages` as it is on CPU or when set; on a GPU otherwise filling the token budget."""
        fills = on_gpu and not batching.max_window_messages_given
        return cls(batching.max_window_messages, fills)

    def cap(self, token_budget: int, tokens_per_text: float | None) -> int:
        """The window's message cap now: `max_messages`, or (filling the token budget) enough texts of
        `tokens_per_text` tokens (the mean labelled so far; None before the first) to fill `token_budget`
        padded tokens, if that is more."""
        if not self.fills_token_budget or not tokens_per_text or tokens_per_text <= 0:
            return self.max_messages
        return max(self.max_messages, math.ceil(token_budget / tokens_per_text))
