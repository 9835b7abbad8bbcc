"""The engine with fake classifiers (pure logic: batching, order, failures, lanes, the queue's rules):
outputs in input order, failures split then isolated, out of memory lowers the budget, submissions gathered
and cut into shared batches, cancelled ones dropped, closing labels what was submitted."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError

import numpy as np
import pytest

from schemas.dead_letter import DeadLetterKind
from tests.polling import wait_until
from worker.inference.classifier import InferenceFailure
from worker.inference.engine import Engine, EngineClosed, EngineOptions, Labelled
from worker.inference.model_calls import GroupStats, TokenBudget, is_out_of_memory


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


def _length_of(output: object) -> int:
    return round(float(output[1]) * 1000)  # type: ignore[index]


def label(
    classifier: object, texts: Sequence[str], *, max_batch_size: int, max_batch_tokens: int
) -> Labelled:
    """One submission to a fresh engine, waited for."""
    with Engine(classifier, EngineOptions(max_batch_size, max_batch_tokens)).start(  # type: ignore[arg-type]
        warm_up=False
    ) as engine:
        return engine.submit(texts).result(10)


def test_outputs_follow_input_order_although_batches_group_by_length() -> None:
    rng = np.random.default_rng(7)
    texts = ["字" * int(n) for n in rng.integers(1, 120, size=200)]
    fake = FakeLengthClassifier()
    labelled = label(fake, texts, max_batch_size=16, max_batch_tokens=512)
    assert [_length_of(o) for o in labelled.outputs] == [len(t) + 2 for t in texts]  # input order
    assert sum(len(b) for b in fake.batches) == 200
    assert all(len(b) <= 16 and len(b) * max(b) <= 512 for b in fake.batches)
    assert labelled.stats.padding_efficiency > 0.85  # grouped by length: little padding
    assert labelled.stats.real_tokens == sum(len(t) + 2 for t in texts)


def test_a_failing_review_is_isolated_by_splitting_and_only_it_fails() -> None:
    texts = ["好评", "差评", "BOOM 坏数据", "还行", "不错"]
    labelled = label(FakeLengthClassifier(), texts, max_batch_size=8, max_batch_tokens=4096)
    outputs = labelled.outputs
    assert [i for i, o in enumerate(outputs) if isinstance(o, InferenceFailure)] == [2]
    failure = outputs[2]
    assert isinstance(failure, InferenceFailure)
    assert failure.kind == DeadLetterKind.INFERENCE_FAILED and "poisoned input" in failure.reason
    assert labelled.stats.splits >= 1
    assert [_length_of(o) for i, o in enumerate(outputs) if i != 2] == [4, 4, 4, 4]


class FakeTokenizerRefusing(FakeLengthClassifier):
    """Its tokenizer raises on any call holding a lone surrogate, as the real one does."""

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        if any("\ud800" in text for text in texts):
            raise TypeError(
                "TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]"
            )
        return super().token_ids(texts)


def test_a_text_the_tokenizer_refuses_fails_alone_and_its_batch_mates_are_labelled() -> None:
    fake = FakeTokenizerRefusing()
    with Engine(fake, EngineOptions(8, 4096)).start(warm_up=False) as engine:
        fake_gate = [engine.submit(["好评"]), engine.submit(["差\ud800评", "还行"]), engine.submit(["不错"])]
        results = [future.result(10) for future in fake_gate]
    bad = results[1].outputs[0]
    assert isinstance(bad, InferenceFailure) and bad.kind == DeadLetterKind.INFERENCE_FAILED
    assert "tokenizer" in bad.reason and "TypeError" in bad.reason
    assert _length_of(results[1].outputs[1]) == 4
    assert [_length_of(r.outputs[0]) for r in (results[0], results[2])] == [4, 4]


def test_out_of_memory_splits_the_batch_and_a_review_too_big_alone_is_dead_lettered() -> None:
    texts = ["短评" * 5] * 6 + ["长" * 300]
    fake = FakeLengthClassifier(oom_over_tokens=100)
    labelled = label(fake, texts, max_batch_size=8, max_batch_tokens=100_000)
    assert all(not isinstance(o, InferenceFailure) for o in labelled.outputs[:6])
    last = labelled.outputs[6]
    assert isinstance(last, InferenceFailure) and last.kind == DeadLetterKind.TOO_LONG_FOR_MEMORY
    assert labelled.stats.splits >= 2


def test_an_empty_submission_needs_no_model() -> None:
    fake = FakeLengthClassifier()
    assert label(fake, [], max_batch_size=4, max_batch_tokens=64).outputs == []
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


def test_token_budget_halves_below_the_batch_that_did_not_fit_and_never_rises() -> None:
    budget = TokenBudget(8192, floor_tokens=64)
    budget.on_out_of_memory(6000)
    assert (budget.current, budget.lowered) == (3000, 1)
    budget.on_out_of_memory(8000)  # an older, larger batch: no change
    assert (budget.current, budget.lowered) == (3000, 1)
    budget.on_out_of_memory(100)
    assert budget.current == 64  # never below the floor


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
    alone = label(one_lane, texts, max_batch_size=16, max_batch_tokens=512)
    two_lanes = FakeSideBySideClassifier(2)
    both = label(two_lanes, texts, max_batch_size=16, max_batch_tokens=512)
    assert (one_lane.most_at_once, two_lanes.most_at_once) == (1, 2)
    failures = [i for i, o in enumerate(both.outputs) if isinstance(o, InferenceFailure)]
    assert failures == [17] == [i for i, o in enumerate(alone.outputs) if isinstance(o, InferenceFailure)]
    kept = [i for i in range(len(texts)) if i != 17]
    assert [_length_of(both.outputs[i]) for i in kept] == [len(texts[i]) + 2 for i in kept]
    # the same batches, counted once each, whichever lane ran them
    assert sorted(map(sorted, two_lanes.batches)) == sorted(map(sorted, one_lane.batches))
    stats, alone_stats = both.stats, alone.stats
    assert (stats.padded_tokens, stats.splits, len(stats.batches)) == (
        alone_stats.padded_tokens,
        alone_stats.splits,
        len(alone_stats.batches),
    )


def test_out_of_memory_in_a_lane_lowers_the_shared_budget_once_per_event() -> None:
    texts = ["短评" * 5] * 12 + ["长" * 300] * 2
    fake = FakeSideBySideClassifier(2, delay_s=0.001, oom_over_tokens=100)
    engine = Engine(fake, EngineOptions(4, 100_000)).start(warm_up=False)
    with engine:
        labelled = engine.submit(texts).result(10)
    outputs = labelled.outputs
    assert all(not isinstance(o, InferenceFailure) for o in outputs[:12])
    assert all(
        isinstance(o, InferenceFailure) and o.kind == DeadLetterKind.TOO_LONG_FOR_MEMORY for o in outputs[12:]
    )
    assert labelled.stats.out_of_memory_events == len([b for b in fake.batches if len(b) * max(b) > 100])
    assert engine.token_budget < 100_000 and engine.out_of_memory_lowerings >= 1


def test_the_lanes_are_the_engine_s_own_as_many_as_the_classifier_allows_and_end_with_it() -> None:
    def lane_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("width-three-lane")}

    fake = FakeSideBySideClassifier(3, delay_s=0.001)
    engine = Engine(fake, EngineOptions(4, 4096), name="width-three").start(warm_up=False)
    with engine:
        for window in (2, 9, 40, 6, 100, 17):  # windows of 1, 2, 3 and more batches
            texts = ["字" * (5 + i % 90) for i in range(window)]
            outputs = engine.submit(texts).result(10).outputs
            assert [_length_of(o) for o in outputs] == [len(t) + 2 for t in texts]
        assert 2 <= len(lane_threads()) <= 3
    wait_until(lambda: not lane_threads(), 5, "not lane_threads()", interval_s=0.005)


def test_windows_submitted_while_the_lanes_are_busy_queue_behind_them_in_submission_order() -> None:
    fake = FakeSideBySideClassifier(2, delay_s=0.005)
    short = ["字" * (1 + i % 40) for i in range(60)]  # every sequence <= 42 tokens
    long = ["长" * (200 + i % 40) for i in range(30)]  # every sequence >= 202 tokens
    with Engine(fake, EngineOptions(8, 2048)).start(warm_up=False) as engine:
        first = engine.submit(short)
        second = engine.submit(long)
        expected_batches = 8 + 4  # 60 / 8 and 30 / 8, rounded up (the token budget does not bind)
        wait_until(
            lambda: len(fake.batches) == expected_batches,
            5,
            "len(fake.batches) == expected_batches",
            interval_s=0.005,
        )  # nobody has waited for them yet
        short_labelled, long_labelled = first.result(10), second.result(10)
    assert fake.most_at_once == 2
    window_of_each_call = ["long" if max(b) > 100 else "short" for b in fake.batches]
    # the lanes take calls in the order queued: the second window's calls start after the first's
    assert window_of_each_call[:7] == ["short"] * 7 and window_of_each_call.count("long") == 4
    assert [_length_of(o) for o in short_labelled.outputs] == [len(t) + 2 for t in short]
    assert [_length_of(o) for o in long_labelled.outputs] == [len(t) + 2 for t in long]


class FakeGatedClassifier(FakeLengthClassifier):
    """FakeLengthClassifier whose calls wait for `gate`; counts the texts of each tokenizer call."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.tokenized: list[int] = []

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        self.tokenized.append(len(texts))
        return super().token_ids(texts)

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        self.entered.set()
        self.gate.wait(10)
        return super().predict_ids(batch)


@pytest.fixture
def gated() -> Iterator[tuple[FakeGatedClassifier, Engine]]:
    fake = FakeGatedClassifier()
    engine = Engine(fake, EngineOptions(16, 4096)).start(warm_up=False)
    yield fake, engine
    fake.gate.set()
    engine.close(5)


def test_gathering_submissions_share_one_tokenizer_call_and_batch_when_a_lane_frees(
    gated: tuple[FakeGatedClassifier, Engine],
) -> None:
    fake, engine = gated
    fake.gate.clear()
    running = engine.submit(["a"], gather_ms=1000)  # an idle model: a lone request waits <= 1 s for company
    assert fake.entered.wait(5)  # ... but not past max_batch_size or a free lane: here 1 s passes first
    ready = engine.submit(
        ["bb"], gather_ms=1000
    )  # kept ready behind the running batch (lane busy, none queued)
    wait_until(lambda: fake.tokenized == [1, 1], 5, "fake.tokenized == [1, 1]", interval_s=0.005)
    gathered = [engine.submit(["x" * n], gather_ms=1000) for n in range(3, 9)]
    time.sleep(0.05)
    assert fake.tokenized == [1, 1]  # the lane has a batch waiting: these six gather
    fake.gate.set()
    results = [f.result(5) for f in (running, ready, *gathered)]
    assert [_length_of(r.outputs[0]) for r in results] == [n + 2 for n in range(1, 9)]
    assert fake.tokenized == [1, 1, 6] and fake.batches[-1] == [5, 6, 7, 8, 9, 10]
    assert all(r.stats is results[2].stats for r in results[2:])  # labelled as one group


def test_an_idle_model_waits_at_most_gather_ms_and_not_at_all_for_a_full_batch(
    gated: tuple[FakeGatedClassifier, Engine],
) -> None:
    fake, engine = gated
    started = time.monotonic()
    alone = engine.submit(["好评"], gather_ms=150).result(5)
    waited = time.monotonic() - started
    assert alone.queued_seconds >= 0.14 and waited >= 0.14  # it waited for company, then went alone
    full = engine.submit(["好评"] * 16, gather_ms=5000).result(5)  # max_batch_size texts: due at once
    assert full.queued_seconds < 1.0
    eager = engine.submit(["好评"]).result(5)  # gather_ms None: gathered by its caller, due at once
    assert eager.queued_seconds < 1.0


def test_a_cancelled_submission_is_dropped_before_the_model_sees_it(
    gated: tuple[FakeGatedClassifier, Engine],
) -> None:
    fake, engine = gated
    fake.gate.clear()
    engine.submit(["a"], gather_ms=0)
    assert fake.entered.wait(5)
    engine.submit(["b"], gather_ms=0)  # the batch kept ready
    wait_until(lambda: len(fake.tokenized) == 2, 5, "len(fake.tokenized) == 2", interval_s=0.005)
    dropped = engine.submit(["cc", "dd"], gather_ms=0)
    kept = engine.submit(["eee"], gather_ms=0)
    assert dropped.cancel()
    fake.gate.set()
    assert _length_of(kept.result(5).outputs[0]) == 5
    with pytest.raises(CancelledError):
        dropped.result(0)
    assert sorted(len(b) for b in fake.batches) == [1, 1, 1]


def test_close_labels_everything_submitted_and_refuses_what_comes_after(
    gated: tuple[FakeGatedClassifier, Engine],
) -> None:
    fake, engine = gated
    fake.gate.clear()
    submitted = [engine.submit(["字" * (i + 1)], gather_ms=10_000) for i in range(5)]
    closer = threading.Thread(target=engine.close, args=(10,))
    closer.start()
    wait_until(lambda: engine._closing, 5, "engine._closing", interval_s=0.005)  # noqa: SLF001 - close() has begun
    with pytest.raises(EngineClosed):
        engine.submit(["late"])
    fake.gate.set()
    closer.join(10)
    assert [_length_of(f.result(0).outputs[0]) for f in submitted] == [3, 4, 5, 6, 7]


def test_each_group_is_reported_once_with_its_measurements() -> None:
    reports: list[tuple[GroupStats, int]] = []
    fake = FakeLengthClassifier()
    engine = Engine(fake, EngineOptions(4, 4096), on_labelled=lambda s, b: reports.append((s, b)))
    with engine.start(warm_up=False):
        labelled = [engine.submit(["好评" * (i + 1)] * 6).result(5) for i in range(3)]
    assert [stats for stats, _ in reports] == [r.stats for r in labelled]
    assert all(budget == 4096 for _, budget in reports)
    assert [sum(b.size for b in stats.batches) for stats, _ in reports] == [6, 6, 6]


def test_stalled_s_grows_only_while_the_lanes_work_without_finishing(
    gated: tuple[FakeGatedClassifier, Engine],
) -> None:
    fake, engine = gated
    assert engine.stalled_s() == 0.0  # nothing to do is not stalled
    fake.gate.clear()
    future = engine.submit(["好评"])
    assert fake.entered.wait(5)
    time.sleep(0.1)
    assert engine.stalled_s() >= 0.09
    fake.gate.set()
    future.result(5)
    wait_until(lambda: engine.stalled_s() == 0.0, 5, "engine.stalled_s() == 0.0", interval_s=0.005)


def test_submitting_before_start_or_after_close_is_refused() -> None:
    engine = Engine(FakeLengthClassifier(), EngineOptions(4, 64))
    with pytest.raises(EngineClosed, match="not started"):
        engine.submit(["好"])
    engine.start(warm_up=False).close()
    with pytest.raises(EngineClosed, match="stopping"):
        engine.submit(["好"])


def test_the_warm_up_labels_before_start_returns_and_is_not_reported() -> None:
    reports: list[GroupStats] = []
    fake = FakeLengthClassifier()
    engine = Engine(fake, EngineOptions(4, 4096), on_labelled=lambda s, _b: reports.append(s))
    with engine.start():
        assert len(fake.batches) == 1 and reports == []  # the model ran once; the metrics did not see it
        engine.submit(["好评"]).result(5)
    assert len(reports) == 1


def test_a_model_call_stuck_past_close_does_not_hold_the_process() -> None:
    fake = FakeGatedClassifier()
    fake.gate.clear()  # the model never answers
    engine = Engine(fake, EngineOptions(4, 4096), name="stuck").start(warm_up=False)
    stuck = engine.submit(["好评"])
    assert fake.entered.wait(5)
    started = time.monotonic()
    engine.close(timeout_s=0.3)
    assert time.monotonic() - started < 5  # bounded by the timeout, not by the model
    lanes = [t for t in threading.enumerate() if t.name.startswith("stuck-lane")]
    assert lanes and all(t.daemon for t in lanes)  # the interpreter does not wait for them at exit
    assert not stuck.done()
    fake.gate.set()


def test_labelling_seconds_is_wall_time_not_the_sum_of_batches_run_side_by_side() -> None:
    """Issue 40: `timing.inference_ms` (then the batches' summed seconds) could exceed `total_ms`."""
    fake = FakeSideBySideClassifier(2, delay_s=0.02)
    with Engine(fake, EngineOptions(4, 4096)).start(warm_up=False) as engine:
        started = time.perf_counter()
        labelled = engine.submit(["字" * (1 + i % 30) for i in range(32)]).result(10)
        elapsed = time.perf_counter() - started
    summed = sum(batch.seconds for batch in labelled.stats.batches)
    assert fake.most_at_once == 2 and summed > labelled.labelling_seconds  # side by side: the sum overstates
    assert 0 < labelled.queued_seconds + labelled.labelling_seconds <= elapsed
