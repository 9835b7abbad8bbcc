"""Items submitted to the Labeller come back in submission order, never more in flight than the bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from schemas.review_input import Review
from tests.labellers import reviews
from worker.inference.engine import EngineOptions
from worker.labelling.in_order import InOrder
from worker.labelling.labeller import Labeller, Predictions


class FakeCountingClassifier:
    """Probability of "positive" = tokens / 1000 (one token per character); calls wait for `gate`."""

    labels = ["negative", "positive"]
    call_overhead_tokens = None
    parallel_calls = 2

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        if any(text == "bug" for text in texts):
            raise AssertionError("not a text problem: a bug")
        return [[1] * len(text) for text in texts]

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        self.gate.wait(10)
        time.sleep(0.001 * (50 - len(batch[0])) / 10)  # shorter texts take longer: finish out of order
        return np.array([[1 - len(s) / 1000, len(s) / 1000] for s in batch], dtype=np.float32)


def _lengths(labelled: Predictions) -> list[int]:
    return [round(float(o[1]) * 1000) for o in labelled.outputs]  # type: ignore[index]


@pytest.fixture
def fake_engine() -> Iterator[tuple[FakeCountingClassifier, Labeller]]:
    fake = FakeCountingClassifier()
    with Labeller.of(fake, EngineOptions(2, 4096)).start(warm_up=False) as labeller:
        yield fake, labeller
        fake.gate.set()


def _collect_all(in_order: InOrder[int], expected: int) -> list[tuple[int, Predictions]]:
    out: list[tuple[int, Predictions]] = []
    deadline = time.monotonic() + 10
    while len(out) < expected and time.monotonic() < deadline:
        out.extend(in_order.collect(timeout_s=0.1))
    return out


def test_results_come_back_in_submission_order_and_the_bound_holds(
    fake_engine: tuple[FakeCountingClassifier, Labeller],
) -> None:
    fake, engine = fake_engine
    in_order: InOrder[int] = InOrder(engine, capacity=2)
    fake.gate.clear()
    in_order.submit(1, reviews(["a" * 40]))
    in_order.submit(2, reviews(["a" * 2]))
    assert not in_order.has_room() and in_order.in_flight == 2
    with pytest.raises(RuntimeError, match="has_room"):
        in_order.submit(3, reviews(["a"]))
    assert in_order.collect() == []  # nothing labelled yet
    fake.gate.set()
    got = _collect_all(in_order, 2)
    assert [(item, _lengths(labelled)) for item, labelled in got] == [(1, [40]), (2, [2])]
    assert in_order.has_room() and in_order.in_flight == 0
    collected: list[int] = []
    for x in range(3, 30):
        while not in_order.has_room():
            collected.extend(item for item, _ in in_order.collect(timeout_s=0.05))
            assert in_order.in_flight <= 2
        in_order.submit(x, reviews(["字" * (40 - x)] * 3))
    collected.extend(item for item, _ in _collect_all(in_order, 27 - len(collected)))
    assert collected == list(range(3, 30))  # each exactly once, in order


def test_pipeline_yields_in_order_and_draws_items_no_further_ahead_than_its_room(
    fake_engine: tuple[FakeCountingClassifier, Labeller],
) -> None:
    _, engine = fake_engine
    drawn: list[int] = []
    in_order: InOrder[int] = InOrder(engine, capacity=2)

    def items() -> Iterator[tuple[int, list[Review]]]:
        for i in range(7):
            drawn.append(i)
            yield i, reviews(["字" * (10 - i)])

    out = []
    for item, labelled in in_order.pipeline(items()):
        out.append((item, _lengths(labelled)))
        assert len(drawn) - len(out) <= 2  # never more than the bound drawn ahead of the results
    assert out == [(i, [10 - i]) for i in range(7)] and in_order.in_flight == 0
    assert list(in_order.pipeline([])) == []


def test_a_text_the_engine_cannot_take_is_collected_as_its_own_failure_in_order(
    fake_engine: tuple[FakeCountingClassifier, Labeller],
) -> None:
    _, engine = fake_engine
    in_order: InOrder[int] = InOrder(engine, capacity=2)
    in_order.submit(1, reviews(["fine"]))
    assert [item for item, _ in _collect_all(in_order, 1)] == [1]
    in_order.submit(
        2, reviews(["bug"])
    )  # the tokenizer fails on this one text alone: its own failure, not a crash
    ((item, labelled),) = _collect_all(in_order, 1)
    assert item == 2 and "tokenizer" in labelled.outputs[0].reason  # type: ignore[union-attr]
