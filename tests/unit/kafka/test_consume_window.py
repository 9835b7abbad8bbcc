"""The consume window: when a window of consumed messages is due (full by messages or bytes, or waited
max_wait_ms since its first message)."""

from __future__ import annotations

import pytest

from worker.kafka.consume_window import ConsumeWindow


class FakeClock:
    """A manually advanced monotonic clock, returning seconds; kept in whole ms to avoid float drift."""

    def __init__(self, start_ms: int = 1_000_000) -> None:
        self.now_ms = start_ms

    def __call__(self) -> float:
        return self.now_ms / 1000.0

    def advance_ms(self, ms: int) -> None:
        self.now_ms += ms


def make_window(clock: FakeClock, **overrides: int) -> ConsumeWindow[str]:
    bounds = {"max_messages": 3, "max_wait_ms": 50, "max_bytes": 100} | overrides
    return ConsumeWindow(clock=clock, **bounds)


def test_empty_window_is_never_due() -> None:
    clock = FakeClock()
    window = make_window(clock)
    clock.advance_ms(10_000)
    assert not window.is_due()
    assert not window.is_full()
    assert len(window) == 0
    assert window.remaining_wait_s() == pytest.approx(0.05)
    assert window.take() == []


def test_wait_is_measured_from_the_first_item() -> None:
    clock = FakeClock()
    window = make_window(clock)
    clock.advance_ms(1000)  # idle time before the first item does not count
    window.add("a", 1)
    assert not window.is_due()
    assert window.remaining_wait_s() == pytest.approx(0.05)
    clock.advance_ms(30)
    window.add("b", 1)  # later items do not restart the clock
    assert window.remaining_wait_s() == pytest.approx(0.02)
    clock.advance_ms(19)
    assert not window.is_due()
    clock.advance_ms(1)
    assert window.is_due()
    assert window.remaining_wait_s() == 0.0
    clock.advance_ms(100)
    assert window.remaining_wait_s() == 0.0


def test_full_by_messages() -> None:
    clock = FakeClock()
    window = make_window(clock)
    for item in ("a", "b"):
        window.add(item, 1)
    assert not window.is_due()
    assert window.fits(1)
    window.add("c", 1)
    assert window.is_full() and window.is_due()
    assert window.remaining_wait_s() == 0.0
    assert not window.fits(1)


def test_full_by_bytes() -> None:
    clock = FakeClock()
    window = make_window(clock, max_messages=100)
    window.add("a", 60)
    assert window.fits(40)
    assert not window.fits(41)
    window.add("b", 40)
    assert window.held_bytes == 100
    assert window.is_full() and window.is_due()


def test_single_oversized_item_fits_an_empty_window_and_fills_it() -> None:
    window = make_window(FakeClock())
    assert window.fits(10_000)
    window.add("huge", 10_000)
    assert window.is_full()


def test_take_returns_insertion_order_and_resets() -> None:
    clock = FakeClock()
    window = make_window(clock, max_messages=10)
    for i, item in enumerate(["x", "y", "z"]):
        window.add(item, i + 1)
    clock.advance_ms(60)
    assert window.is_due()
    assert window.take() == ["x", "y", "z"]
    assert len(window) == 0 and window.held_bytes == 0
    assert not window.is_due()
    # The next window's wait starts with its own first item.
    window.add("w", 1)
    assert window.remaining_wait_s() == pytest.approx(0.05)
    assert not window.is_due()


@pytest.mark.parametrize("bound", ["max_messages", "max_bytes"])
def test_a_bound_of_one_is_valid_and_one_item_fills_the_window(bound: str) -> None:
    window = make_window(FakeClock(), **{bound: 1})
    assert window.fits(1)
    window.add("a", 1)
    assert window.is_full() and window.is_due()
    assert not window.fits(1)


def test_an_item_of_zero_bytes_is_accepted() -> None:
    # The Kafka path counts value bytes: a null or empty value is 0, and must not stop the consume loop.
    window = make_window(FakeClock())
    window.add("tombstone", 0)
    assert len(window) == 1 and window.held_bytes == 0
    assert not window.is_full()


def test_a_window_overfilled_past_max_messages_stays_full_and_fits_nothing() -> None:
    # `add` does not enforce the bounds; a caller that adds past them still sees a full, due window.
    window = make_window(FakeClock(), max_messages=2)
    for item in ("a", "b", "c"):
        window.add(item, 1)
    assert len(window) == 3
    assert window.is_full() and window.is_due()
    assert window.remaining_wait_s() == 0.0
    assert not window.fits(0)


def test_zero_wait_is_due_as_soon_as_non_empty() -> None:
    window = make_window(FakeClock(), max_wait_ms=0)
    window.add("a", 1)
    assert window.is_due()


@pytest.mark.parametrize("overrides", [{"max_messages": 0}, {"max_bytes": 0}, {"max_wait_ms": -1}])
def test_window_rejects_invalid_bounds(overrides: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        make_window(FakeClock(), **overrides)


def test_window_rejects_negative_sizes() -> None:
    with pytest.raises(ValueError):
        make_window(FakeClock()).add("a", -1)
