"""Calls with a deadline the caller keeps even when the call does not return (real threads, no client)."""

from __future__ import annotations

import threading

import pytest

from tests.polling import wait_until
from worker.kafka.deadline_calls import CallAbandoned, DeadlineCalls


def test_a_call_that_returns_gives_its_result_or_its_exception() -> None:
    calls = DeadlineCalls("test-call")
    assert calls.call(lambda a, b: a + b, 2, 3, timeout_s=5, what="add") == 5
    with pytest.raises(ZeroDivisionError):
        calls.call(lambda: 1 / 0, timeout_s=5, what="divide")
    assert calls.stuck == 0


def test_a_call_that_does_not_return_is_given_up_at_its_deadline_and_counted_until_it_returns() -> None:
    calls = DeadlineCalls("test-call")
    release = threading.Event()
    waited: list[float] = []
    with pytest.raises(CallAbandoned, match="send_offsets did not return within"):
        calls.call(release.wait, timeout_s=0.3, what="send_offsets", on_wait=waited.append)
    assert waited and calls.stuck == 1
    release.set()
    assert calls.call(lambda: "next", timeout_s=5, what="next") == "next"
    wait_until(lambda: calls.stuck == 0, 60, "the given-up call to return on its own thread")


def test_give_up_ends_the_wait_before_the_deadline() -> None:
    calls = DeadlineCalls("test-call")
    never = threading.Event()
    asked = threading.Event()

    def give_up() -> bool:
        asked.set()
        return True  # e.g. a stop whose time is up

    with pytest.raises(CallAbandoned):
        calls.call(never.wait, timeout_s=3600, what="commit_transaction", give_up=give_up)
    assert asked.is_set()
    never.set()
