"""The run summary's rate counts labelling time only (first message consumed to last output acknowledged)."""

from __future__ import annotations

from threading import Event

from tests.clocks import FakeClock
from worker.kafka.run_tracker import RunSummary, RunTracker, drain_budget_s


def test_rate_is_over_labelling_time_not_the_whole_run() -> None:
    summary = RunSummary(consumed=100, results=98, dead_letters=2, seconds=30.0)
    assert summary.labelling_seconds == 0.0 and summary.messages_per_second == 0.0
    summary.first_consumed_at, summary.last_acknowledged_at = 112.0, 117.0
    assert summary.labelling_seconds == 5.0
    assert summary.messages_per_second == 20.0  # not 100 / 30 (model load, idle wait)


def test_max_messages_stays_reachable_when_a_lost_partition_drops_inputs_in_flight() -> None:
    """--max-messages counts inputs done; inputs dropped unfinished (their partition revoked or lost, or
    rewound after an aborted transaction) are re-delivered, and the bound must leave room for them."""
    clock = FakeClock()
    run = RunTracker(clock)
    run.start(max_messages=10)
    for _ in range(10):
        run.consumed()
    assert run.room(in_progress=10) == 0 and run.limit_reached(in_progress=10)
    for _ in range(6):
        run.finished("result")
    # The partition of the 4 others is lost: dropped unlabelled, nothing of them is in progress any more.
    assert run.stop_reason(idle=False) is None
    assert run.room(in_progress=0) == 4 and not run.limit_reached(in_progress=0)
    # They come back (to this member, or others from its partitions) and are done: the run stops.
    for _ in range(4):
        run.consumed()
    assert run.room(in_progress=4) == 0
    for _ in range(3):
        run.finished("result")
    run.finished("undecodable")
    assert run.stop_reason(idle=False) == "processed 10 messages (--max-messages)"
    assert run.summary.consumed == 14 and run.summary.dead_letters_by_kind == {"undecodable": 1}


def test_room_counts_inputs_in_progress_and_done() -> None:
    run = RunTracker(FakeClock())
    run.start(max_messages=5)
    assert run.room(in_progress=0) == 5
    run.consumed()
    run.consumed()
    assert run.room(in_progress=2) == 3
    run.finished("result")
    assert run.room(in_progress=1) == 3
    assert RunTracker(FakeClock()).room(in_progress=7) is None  # no bound


def test_idle_exit_counts_from_the_last_activity_and_only_when_idle() -> None:
    clock = FakeClock()
    run = RunTracker(clock)
    run.start(idle_exit_s=5.0)
    clock.now += 4.0
    assert run.stop_reason(idle=True) is None
    run.activity()  # input, or new partitions
    clock.now += 4.9
    assert run.stop_reason(idle=True) is None
    clock.now += 0.1
    assert run.stop_reason(idle=False) is None  # work in the pipeline
    assert run.stop_reason(idle=True) == "no input for 5 s (--idle-exit-s)"


def test_stop_request_is_an_event() -> None:
    stop = Event()
    run = RunTracker(FakeClock(), stop)
    assert not run.stop_requested
    stop.set()  # e.g. set by a signal handler before run()
    assert run.stop_requested
    run = RunTracker(FakeClock())
    run.request_stop()
    assert run.stop_requested


def test_the_summary_says_what_went_back_to_the_group_so_it_does_not_read_like_loss() -> None:
    """Issue 40: after a rebalance `consumed 1280, results 1025` said nothing of the 255 others."""
    summary = RunSummary(consumed=1280, results=1020, dead_letters=5, unacknowledged_at_stop=3)
    assert summary.handed_back == 252  # consumed = done + handed back + unacknowledged at stop
    assert RunSummary(consumed=10, results=10).handed_back == 0


def test_the_rate_leaves_out_the_quiet_spells_of_a_trickle() -> None:
    """Issue 40: `messages_per_second` counted idle time."""
    clock = FakeClock()
    run = RunTracker(clock)
    run.start()
    run.summary.first_consumed_at = clock.now
    for idle, seconds in [(False, 1.0)] * 5 + [(True, 1.0)] * 100 + [(False, 1.0)] * 5:
        clock.now += seconds
        if not idle:
            for _ in range(10):
                run.finished("result")
            run.summary.last_acknowledged_at = clock.now
        run.stop_reason(idle=idle)
    summary = run.summary
    assert summary.labelling_seconds == 110.0 and summary.busy_seconds == 10.0
    assert summary.messages_per_second == 10.0  # 100 done in 10 busy seconds, not 100 / 110


def test_a_stop_is_timed_from_when_it_is_first_seen_and_its_drain_keeps_a_closing_reserve() -> None:
    clock, stop = FakeClock(), Event()
    run = RunTracker(clock, stop)
    assert run.stop_deadline(24.0) is None and not run.stop_overdue(24.0)
    stop.set()  # by the signal thread
    clock.now = 103.0
    assert run.stop_requested
    clock.now = 110.0
    assert run.stop_deadline(24.0) == 127.0 and run.stop_time_left(24.0) == 17.0
    clock.now = 127.0
    assert run.stop_overdue(24.0) and run.stop_time_left(24.0) == 0.0
    assert drain_budget_s(30.0) == 25.0 and drain_budget_s(3.0) == 2.4


def test_a_run_that_ends_by_itself_starts_its_stop_clock_when_it_ends() -> None:
    clock = FakeClock()
    run = RunTracker(clock)
    clock.now = 150.0
    run.stopping()
    assert run.stop_deadline(10.0) == 160.0
