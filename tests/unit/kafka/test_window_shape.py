"""The Kafka window's shape on fake devices: on a GPU a window grows to fill one batch of the token budget at
the mean review length, while a trickle still leaves within max_wait_ms; on CPU, or when set, it stays."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.unit.inference.test_batch_shape import gpu_settings
from worker.config import WorkerSettings
from worker.kafka.consume_window import ConsumeWindow
from worker.kafka.window_shape import WindowShape


def test_a_gpu_window_grows_to_fill_one_batch_at_the_mean_length(tmp_path: Path) -> None:
    shape = WindowShape.for_device(gpu_settings(tmp_path).sections.batching, on_gpu=True)
    assert shape == WindowShape(256, fills_token_budget=True)
    assert shape.cap(65_536, None) == 256  # nothing labelled yet: the configured window
    assert shape.cap(65_536, 50.0) == math.ceil(65_536 / 50)  # 1,311 reviews fill a batch
    assert shape.cap(4096, 50.0) == 256  # never below max_window_messages


def test_a_window_size_that_is_set_or_on_cpu_stays_as_it_is(tmp_path: Path) -> None:
    gpu_set = WindowShape.for_device(
        gpu_settings(tmp_path, max_window_messages=500).sections.batching, on_gpu=True
    )
    cpu = WindowShape.for_device(WorkerSettings().sections.batching, on_gpu=False)
    assert (gpu_set.cap(65_536, 50.0), cpu.cap(65_536, 50.0)) == (500, 256)


def test_a_trickle_leaves_a_gpu_sized_window_within_max_wait_ms() -> None:
    now = [100.0]
    window: ConsumeWindow[int] = ConsumeWindow(
        max_messages=256, max_wait_ms=50, max_bytes=1 << 26, clock=lambda: now[0]
    )
    window.max_messages = WindowShape(256, fills_token_budget=True).cap(65_536, 50.0)
    for item in range(3):
        window.add(item, 200)
    now[0] += 0.049
    assert not window.is_due() and window.remaining_wait_s() == pytest.approx(0.001)
    now[0] += 0.001
    assert window.is_due() and window.take() == [0, 1, 2]


def test_a_window_whose_cap_falls_below_what_it_holds_is_full() -> None:
    window: ConsumeWindow[int] = ConsumeWindow(max_messages=1311, max_wait_ms=50, max_bytes=1 << 26)
    for item in range(300):
        window.add(item, 200)
    assert not window.is_full()
    window.max_messages = 256  # the budget was lowered by an out-of-memory event
    assert window.is_full() and window.is_due()
    with pytest.raises(ValueError, match="max_messages must be >= 1"):
        window.max_messages = 0
