"""Lag in seconds: the age of the oldest unfinished message, not of the last finished one."""

from __future__ import annotations

from worker.kafka.lag_clock import LagClock

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


def test_a_partition_not_fetched_yet_is_as_old_as_the_message_it_waits_for() -> None:
    clock = LagClock()
    now = 10 * HOUR_MS
    clock.waiting(KEY, 40, now - 600_000)
    assert clock.knows_waiting(KEY, 40) and not clock.knows_waiting(KEY, 41)
    assert clock.lag_seconds(KEY, lag_messages=50, done_below=None, now_ms=now) == 600.0
    assert clock.lag_seconds(KEY, lag_messages=0, done_below=None, now_ms=now) == 0.0  # caught up
    # Once consumed, the unfinished messages speak; once done past it, the waiting one no longer counts.
    clock.consumed(KEY, 40, now - 600_000)
    clock.consumed(KEY, 41, now - 300_000)
    assert clock.lag_seconds(KEY, lag_messages=48, done_below=41, now_ms=now) == 300.0
    clock.done(KEY, now - 300_000)
    assert clock.lag_seconds(KEY, lag_messages=48, done_below=42, now_ms=now) == 300.0  # last done bound
    clock.forget(KEY)
    assert not clock.knows_waiting(KEY, 40)


def test_an_unreadable_waiting_message_leaves_the_lag_unknown() -> None:
    clock = LagClock()
    clock.waiting(KEY, 0, None)
    assert clock.knows_waiting(KEY, 0)
    assert clock.lag_seconds(KEY, lag_messages=5, done_below=None, now_ms=HOUR_MS) is None
