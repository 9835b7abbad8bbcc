"""A clock a unit test sets by hand (monotonic seconds), for parts built with `clock=`."""

from __future__ import annotations


class FakeClock:
    """Returns `now`, which the test moves."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
