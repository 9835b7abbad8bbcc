"""The one builder of a result's label fields: argmax, rounding, ties, field order."""

from __future__ import annotations

import json

import numpy as np
import pytest

from schemas.http_api import TextSentiment
from worker.inference.label_fields import label_fields

LABELS = ["negative", "positive"]


def test_the_label_is_the_argmax_and_the_confidence_its_probability() -> None:
    fields = label_fields(np.array([0.25, 0.75], dtype=np.float32), LABELS)
    assert fields == {
        "label": "positive",
        "label_id": 1,
        "confidence": 0.75,
        "probabilities": {"negative": 0.25, "positive": 0.75},
    }
    assert list(fields) == ["label", "label_id", "confidence", "probabilities"]  # predict's column order
    assert type(fields["label_id"]) is int and type(fields["confidence"]) is float


def test_probabilities_and_confidence_are_rounded_to_6_decimals_after_the_choice() -> None:
    fields = label_fields(np.array([0.1234564, 0.8765436], dtype=np.float64), LABELS)
    assert fields["confidence"] == 0.876544
    assert fields["probabilities"] == {"negative": 0.123456, "positive": 0.876544}
    # Rounding never changes the choice: the argmax is taken on the unrounded values.
    close = label_fields(np.array([0.50000001, 0.49999999]), LABELS)
    assert close["label"] == "negative"
    assert close["probabilities"] == {"negative": 0.5, "positive": 0.5}


def test_a_tie_goes_to_the_first_tied_label() -> None:
    assert label_fields(np.array([0.5, 0.5]), LABELS)["label_id"] == 0
    three = ["a", "b", "c"]
    assert label_fields(np.array([0.2, 0.4, 0.4]), three)["label"] == "b"


def test_a_plain_list_of_probabilities_is_accepted() -> None:
    assert label_fields([0.9, 0.1], LABELS)["label"] == "negative"


def test_a_probability_per_label_is_required() -> None:
    with pytest.raises((IndexError, ValueError)):
        label_fields(np.array([0.2, 0.3, 0.5]), LABELS)
    with pytest.raises(ValueError):
        label_fields(np.array([0.2, 0.8]), [*LABELS, "neutral"])


def test_the_fields_serialize_as_the_http_answer_did() -> None:
    # float32 output of the model: the float() before round() gives the same JSON as before the refactor.
    probs = np.array([0.0123456789, 0.9876543211], dtype=np.float32)
    answer = TextSentiment(id="1", **label_fields(probs, LABELS))
    assert json.loads(answer.model_dump_json())["probabilities"] == {
        "negative": 0.012346,
        "positive": 0.987654,
    }
