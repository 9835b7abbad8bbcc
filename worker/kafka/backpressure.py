"""When the poll loop consumes, waits for the model instead, or pauses its partitions (pure logic).

While the window is full and the model's queue has no room, the loop stops consuming and waits for the
model: librdkafka stops fetching at its own queue limits and keeps what it has prefetched. Only when that
lasts ``max_unpolled_s`` does the loop pause the partitions and poll again, which serves rebalances and keeps
the member in the group however long the model takes. Pausing is the rare case on purpose: librdkafka
throws a paused partition's prefetched messages away and fetches them again on resume, so pausing at every
full queue re-fetched a deep backlog over and over (a 200,000-message drain ran at 819 instead of
1,127 msg/s).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_UNPOLLED_S = 2.0


@dataclass(frozen=True)
class PollDecision:
    """What the loop does this turn."""

    consume: bool
    """Call consume() (False: wait for the model's next window instead)."""
    pause: bool
    """The partitions should be paused (consume() then serves only events: rebalances, errors)."""


class Backpressure:
    """Decides, turn by turn, between consuming, waiting for the model, and pausing."""

    def __init__(self, max_unpolled_s: float = MAX_UNPOLLED_S) -> None:
        self._max_unpolled_s = max_unpolled_s
        self._full_since: float | None = None

    def decide(self, *, room: int, model_busy: bool, now: float) -> PollDecision:
        """``room``: messages the window may still take (<= 0: none); ``model_busy``: windows in flight."""
        if room > 0 or not model_busy:
            self._full_since = None
        elif self._full_since is None:
            self._full_since = now
        consume = self._full_since is None or now - self._full_since >= self._max_unpolled_s
        return PollDecision(consume=consume, pause=room <= 0 and consume)
