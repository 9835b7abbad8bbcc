"""The Labeller changes its models while it labels: a new primary takes over for later submissions while
earlier ones finish on the old one, which is then released; a change that cannot work is refused and the
old model keeps serving; a shadow labels beside the primary without changing its answers, its agreement
counted exactly, skipped when behind. Fake classifiers (pure logic): the real models are in
tests/integration/test_live_models.py."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from schemas.sentiment_result import ModelRef
from tests.labellers import reviews
from tests.polling import wait_until
from worker.inference.engine import EngineOptions
from worker.labelling.labeller import Labeller, ModelChangeRefused
from worker.labelling.loading import LoadedModel
from worker.metrics import create_metrics


class FakeThresholdModel:
    """'positive' when a text is longer than `threshold` characters (probability 0.9, else 0.2); calls wait
    for `gate`; records the threads that called it and their niceness. `fail_warm_up` fails every call."""

    call_overhead_tokens = None
    parallel_calls = 1

    def __init__(self, threshold: int, labels: Sequence[str] = ("negative", "positive")) -> None:
        self.labels = list(labels)
        self.threshold = threshold
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False
        self.niceness: set[int] = set()
        self.calls = 0

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [[1] * len(text) for text in texts]

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        self.gate.wait(10)
        self.calls += 1
        self.niceness.add(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        if self.fail:
            raise RuntimeError("this model cannot label")
        return np.array([[0.1, 0.9] if len(s) > self.threshold else [0.8, 0.2] for s in batch], np.float32)


def loaded(model: FakeThresholdModel, version: str) -> LoadedModel:
    return LoadedModel(model, ModelRef(name="fake", version=version), f"/models/{version}")


def positives(outputs: Sequence[object]) -> list[bool]:
    return [float(o[1]) > 0.5 for o in outputs]  # type: ignore[index]


TEXTS = ["好", "很好很好", "太差", "一般般吧", "非常非常满意", "差"]  # lengths 1, 4, 2, 4, 6, 1


@pytest.fixture
def labeller() -> Labeller:
    return Labeller(loaded(FakeThresholdModel(3), "v1"), EngineOptions(8, 4096))


def test_a_new_primary_labels_what_comes_after_and_the_old_one_finishes_what_it_took(
    labeller: Labeller,
) -> None:
    old = labeller.serving[0].classifier
    assert isinstance(old, FakeThresholdModel)
    released = threading.Event()
    labeller._on_released = released.set  # noqa: SLF001 - the hook the composition root passes
    with labeller:
        old.gate.clear()  # the old model holds its next batch
        before = labeller.label(reviews(TEXTS))  # submitted to the old model: label() returns once it is
        labeller.replace_primary(loaded(FakeThresholdModel(0), "v2"))  # everything positive
        after = labeller.label(reviews(TEXTS))
        assert after.result(10).model.version == "v2" and all(positives(after.result().outputs))
        assert not before.done()  # still on the old model, which waits
        old.gate.set()
        first = before.result(10)
        assert first.model.version == "v1"
        assert positives(first.outputs) == [len(t) > 3 for t in TEXTS]
        wait_until(released.is_set, 10, "the old model released")
        assert labeller.primary.version == "v2"


def test_a_change_that_cannot_work_is_refused_and_the_old_model_keeps_serving(labeller: Labeller) -> None:
    registry = CollectorRegistry()
    labeller.observe(create_metrics(registry))
    with labeller:
        with pytest.raises(ModelChangeRefused, match="same labels"):
            labeller.replace_primary(loaded(FakeThresholdModel(0, labels=["bad", "good"]), "v2"))
        broken = FakeThresholdModel(0)
        broken.fail = True
        with pytest.raises(ModelChangeRefused, match="warm-up"):
            labeller.replace_primary(loaded(broken, "v3"))
        with pytest.raises(ModelChangeRefused, match="warm-up"):
            labeller.set_shadow(loaded(broken, "v3"))
        answer = labeller.label(reviews(TEXTS)).result(10)
        assert answer.model.version == "v1" and positives(answer.outputs) == [len(t) > 3 for t in TEXTS]
        assert labeller.serving[1] is None
    refused = registry.get_sample_value
    assert refused("sentiment_model_changes_total", {"role": "primary", "outcome": "refused"}) == 2
    assert refused("sentiment_model_changes_total", {"role": "shadow", "outcome": "refused"}) == 1


def test_a_shadow_leaves_the_primary_s_answers_as_they_are_and_its_agreement_is_counted_exactly() -> None:
    registry = CollectorRegistry()
    labeller = Labeller(loaded(FakeThresholdModel(3), "v1"), EngineOptions(8, 4096), shadow_in_flight=100)
    labeller.observe(create_metrics(registry))
    shadow_model = FakeThresholdModel(1)  # positive above 1 character: disagrees on lengths 2 and 3
    with labeller:
        labeller.set_shadow(loaded(shadow_model, "s1"))
        answers = [labeller.label(reviews(TEXTS)) for _ in range(5)]
        for answer in answers:
            got = answer.result(10)
            assert got.model.version == "v1" and positives(got.outputs) == [len(t) > 3 for t in TEXTS]
            assert got.shadow is not None and got.shadow.result(10).model.version == "s1"
        wait_until(lambda: (labeller.agreement or Agreement0).groups_shadowed == 5, 10, "5 groups compared")
        figures = labeller.agreement
    assert figures is not None
    expected = {"negative->negative": 5 * 2, "negative->positive": 5 * 1, "positive->positive": 5 * 3}
    assert figures.confusion == expected and (figures.reviews, figures.agreeing) == (30, 25)
    assert figures.label_mix("shadow") == {"negative": 10, "positive": 20}
    sample = registry.get_sample_value
    for pair, count in expected.items():
        primary, shadow = pair.split("->")
        labels = {"primary_label": primary, "shadow_label": shadow, "shadow_version": "s1"}
        assert sample("sentiment_shadow_predictions_total", labels) == count
    assert sample("sentiment_shadow_agreeing_total", {"shadow_version": "s1"}) == 25  # the diagonal
    assert sample("sentiment_shadow_groups_total", {"outcome": "shadowed"}) == 5
    assert sample("sentiment_shadow_model_info", {"name": "fake", "version": "s1"}) == 1


def test_a_shadow_that_is_behind_skips_groups_and_runs_at_a_lower_priority() -> None:
    registry = CollectorRegistry()
    primary = FakeThresholdModel(3)
    labeller = Labeller(loaded(primary, "v1"), EngineOptions(8, 4096), shadow_in_flight=1, shadow_niceness=5)
    labeller.observe(create_metrics(registry))
    shadow_model = FakeThresholdModel(1)
    with labeller:
        labeller.set_shadow(loaded(shadow_model, "s1"))
        shadow_model.gate.clear()  # the shadow is stuck on its first group
        answers = [labeller.label(reviews(TEXTS)) for _ in range(4)]
        assert all(answer.result(10).model.version == "v1" for answer in answers)  # the primary is not held
        assert [answer.result().shadow is not None for answer in answers] == [True, False, False, False]
        shadow_model.gate.set()
        wait_until(lambda: (labeller.agreement or Agreement0).groups_shadowed == 1, 10, "the one shadowed")
        assert (labeller.agreement or Agreement0).groups_skipped == 3
        labeller.set_shadow(None)
        assert labeller.serving[1] is None and labeller.label(reviews(TEXTS)).result(10).shadow is None
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert primary.niceness == {own} and shadow_model.niceness == {own + 5}
    assert registry.get_sample_value("sentiment_shadow_groups_total", {"outcome": "skipped"}) == 3
    assert registry.get_sample_value("sentiment_shadow_model_info", {"name": "fake", "version": "s1"}) is None


class _NoFigures:
    groups_shadowed = 0
    groups_skipped = 0


Agreement0 = _NoFigures()
