"""PartitionBook: epochs per assignment, stale work after a rewind or re-assignment, forgetting on revoke."""

from __future__ import annotations

from worker.kafka.partitions import NOT_OWNED, PartitionBook, PartitionKey, format_offsets, format_partitions

A = ("reviews", 0)
B = ("reviews", 1)


def assigned_book(*keys: PartitionKey) -> PartitionBook:
    """A partition book that was just assigned `keys`."""
    book = PartitionBook()
    book.assigned(list(keys))
    return book


def test_work_of_an_unassigned_partition_is_not_owned() -> None:
    book = PartitionBook()
    epoch = book.consumed(A, 0, None)
    assert epoch == NOT_OWNED and not book.owns(A, epoch)


def test_reassignment_makes_earlier_work_stale() -> None:
    book = assigned_book(A, B)
    first = book.consumed(A, 0, 1_000)
    assert book.owns(A, first)
    book.forget([A])
    book.assigned([A])
    assert not book.owns(A, first)
    assert book.owns(A, book.epoch(A)) and book.epoch(A) != first


def test_rewind_makes_in_flight_work_stale_and_forgets_offsets() -> None:
    book = assigned_book(A)
    epoch = book.consumed(A, 5, 1_000)
    book.rewind([A])
    assert not book.owns(A, epoch)
    assert book.offsets.outstanding() == 0


def test_positions_follow_contiguous_acknowledgements() -> None:
    book = assigned_book(A, B)
    for offset in (10, 11, 12):
        book.consumed(A, offset, 1_000 + offset)
    book.acknowledged(A, 11, 1_011)
    assert book.positions([A, B]) == {}  # 10 is not acknowledged yet
    book.acknowledged(A, 10, 1_010)
    assert book.positions([A, B]) == {A: 12}


def test_lag_seconds_is_the_age_of_the_oldest_unfinished_message() -> None:
    book = assigned_book(A)
    book.consumed(A, 0, 1_000)
    book.consumed(A, 1, 3_000)
    assert book.lag_seconds(A, 0, now_ms=5_000) == 4.0
    book.acknowledged(A, 0, 1_000)
    book.offsets.committable()
    assert book.lag_seconds(A, 0, now_ms=5_000) == 2.0


def test_with_nothing_unfinished_but_messages_left_the_lag_is_the_age_of_the_last_done_message() -> None:
    book = assigned_book(A)
    book.consumed(A, 0, 1_000)
    book.acknowledged(A, 0, 1_000)
    # the next message, not fetched yet, was written after offset 0: at most 4 s behind
    assert book.lag_seconds(A, 3, now_ms=5_000) == 4.0
    book.consumed(A, 1, None)
    book.acknowledged(A, 1, None)  # no timestamp: the last known one stays
    assert book.lag_seconds(A, 3, now_ms=5_000) == 4.0


def test_work_tagged_while_unassigned_stays_stale_after_the_assignment() -> None:
    book = PartitionBook()
    epoch = book.consumed(A, 0, None)
    book.assigned([A])
    assert not book.owns(A, epoch)


def test_forget_drops_paused_state_and_offsets() -> None:
    book = assigned_book(A, B)
    assert book.pause([A, B]) == {A, B}
    book.consumed(A, 0, None)
    book.forget([A])
    assert book.paused == {B}
    assert book.epoch(A) == NOT_OWNED and book.offsets.outstanding() == 0


def test_pause_and_resume_report_what_the_consumer_must_change() -> None:
    book = assigned_book(A, B)
    assert book.pause([A]) == {A}
    assert book.pause([A, B]) == {B}  # A is paused already
    assert book.pause([A]) == set()  # B stays paused and is not reported again
    assert book.paused == {A, B}
    assert book.resume([B]) == {B}  # A was revoked meanwhile: nothing to resume there
    assert book.paused == frozenset() and book.resume([A, B]) == set()


def test_log_texts_list_partitions_and_offsets_in_order_or_say_nothing() -> None:
    assert format_partitions([B, A]) == "reviews[0], reviews[1]"
    assert format_partitions([]) == "nothing"
    assert format_offsets({B: 15, A: 8}) == "reviews[0]=8, reviews[1]=15"
    assert format_offsets({}) == "nothing"


def test_a_partition_that_moves_is_never_stalled_and_one_that_waits_counts_up() -> None:
    book = assigned_book(A, B)
    assert book.stalled(0.0) == {A: 0.0, B: 0.0}  # nothing consumed
    book.consumed(A, 0, None)
    book.consumed(B, 0, None)
    assert book.stalled(10.0) == {A: 0.0, B: 0.0}  # both start waiting now
    book.acknowledged(A, 0, None)
    book.consumed(A, 1, None)  # A moves on: its oldest awaited offset is 1
    assert book.stalled(200.0) == {A: 0.0, B: 190.0}
    book.acknowledged(B, 0, None)
    assert book.stalled(201.0)[B] == 0.0  # done: nothing waits


def test_an_idle_partition_starts_counting_only_when_an_input_arrives() -> None:
    book = assigned_book(A)
    book.consumed(A, 0, None)
    book.acknowledged(A, 0, None)
    assert book.stalled(0.0) == {A: 0.0}  # caught up at position 1
    book.consumed(A, 1, None)  # an hour later offset 1 arrives: its frontier is still 1
    assert book.stalled(3600.0) == {A: 0.0}
    assert book.stalled(3630.0) == {A: 30.0}


def test_a_window_aborted_and_read_again_from_the_same_offset_is_no_progress() -> None:
    book = assigned_book(A)
    for now in (0.0, 30.0, 60.0, 90.0, 120.0, 150.0):  # the abort-and-rewind loop, seen at any point of it
        book.consumed(A, 4, None)
        book.consumed(A, 5, None)
        assert book.stalled(now) == {A: now}
        book.rewind([A])  # aborted: offsets 4 and 5 are read again
        assert book.stalled(now + 1.0) == {A: now + 1.0}  # between the rewind and the next consume


def test_a_revoked_partition_is_no_longer_watched() -> None:
    book = assigned_book(A)
    book.consumed(A, 0, None)
    book.stalled(0.0)
    book.forget([A])
    book.assigned([A])
    book.consumed(A, 0, None)
    assert book.stalled(500.0) == {A: 0.0}  # a new owner's clock


def test_an_incremental_assignment_says_what_the_member_holds_not_nothing() -> None:
    from worker.kafka.partitions import PartitionBook, format_assignment_change

    book = PartitionBook()
    book.assigned([("reviews", 0), ("reviews", 1)])
    book.assigned([])  # cooperative rebalancing: this rebalance added nothing, the member keeps 2
    said = format_assignment_change("assigned", [], book.owned)
    assert said == "assigned no more partitions; holds reviews[0], reviews[1]"
    assert "nothing" not in said
    book.forget([("reviews", 0)])
    assert (
        format_assignment_change("revoked", [("reviews", 0)], book.owned)
        == "revoked reviews[0]; holds reviews[1]"
    )
