"""Waiting in tests without timing them: poll a condition until it holds or a deadline passes.

A loaded machine makes things slower, never wrong; so tests wait for the state they need (readiness, a
gauge refreshed, a count reached) instead of sleeping a fixed time, and every wait has a deadline that
fails the test with what it was waiting for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.1) -> T:
    """Polls `condition` every `interval_s` until it returns a truthy value, and returns that value;
    fails the test with `what` after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(interval_s)
