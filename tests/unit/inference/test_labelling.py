"""The inference stage with a fake classifier: order restored, failures split then dead-lettered."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from schemas.dead_letter import DeadLetterKind
from worker.inference.labelling import (
    InferenceFailure,
    TokenBudget,
    begin_label_ids,
    is_out_of_memory,
    label_texts,
)


class FakeLengthClassifier:
    """Tokens = one per character + 2; 'probability positive' encodes the text length so outputs can be
    matched to inputs. Texts containing 'BOOM' make any batch holding them fail; batches over
    `oom_over_tokens` padded tokens raise an out-of-memory error."""

    labels = ["negative", "positive"]
    call_overhead_tokens = None  # fewest batches
    parallel_calls = 1  # one call at a time

    def __init__(self, oom_over_tokens: int | None = None) -> None:
        self.oom_over_tokens = oom_over_tokens
        self.batches: list[list[int]] = []
        self.poisoned: set[int] = set()

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        ids = []
        for text in texts:
            row = [1] + [ord(c) % 1000 + 10 for c in text] + [2]
            if "BOOM" in text:
                row[1] = -1
            ids.append(row)
        return ids

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        self.batches.append([len(row) for row in batch])
        padded = len(batch) * max(len(row) for row in batch)
        if self.oom_over_tokens is not None and padded > self.oom_over_tokens:
            raise RuntimeError("ResourceExhaustedError: Out of memory error on GPU 0")
        if any(row[1] == -1 for row in batch if len(row) > 1):
            raise ValueError("poisoned input")
        p = np.array([min(0.999, len(row) / 1000.0) for row in batch], dtype=np.float32)
        return np.stack([1 - p, p], axis=1)


def _length_of(output: np.ndarray) -> int:
    return round(float(output[1]) * 1000)


def test_outputs_follow_input_order_although_batches_group_by_length() -> None:
    rng = np.random.default_rng(7)
    texts = ["字" * int(n) for n in rng.integers(1, 120, size=200)]
    fake = FakeLengthClassifier()
    outputs, stats = label_texts(fake, texts, max_batch_size=16, max_batch_tokens=512)
    assert [_length_of(o) for o in outputs] == [len(t) + 2 for t in texts]  # input order
    assert sum(len(b) for b in fake.batches) == 200
    assert all(len(b) <= 16 and len(b) * max(b) <= 512 for b in fake.batches)
    assert stats.padding_efficiency > 0.85  # grouped by length: little padding
    assert stats.real_tokens == sum(len(t) + 2 for t in texts)


def test_a_failing_review_is_isolated_by_splitting_and_only_it_fails() -> None:
    texts = ["好评", "差评", "BOOM 坏数据", "还行", "不错"]
    fake = FakeLengthClassifier()
    outputs, stats = label_texts(fake, texts, max_batch_size=8, max_batch_tokens=4096)
    failures = [i for i, o in enumerate(outputs) if isinstance(o, InferenceFailure)]
    assert failures == [2]
    failure = outputs[2]
    assert isinstance(failure, InferenceFailure)
    assert failure.kind == DeadLetterKind.INFERENCE_FAILED and "poisoned input" in failure.reason
    assert stats.splits >= 1
    assert [_length_of(o) for i, o in enumerate(outputs) if i != 2] == [4, 4, 4, 4]  # type: ignore[arg-type]


def test_out_of_memory_splits_the_batch_and_a_review_too_big_alone_is_dead_lettered() -> None:
    texts = ["短评" * 5] * 6 + ["长" * 300]
    fake = FakeLengthClassifier(oom_over_tokens=100)
    outputs, stats = label_texts(fake, texts, max_batch_size=8, max_batch_tokens=100_000)
    assert all(not isinstance(o, InferenceFailure) for o in outputs[:6])
    last = outputs[6]
    assert isinstance(last, InferenceFailure) and last.kind == DeadLetterKind.TOO_LONG_FOR_MEMORY
    assert stats.splits >= 2


def test_empty_window_needs_no_model() -> None:
    fake = FakeLengthClassifier()
    assert label_texts(fake, [], max_batch_size=4, max_batch_tokens=64)[0] == []
    assert fake.batches == []


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (MemoryError(), True),
        (RuntimeError("(ResourceExhausted) Out of memory error on GPU 0"), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.0 GiB"), True),
        (ValueError("shape mismatch"), False),
    ],
)
def test_out_of_memory_is_recognised(exc: BaseException, expected: bool) -> None:
    assert is_out_of_memory(exc) is expected


class FakeSideBySideClassifier(FakeLengthClassifier):
    """FakeLengthClassifier that takes `parallel_calls` calls at once, each lasting `delay_s`, and records
    how many ran at the same time."""

    def __init__(
        self, parallel_calls: int, delay_s: float = 0.01, oom_over_tokens: int | None = None
    ) -> None:
        super().__init__(oom_over_tokens)
        self.parallel_calls = parallel_calls  # type: ignore[misc]
        self.delay_s = delay_s
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            time.sleep(self.delay_s)
            with self._lock:
                return super().predict_ids(batch)
        finally:
            with self._lock:
                self.running -= 1


def test_batches_run_side_by_side_as_the_classifier_allows_and_outputs_keep_input_order() -> None:
    rng = np.random.default_rng(11)
    texts = ["字" * int(n) for n in rng.integers(1, 120, size=200)]
    texts[17] = "BOOM 坏数据"
    one_lane = FakeSideBySideClassifier(1, delay_s=0.0)
    alone, alone_stats = label_texts(one_lane, texts, max_batch_size=16, max_batch_tokens=512)
    two_lanes = FakeSideBySideClassifier(2)
    outputs, stats = label_texts(two_lanes, texts, max_batch_size=16, max_batch_tokens=512)
    assert (one_lane.most_at_once, two_lanes.most_at_once) == (1, 2)
    failures = [i for i, o in enumerate(outputs) if isinstance(o, InferenceFailure)]
    assert failures == [17] == [i for i, o in enumerate(alone) if isinstance(o, InferenceFailure)]
    kept = [i for i in range(len(texts)) if i != 17]
    assert [_length_of(outputs[i]) for i in kept] == [len(texts[i]) + 2 for i in kept]  # type: ignore[arg-type]
    # the same batches, counted once each, whichever lane ran them
    assert sorted(map(sorted, two_lanes.batches)) == sorted(map(sorted, one_lane.batches))
    assert (stats.padded_tokens, stats.splits, len(stats.batches)) == (
        alone_stats.padded_tokens,
        alone_stats.splits,
        len(alone_stats.batches),
    )


def test_out_of_memory_in_a_lane_lowers_the_shared_budget_once_per_event() -> None:
    texts = ["短评" * 5] * 12 + ["长" * 300] * 2
    fake = FakeSideBySideClassifier(2, delay_s=0.001, oom_over_tokens=100)
    outputs, stats = label_texts(fake, texts, max_batch_size=4, max_batch_tokens=100_000)
    assert all(not isinstance(o, InferenceFailure) for o in outputs[:12])
    assert all(
        isinstance(o, InferenceFailure) and o.kind == DeadLetterKind.TOO_LONG_FOR_MEMORY for o in outputs[12:]
    )
    assert stats.out_of_memory_events == len([b for b in fake.batches if len(b) * max(b) > 100])


def test_lanes_are_one_pool_per_classifier_width_whatever_a_window_s_batch_count() -> None:
    def lane_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("model-lane")}

    before = lane_threads()
    fake = FakeSideBySideClassifier(3, delay_s=0.001)
    for window in (2, 9, 40, 6, 100, 17):  # windows of 1, 2, 3 and more batches
        texts = ["字" * (5 + i % 90) for i in range(window)]
        outputs, _ = label_texts(fake, texts, max_batch_size=4, max_batch_tokens=4096)
        assert [_length_of(o) for o in outputs] == [len(t) + 2 for t in texts]  # type: ignore[arg-type]
    added = lane_threads() - before
    assert 2 <= len(added) <= 3 and all(t.name.startswith("model-lane-3_") for t in added)


def _wait_until(condition: object, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.005)
    return False


def test_begun_windows_run_on_the_lanes_before_anyone_waits_and_in_the_order_they_were_begun() -> None:
    fake = FakeSideBySideClassifier(2, delay_s=0.005)
    short = ["字" * (1 + i % 40) for i in range(60)]  # every sequence <= 42 tokens
    long = ["长" * (200 + i % 40) for i in range(30)]  # every sequence >= 202 tokens
    budget = TokenBudget(2048)
    finish_short = begin_label_ids(fake, fake.token_ids(short), max_batch_size=8, budget=budget)
    finish_long = begin_label_ids(fake, fake.token_ids(long), max_batch_size=8, budget=budget)
    expected_batches = 8 + 4  # 60 / 8 and 30 / 8, rounded up (the token budget does not bind)
    assert _wait_until(lambda: len(fake.batches) == expected_batches)  # nobody has waited for them yet
    assert fake.most_at_once == 2
    window_of_each_call = ["long" if max(b) > 100 else "short" for b in fake.batches]
    # the lanes take calls in the order queued: the second window's first call starts only when all of the
    # first window's have started, so at least 7 of the 8 have finished before any of the second's
    assert window_of_each_call[:7] == ["short"] * 7 and window_of_each_call.count("long") == 4
    outputs, stats = finish_short()
    assert [_length_of(o) for o in outputs] == [len(t) + 2 for t in short]  # type: ignore[arg-type]
    assert stats.real_tokens == sum(len(t) + 2 for t in short) and len(stats.batches) == 8
    outputs, stats = finish_long()
    assert [_length_of(o) for o in outputs] == [len(t) + 2 for t in long]  # type: ignore[arg-type]
    assert len(stats.batches) == 4


def test_a_classifier_without_lanes_runs_a_begun_window_only_when_its_result_is_asked_for() -> None:
    fake = FakeLengthClassifier()
    texts = ["好评" * (1 + i % 7) for i in range(20)] + ["BOOM 坏数据"]
    finish = begin_label_ids(fake, fake.token_ids(texts), max_batch_size=4, budget=TokenBudget(4096))
    time.sleep(0.05)
    assert fake.batches == []  # nothing ran on the caller's thread (a GPU model runs on the inference thread)
    outputs, _ = finish()
    assert fake.batches and isinstance(outputs[-1], InferenceFailure)
    assert [_length_of(o) for o in outputs[:-1]] == [len(t) + 2 for t in texts[:-1]]  # type: ignore[arg-type]
