"""The search for an unreadable batch's end (pure logic): a simulated partition answers each probe as
librdkafka does: an error at the batch's base offset while the probe is inside it, the next record once it is
past."""

from __future__ import annotations

import pytest

from worker.kafka.undecodable import DeadLetterRange, Seek, UndecodableBatches

KEY = ("reviews", 0)
REASON = "Decompression failed"


class _Partition:
    """Records at `offsets` (sorted); one unreadable batch holding `bad` (base, last)."""

    def __init__(self, offsets: list[int], bad: tuple[int, int]) -> None:
        self.offsets, self.bad = offsets, bad

    def answer(self, tracker: UndecodableBatches, probe: int, now: float) -> Seek | DeadLetterRange | None:
        base, last = self.bad
        if base <= probe <= last:
            return tracker.error(KEY, base, REASON, now)
        following = [o for o in self.offsets if o >= probe]
        if not following:  # nothing there: the probe times out
            return None
        drop, action = tracker.data(KEY, following[0], now)
        assert drop
        return action


def _find(partition: _Partition, retries: int, high: int | None) -> tuple[DeadLetterRange, int]:
    tracker = UndecodableBatches(retries, lambda _key: high, probe_timeout_s=5.0)
    base = partition.bad[0]
    now, probes = 0.0, 0
    action = None
    for _ in range(retries + 1):
        assert action is None
        action = tracker.error(KEY, base, REASON, now)
    assert tracker.holds(KEY)
    while isinstance(action, Seek):
        probes += 1
        now += 1.0
        answered = partition.answer(tracker, action.offset, now)
        if answered is None:
            now += 5.0
            [answered] = tracker.tick(now)
        action = answered
    assert isinstance(action, DeadLetterRange) and not tracker.holds(KEY)
    return action, probes


@pytest.mark.parametrize(
    ("bad", "end", "high"),
    [
        ((3, 3), 9, 9),  # a batch of one
        ((3, 5), 9, 9),  # the test's bomb: three records between good ones
        ((0, 999), 1500, 1500),
        ((10, 20), 21, 21),  # the last batch of the partition: bounded by the high watermark
        ((10, 20), 21, None),  # ... or, without one, by a probe that brings nothing
        ((5, 100), 400, None),
    ],
)
def test_the_search_finds_exactly_the_batch(bad: tuple[int, int], end: int, high: int | None) -> None:
    offsets = [o for o in range(end) if not bad[0] <= o <= bad[1]]
    found, probes = _find(_Partition(offsets, bad), retries=2, high=high)
    assert (found.first, found.last, found.reason) == (bad[0], bad[1], REASON)
    assert probes <= 2 * (bad[1] - bad[0] + 2).bit_length() + 2


def test_gaps_after_the_batch_count_as_past_it() -> None:
    # A transaction marker or compacted offsets after the batch: the next record is further on.
    offsets = [0, 1, 2, 9, 10]
    found, _ = _find(_Partition(offsets, (3, 5)), retries=0, high=11)
    assert (found.first, found.last) == (3, 5)


def test_retries_come_before_any_probe_and_readiness_names_the_batch() -> None:
    tracker = UndecodableBatches(3, lambda _key: 100)
    assert [tracker.error(KEY, 7, REASON, float(t)) for t in range(3)] == [None] * 3
    assert tracker.held(10.0) == {KEY: (10.0, f"offset 7: {REASON} (fetched 3 of 4 times)")}
    assert isinstance(tracker.error(KEY, 7, REASON, 4.0), Seek)
    assert "finding where the batch ends" in tracker.held(5.0)[KEY][1]


def test_a_batch_read_after_all_releases_the_partition() -> None:
    tracker = UndecodableBatches(3, lambda _key: 100)
    tracker.error(KEY, 7, REASON, 0.0)
    assert tracker.data(KEY, 7, 1.0) == (False, None)
    assert not tracker.holds(KEY)


def test_a_second_round_starts_where_the_first_stopped() -> None:
    # A timeout took a probe inside the batch for one past it: the rest comes in a second round.
    tracker = UndecodableBatches(0, lambda _key: None)
    seek = tracker.error(KEY, 3, REASON, 0.0)
    assert seek == Seek(KEY, 4)
    [first_round] = tracker.tick(10.0)
    assert first_round == DeadLetterRange(KEY, 3, 3, REASON)
    # The consumer, sent to 4, meets the same batch (base offset 3) again.
    assert tracker.error(KEY, 3, REASON, 11.0) == Seek(KEY, 5)
    assert tracker.error(KEY, 3, REASON, 12.0) == Seek(KEY, 7)  # 5 is inside: gallop on
    assert tracker.data(KEY, 7, 13.0) == (True, Seek(KEY, 6))  # 7 is past it: bisect
    assert tracker.data(KEY, 6, 14.0) == (True, DeadLetterRange(KEY, 4, 5, REASON))


def test_forget_drops_what_was_found() -> None:
    tracker = UndecodableBatches(0, lambda _key: None)
    tracker.error(KEY, 3, REASON, 0.0)
    tracker.forget([KEY])
    assert not tracker.holds(KEY) and tracker.held(1.0) == {}
    # A rewind to before the batch: met again, it starts from its base offset.
    assert tracker.error(KEY, 3, REASON, 2.0) == Seek(KEY, 4)


def test_answers_from_before_the_last_seek_are_ignored() -> None:
    tracker = UndecodableBatches(0, lambda _key: 50)
    assert tracker.error(KEY, 10, REASON, 0.0) == Seek(KEY, 11)
    assert tracker.data(KEY, 9, 1.0) == (True, None)
    assert tracker.error(KEY, 8, REASON, 1.0) is None
    assert tracker.holds(KEY)
