"""The request admission over the engine: requests share token-budget batches, each gets its own outputs in
order; the queue is bounded; cancelled requests are dropped; closing answers what was accepted."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tests.labellers import reviews
from tests.polling import wait_until
from worker.http.admission import AdmissionClosed, Overloaded, RequestAdmission
from worker.inference.classifier import InferenceFailure
from worker.inference.engine import EngineOptions
from worker.labelling.labeller import Labeller
from worker.metrics import create_http_metrics


class LengthModel:
    """Probability of "positive" = len(text) / 100; records the batches it is given; can be held."""

    labels = ["negative", "positive"]
    call_overhead_tokens = None  # fewest batches
    parallel_calls = 1  # one call at a time

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set once a batch is inside the model
        self.tokenized: list[int] = []  # texts per tokenized window

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        self.tokenized.append(len(texts))
        return [[1] * len(t) for t in texts]

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        self.entered.set()
        self.gate.wait(10)
        if any(len(seq) == 99 for seq in batch):
            raise RuntimeError("this model cannot read 99 tokens")
        self.batches.append(len(batch))
        return np.array([[1 - len(s) / 100, len(s) / 100] for s in batch], dtype=np.float32)


@pytest.fixture
def model() -> LengthModel:
    return LengthModel()


@pytest.fixture
def make(model: LengthModel) -> Iterator[object]:
    made: list[tuple[RequestAdmission, Labeller]] = []

    def build(max_batch_size: int = 4, **kwargs: object) -> RequestAdmission:
        engine = Labeller.of(model, EngineOptions(max_batch_size, 4096)).start(warm_up=False)
        options: dict[str, object] = {"max_wait_ms": 200, "max_queued_texts": 100, **kwargs}
        admission = RequestAdmission(
            engine,
            http_metrics=create_http_metrics(CollectorRegistry()),
            **options,  # type: ignore[arg-type]
        )
        made.append((admission, engine))
        return admission

    yield build
    for admission, engine in made:
        admission.close(5)
        engine.close(5)


def positive(outputs: Sequence[object]) -> list[float]:
    return [round(float(o[1]), 2) for o in outputs]  # type: ignore[index]


def test_requests_waiting_for_a_busy_model_share_its_next_batches(make: object, model: LengthModel) -> None:
    admission = make(max_batch_size=16)  # type: ignore[operator]
    model.gate.clear()  # the model is busy with the first request
    first = admission.submit(reviews(["a"]))
    assert model.entered.wait(5)
    queued = admission.submit(reviews(["bb"]))  # the one batch kept ready behind the running one
    wait_until(
        lambda: model.tokenized[-1:] == [1] and len(model.tokenized) == 2,
        5,
        "model.tokenized[-1:] == [1] and len(model.tokenized) == 2",
        interval_s=0.005,
    )
    waiting = [admission.submit(reviews(["x" * n for n in range(k + 2, k + 5)])) for k in range(0, 12, 3)]
    model.gate.set()
    assert positive(first.result(5).outputs) == [0.01]
    assert positive(queued.result(5).outputs) == [0.02]
    for k, future in zip(range(0, 12, 3), waiting, strict=True):
        outcome = future.result(5)
        assert positive(outcome.outputs) == [(k + 2) / 100, (k + 3) / 100, (k + 4) / 100]  # its own, in order
        assert outcome.batch_texts == 12  # the four requests were labelled together
    assert model.batches == [1, 1, 12]


def test_the_planner_cuts_a_window_and_a_full_batch_is_queued_while_the_model_is_busy(
    make: object, model: LengthModel
) -> None:
    admission = make(max_batch_size=4)  # type: ignore[operator]
    model.gate.clear()
    first = admission.submit(reviews(["a"]))
    assert model.entered.wait(5)
    full = admission.submit(reviews(["x" * n for n in range(2, 12)]))  # 10 texts: more than a model batch
    wait_until(
        lambda: model.tokenized[-1:] == [10], 5, "model.tokenized[-1:] == [10]", interval_s=0.005
    )  # tokenized and queued before the model is free
    model.gate.set()
    assert len(first.result(5).outputs) == 1
    assert positive(full.result(5).outputs) == [n / 100 for n in range(2, 12)]
    assert model.batches[0] == 1 and sorted(model.batches[1:]) == [2, 4, 4]  # the planner cut the 10 texts


def test_the_queue_bound_refuses_with_retry_after(make: object, model: LengthModel) -> None:
    admission = make(max_queued_texts=5)  # type: ignore[operator]
    model.gate.clear()
    held = admission.submit(reviews(["a", "b", "c"]))
    with pytest.raises(Overloaded) as refused:
        admission.submit(reviews(["d", "e", "f"]))
    assert refused.value.retry_after_s == 1 and "3 texts" in str(refused.value)
    also = admission.submit(reviews(["d", "e"]))  # exactly at the bound
    model.gate.set()
    assert len(held.result(5).outputs) == 3 and len(also.result(5).outputs) == 2
    assert admission.queued_texts == 0


def test_a_failing_text_gets_its_failure_and_the_others_their_labels(make: object) -> None:
    admission = make()  # type: ignore[operator]
    outcome = admission.submit(reviews(["ok", "y" * 99, "fine"])).result(5)
    assert isinstance(outcome.outputs[1], InferenceFailure)
    assert outcome.outputs[1].kind.value == "inference_failed"
    assert positive([outcome.outputs[0], outcome.outputs[2]]) == [0.02, 0.04]


def test_a_cancelled_request_is_dropped_before_its_batch(make: object, model: LengthModel) -> None:
    admission = make()  # type: ignore[operator]
    model.gate.clear()
    admission.submit(reviews(["a"]))
    assert model.entered.wait(5)
    admission.submit(
        reviews(["e"])
    )  # kept ready behind the running batch: the next ones wait for a free lane
    wait_until(lambda: len(model.tokenized) == 2, 5, "len(model.tokenized) == 2", interval_s=0.005)
    dropped = admission.submit(reviews(["bb", "cc"]))
    kept = admission.submit(reviews(["ddd"]))
    assert dropped.cancel()
    model.gate.set()
    assert positive(kept.result(5).outputs) == [0.03]
    with pytest.raises(CancelledError):
        dropped.result(0)
    assert model.batches == [1, 1, 1] and admission.queued_texts == 0


def test_close_answers_the_accepted_and_refuses_the_new(make: object, model: LengthModel) -> None:
    admission = make()  # type: ignore[operator]
    model.gate.clear()
    accepted = [admission.submit(reviews(["t" * (i + 1)])) for i in range(5)]
    closer = threading.Thread(target=admission.close, args=(10,))
    closer.start()
    late = []
    deadline = time.monotonic() + 10
    while True:  # accepted until close() begins, refused from then on
        assert time.monotonic() < deadline, "close() never began refusing new texts"
        try:
            late.append(admission.submit(reviews(["late"])))
        except Overloaded:
            continue
        except AdmissionClosed:
            break
    model.gate.set()
    closer.join(10)
    assert [positive(f.result(0).outputs) for f in accepted] == [[0.01], [0.02], [0.03], [0.04], [0.05]]
    assert all(positive(f.result(0).outputs) == [0.04] for f in late)
