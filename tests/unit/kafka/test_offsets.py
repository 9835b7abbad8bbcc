"""OffsetTracker: only contiguous acknowledged prefixes become committable (Kafka next-offset semantics)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from worker.config import WorkerSettings
from worker.kafka.offsets import OffsetTracker, crash_duplicate_bound

T = "reviews"


def tracked(*offsets: int, topic: str = T, partition: int = 0) -> OffsetTracker:
    tracker = OffsetTracker()
    for offset in offsets:
        tracker.track(topic, partition, offset)
    return tracker


def test_in_order_acks_commit_next_offset() -> None:
    tracker = tracked(0, 1, 2)
    assert tracker.committable() == {}
    tracker.ack(T, 0, 0)
    assert tracker.committable() == {(T, 0): 1}
    tracker.ack(T, 0, 1)
    tracker.ack(T, 0, 2)
    assert tracker.committable() == {(T, 0): 3}
    assert tracker.outstanding() == 0


def test_no_commit_past_an_unacked_offset() -> None:
    tracker = tracked(10, 11, 12, 13)
    tracker.ack(T, 0, 11)
    tracker.ack(T, 0, 12)
    tracker.ack(T, 0, 13)
    assert tracker.committable() == {}
    assert tracker.outstanding() == 4
    tracker.ack(T, 0, 10)
    assert tracker.committable() == {(T, 0): 14}
    assert tracker.outstanding() == 0


def test_out_of_order_acks_release_partial_prefix() -> None:
    tracker = tracked(0, 1, 2, 3, 4)
    tracker.ack(T, 0, 2)
    tracker.ack(T, 0, 0)
    assert tracker.committable() == {(T, 0): 1}
    tracker.ack(T, 0, 1)
    assert tracker.committable() == {(T, 0): 3}
    assert tracker.outstanding(T, 0) == 2


def test_gaps_are_skipped() -> None:
    """Compacted topics and transaction markers leave holes; the commit jumps over them."""
    tracker = tracked(5, 9, 20)
    tracker.ack(T, 0, 9)
    tracker.ack(T, 0, 5)
    assert tracker.committable() == {(T, 0): 10}
    tracker.ack(T, 0, 20)
    assert tracker.committable() == {(T, 0): 21}


def test_each_advance_is_reported_once() -> None:
    tracker = tracked(0, 1)
    tracker.ack(T, 0, 0)
    assert tracker.committable() == {(T, 0): 1}
    assert tracker.committable() == {}
    assert tracker.position(T, 0) == 1  # still known, e.g. for the final commit on revoke


def test_partitions_are_independent() -> None:
    tracker = OffsetTracker()
    for offset in range(3):
        tracker.track(T, 0, offset)
        tracker.track(T, 1, offset + 100)
        tracker.track("other", 0, offset)
    tracker.ack(T, 1, 100)
    tracker.ack(T, 1, 101)
    tracker.ack("other", 0, 1)
    assert tracker.committable() == {(T, 1): 102}
    assert tracker.outstanding() == 7
    assert tracker.outstanding(T) == 4
    assert tracker.outstanding(partition=0) == 6
    assert tracker.outstanding(T, 1) == 1
    assert tracker.outstanding("missing", 3) == 0
    tracker.ack("other", 0, 0)
    tracker.ack(T, 0, 0)
    assert tracker.committable() == {("other", 0): 2, (T, 0): 1}


def test_forget_drops_state_and_later_acks_are_ignored() -> None:
    tracker = OffsetTracker()
    for offset in range(3):
        tracker.track(T, 0, offset)
        tracker.track(T, 1, offset)
    tracker.ack(T, 0, 0)
    tracker.forget([(T, 0), ("never-assigned", 9)])
    assert tracker.committable() == {}  # a lost partition must never be committed
    assert tracker.outstanding() == 3
    assert tracker.position(T, 0) is None
    tracker.ack(T, 0, 1)  # late delivery report after the revoke
    assert tracker.ignored_acks == 1
    assert tracker.committable() == {}
    # Re-assigned later: consumption may restart from an earlier offset.
    tracker.track(T, 0, 0)
    tracker.ack(T, 0, 0)
    assert tracker.committable() == {(T, 0): 1}


def test_unknown_and_duplicate_acks_are_counted_and_ignored() -> None:
    tracker = tracked(0, 1)
    tracker.ack("unknown", 0, 0)
    tracker.ack(T, 0, 7)  # never tracked
    tracker.ack(T, 0, 0)
    tracker.ack(T, 0, 0)  # duplicate
    assert tracker.ignored_acks == 3
    assert tracker.committable() == {(T, 0): 1}
    assert tracker.outstanding() == 1


@pytest.mark.parametrize("offset", [4, 5])
def test_tracking_must_increase_per_partition(offset: int) -> None:
    tracker = tracked(3, 5)
    with pytest.raises(ValueError, match="must increase"):
        tracker.track(T, 0, offset)
    tracker.track(T, 1, 0)  # other partitions are unaffected


class ModelTracker:
    """The obvious O(n) reference: committable = first unacked tracked offset (or last + 1)."""

    def __init__(self) -> None:
        self.tracked: dict[int, list[int]] = {}
        self.acked: set[tuple[int, int]] = set()
        self.reported: dict[int, int] = {}

    def position(self, partition: int) -> int | None:
        position = None
        for offset in self.tracked.get(partition, []):
            if (partition, offset) not in self.acked:
                break
            position = offset + 1
        return position

    def committable(self) -> dict[int, int]:
        out = {}
        for partition in self.tracked:
            position = self.position(partition)
            if position is not None and self.reported.get(partition) != position:
                out[partition] = self.reported[partition] = position
        return out


@pytest.mark.parametrize("seed", range(25))
def test_randomized_against_reference_model(seed: int) -> None:
    rng = random.Random(seed)
    tracker, model = OffsetTracker(), ModelTracker()
    next_offset = {p: rng.randint(0, 1000) for p in range(3)}
    unacked: list[tuple[int, int]] = []
    committed: dict[int, int] = {}
    for _ in range(2000):
        action = rng.random()
        if action < 0.45:
            partition = rng.randrange(3)
            offset = next_offset[partition]
            next_offset[partition] += rng.choice([1, 1, 1, 2, 5])  # gaps
            tracker.track(T, partition, offset)
            model.tracked.setdefault(partition, []).append(offset)
            unacked.append((partition, offset))
        elif action < 0.9 and unacked:
            partition, offset = unacked.pop(rng.randrange(len(unacked)))
            tracker.ack(T, partition, offset)
            model.acked.add((partition, offset))
        else:
            got = tracker.committable()
            assert got == {(T, p): pos for p, pos in model.committable().items()}
            for (_, partition), position in got.items():
                assert position > committed.get(partition, -1), "commits only move forward"
                # Commit after acknowledgement: everything below the position was acked.
                assert all((partition, o) in model.acked for o in model.tracked[partition] if o < position)
                committed[partition] = position
            positions = {p: model.position(p) or 0 for p in model.tracked}
            unreleased = {
                p: sum(1 for o in offsets if o >= positions[p]) for p, offsets in model.tracked.items()
            }
            assert {p: tracker.outstanding(T, p) for p in unreleased} == unreleased
    assert tracker.ignored_acks == 0


def test_crash_duplicate_bound_is_the_pipeline_plus_two_commit_intervals_of_labelling() -> None:
    settings = WorkerSettings(max_window_messages=32, max_queued_windows=2, commit_interval_ms=100)

    def bound(s: WorkerSettings, rate: float, largest_window: int | None = None) -> int:
        return crash_duplicate_bound(s.sections.batching, s.sections.delivery, rate, largest_window)

    assert bound(settings, 500.0) == 3 * 32 + 2 * 50
    assert bound(settings, 10.0) == 3 * 32 + 2 * 32  # at least a window per interval
    assert bound(settings, 10.0, largest_window=1300) == 3 * 1300 + 2 * 1300  # GPU windows
    assert bound(settings.model_copy(update={"max_queued_windows": 4}), 500.0) == 5 * 32 + 100
    slow_commits = settings.model_copy(update={"commit_interval_ms": 1000})
    assert bound(slow_commits, 500.0) == 3 * 32 + 2 * 500


def test_the_readme_states_the_crash_bound_this_module_computes() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    assert "crash_duplicate_bound" in readme
    assert "(MAX_QUEUED_WINDOWS + 1) × MAX_WINDOW_MESSAGES + 2 × max(MAX_WINDOW_MESSAGES, R ×" in readme


def test_unacknowledged_counts_inputs_in_progress_and_drops_forgotten_partitions() -> None:
    tracker = OffsetTracker()
    for offset in range(3):
        tracker.track("t", 0, offset)
    tracker.track("t", 1, 7)
    tracker.ack("t", 0, 1)  # acked but not released (offset 0 still waits): no longer in progress
    assert tracker.unacknowledged() == 3 and tracker.outstanding() == 4
    tracker.forget([("t", 1)])  # lost: its input is dropped, not in progress
    assert tracker.unacknowledged() == 2
