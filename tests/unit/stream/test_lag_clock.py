"""Lag in seconds: the age of the oldest unfinished message, not of the last finished one."""

from __future__ import annotations

from worker.stream.lag_clock import LagClock

KEY = ("reviews", 0)
HOUR_MS = 3_600_000


def test_unfinished_messages_give_their_age_until_they_become_committable() -> None:
    clock = LagClock()
    now = 10 * HOUR_MS
    clock.consumed(KEY, 5, now - 30_000)
    clock.consumed(KEY, 6, now - 10_000)
    assert clock.lag_seconds(KEY, lag_messages=0, done_below=None, now_ms=now) == 30.0
    assert clock.lag_seconds(KEY, lag_messages=0, done_below=6, now_ms=now) == 10.0  # offset 5 done
    clock.done(KEY, now - 10_000)
    assert clock.lag_seconds(KEY, lag_messages=0, done_below=7, now_ms=now) == 0.0  # caught up


def test_after_an_idle_hour_a_fresh_message_is_seconds_behind_not_an_hour() -> None:
    clock = LagClock()
    now = 10 * HOUR_MS
    clock.consumed(KEY, 0, now - HOUR_MS)
    clock.done(KEY, now - HOUR_MS)
    clock.consumed(KEY, 1, now - 2_000)
    assert clock.lag_seconds(KEY, lag_messages=0, done_below=1, now_ms=now) == 2.0


def test_unfetched_backlog_is_bounded_by_the_last_done_message_and_unknown_before_any() -> None:
    clock = LagClock()
    now = 10 * HOUR_MS
    assert clock.lag_seconds(KEY, lag_messages=50, done_below=None, now_ms=now) is None
    clock.consumed(KEY, 0, now - 60_000)
    clock.done(KEY, now - 60_000)
    assert clock.lag_seconds(KEY, lag_messages=50, done_below=1, now_ms=now) == 60.0
    clock.forget(KEY)
    assert clock.lag_seconds(KEY, lag_messages=50, done_below=1, now_ms=now) is None
