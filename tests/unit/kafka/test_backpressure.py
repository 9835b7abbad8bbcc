"""Backpressure: consume while there is room; wait for a busy model; pause only after max_unpolled_s."""

from __future__ import annotations

from worker.kafka.backpressure import Backpressure, PollDecision

CONSUME = PollDecision(consume=True, pause=False)
WAIT = PollDecision(consume=False, pause=False)
PAUSE_AND_POLL = PollDecision(consume=True, pause=True)


def test_consumes_while_the_window_has_room_even_when_the_model_is_busy() -> None:
    bp = Backpressure(max_unpolled_s=2.0)
    assert bp.decide(room=256, model_busy=True, now=0.0) == CONSUME
    assert bp.decide(room=1, model_busy=True, now=10.0) == CONSUME


def test_a_full_window_behind_a_busy_model_waits_without_pausing_then_pauses_after_the_limit() -> None:
    bp = Backpressure(max_unpolled_s=2.0)
    assert bp.decide(room=0, model_busy=True, now=100.0) == WAIT
    assert bp.decide(room=0, model_busy=True, now=101.9) == WAIT
    assert bp.decide(room=0, model_busy=True, now=102.0) == PAUSE_AND_POLL
    assert bp.decide(room=0, model_busy=True, now=150.0) == PAUSE_AND_POLL  # stays paused, keeps polling


def test_room_again_resumes_and_restarts_the_clock() -> None:
    bp = Backpressure(max_unpolled_s=2.0)
    bp.decide(room=0, model_busy=True, now=0.0)
    assert bp.decide(room=0, model_busy=True, now=3.0) == PAUSE_AND_POLL
    assert bp.decide(room=256, model_busy=True, now=3.1) == CONSUME
    assert bp.decide(room=0, model_busy=True, now=3.2) == WAIT  # a new full spell waits again
    assert bp.decide(room=0, model_busy=True, now=5.1) == WAIT
    assert bp.decide(room=0, model_busy=True, now=5.2) == PAUSE_AND_POLL


def test_no_room_with_an_idle_model_pauses_and_polls_at_once() -> None:
    # E.g. --max-messages reached and every window published: nothing to wait for, so the loop keeps
    # polling (serving events, waiting for acks) with the partitions paused.
    bp = Backpressure(max_unpolled_s=2.0)
    assert bp.decide(room=0, model_busy=False, now=0.0) == PAUSE_AND_POLL
    assert bp.decide(room=-3, model_busy=False, now=0.1) == PAUSE_AND_POLL


def test_by_default_the_partitions_are_paused_after_two_seconds_as_the_readme_says() -> None:
    bp = Backpressure()
    assert bp.decide(room=0, model_busy=True, now=0.0) == WAIT
    assert bp.decide(room=0, model_busy=True, now=1.99) == WAIT
    assert bp.decide(room=0, model_busy=True, now=2.0) == PAUSE_AND_POLL


def test_negative_room_is_no_room() -> None:
    """The loop's room is max_window_messages minus the window's size: it may go below zero."""
    bp = Backpressure(max_unpolled_s=2.0)
    assert bp.decide(room=-3, model_busy=True, now=0.0) == WAIT
    assert bp.decide(room=-3, model_busy=True, now=2.0) == PAUSE_AND_POLL
