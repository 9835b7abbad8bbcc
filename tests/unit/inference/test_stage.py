"""The inference thread stage: FIFO results, a hard bound, failures surface on the caller's thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from worker.inference.labelling import TokenBudget
from worker.inference.stage import InferenceStage


def _on_the_stage(work: Callable[[int], int]) -> Callable[[int], Callable[[], int]]:
    """A `begin` that does nothing on the submitting thread: `work` runs on the stage's thread."""
    return lambda x: lambda: work(x)


def _collect_all(stage: InferenceStage[int, int], expected: int, timeout_s: float = 10.0) -> list[int]:
    out: list[int] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expected and time.monotonic() < deadline:
        out.extend(stage.collect(timeout_s=0.1))
    return out


def test_results_come_back_in_submission_order_and_the_bound_holds() -> None:
    gate = threading.Event()

    def work(x: int) -> int:
        gate.wait(5)
        return x * 10

    stage: InferenceStage[int, int] = InferenceStage(_on_the_stage(work), max_queued_windows=2)
    try:
        stage.submit(1)
        stage.submit(2)
        assert not stage.has_room() and stage.in_flight == 2
        with pytest.raises(RuntimeError, match="full"):
            stage.submit(3)
        gate.set()
        assert _collect_all(stage, 2) == [10, 20]
        assert stage.has_room() and stage.in_flight == 0
        got: list[int] = []
        for x in range(3, 9):
            while not stage.has_room():
                got.extend(stage.collect(timeout_s=0.05))
                assert stage.in_flight <= 2
            stage.submit(x)
        got.extend(_collect_all(stage, 6 - len(got)))
        assert got == [30, 40, 50, 60, 70, 80]
    finally:
        stage.close()


def test_every_result_is_collected_exactly_once_in_order() -> None:
    stage: InferenceStage[int, int] = InferenceStage(_on_the_stage(lambda x: x + 1), max_queued_windows=3)
    got: list[int] = []
    try:
        for x in range(50):
            while not stage.has_room():
                got.extend(stage.collect(timeout_s=0.05))
            stage.submit(x)
        got.extend(_collect_all(stage, 50 - len(got)))
    finally:
        stage.close()
    assert got == list(range(1, 51))


def test_a_failure_in_the_thread_is_raised_by_collect() -> None:
    def work(x: int) -> int:
        raise ValueError(f"model exploded on {x}")

    stage: InferenceStage[int, int] = InferenceStage(_on_the_stage(work), max_queued_windows=1)
    try:
        stage.submit(7)
        with pytest.raises(RuntimeError, match="model exploded on 7"):
            _collect_all(stage, 1)
    finally:
        stage.close()


def test_token_budget_halves_below_the_batch_that_did_not_fit_and_never_rises() -> None:
    budget = TokenBudget(8192, floor_tokens=64)
    budget.on_out_of_memory(6000)
    assert (budget.current, budget.lowered) == (3000, 1)
    budget.on_out_of_memory(8000)  # an older, larger batch: no change
    assert (budget.current, budget.lowered) == (3000, 1)
    budget.on_out_of_memory(100)
    assert budget.current == 64  # never below the floor


def test_pipeline_yields_in_order_and_draws_items_no_further_ahead_than_its_room() -> None:
    drawn: list[int] = []
    stage: InferenceStage[int, int] = InferenceStage(_on_the_stage(lambda x: x * 10), max_queued_windows=2)

    def items() -> Iterator[int]:
        for i in range(7):
            drawn.append(i)
            yield i

    try:
        out = []
        for result in stage.pipeline(items()):
            out.append(result)
            assert len(drawn) - len(out) <= 2  # never more than the queue's room drawn ahead of the results
        assert out == [0, 10, 20, 30, 40, 50, 60] and stage.in_flight == 0
        assert list(stage.pipeline([])) == []
    finally:
        stage.close()


def test_begin_runs_on_the_submitting_thread_its_finish_on_the_stage_and_results_keep_order() -> None:
    begun_on: list[str] = []
    finished_on: list[str] = []

    def begin(x: int) -> Callable[[], int]:
        begun_on.append(threading.current_thread().name)
        if x == 3:
            raise ValueError("could not plan 3")

        def finish() -> int:
            finished_on.append(threading.current_thread().name)
            return x * 10

        return finish

    stage: InferenceStage[int, int] = InferenceStage(begin, max_queued_windows=2, name="the-stage")
    try:
        for x in (1, 2):
            stage.submit(x)
        assert _collect_all(stage, 2) == [10, 20]
        stage.submit(3)
        with pytest.raises(RuntimeError, match="could not plan 3"):
            _collect_all(stage, 1)  # a begin that failed is collected in its place, like a failed finish
    finally:
        stage.close()
    assert begun_on == [threading.current_thread().name] * 3
    assert finished_on == ["the-stage"] * 2
