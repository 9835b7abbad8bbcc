"""A review's label must not depend on the reviews batched with it: each served form of the tiny model (its
float32 ONNX export and its INT8 form as `quantize` makes it by default, as `make` derives the shipped
models' forms) labels held-out reviews alone and in mixed batches alike; ONNX Runtime's dynamic
quantization, which scales activations by each batch's range, does not — the check catches it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from worker.bench.batch_invariance import TOLERANCE, batch_invariance
from worker.model.classifier import TextClassifierBase
from worker.model.device import choose_device
from worker.model.loading import load_classifier
from worker.model.metadata import METADATA_FILE
from worker.training.evaluate import HELDOUT_FILE, read_heldout
from worker.training.quantize import quantize_model

TEXTS = 300


def served(directory: Path) -> TextClassifierBase:
    """The classifier `run`, `serve` and `predict` load for ``directory`` (default options)."""
    return load_classifier(str(directory), choose_device("cpu"))


@pytest.fixture(scope="module")
def reviews(tiny_model_dir: Path) -> list[str]:
    texts = [e.text for e in read_heldout(tiny_model_dir / HELDOUT_FILE)][:TEXTS]
    lengths = [len(text) for text in texts]
    assert len(texts) == TEXTS and max(lengths) > 4 * min(lengths)  # short ones get padded beside long ones
    return texts


@pytest.mark.parametrize("form", ["tiny_onnx_dir", "tiny_int8_dir"])
def test_a_served_form_labels_a_review_alone_as_in_mixed_batches(
    form: str, reviews: list[str], request: pytest.FixtureRequest
) -> None:
    result = batch_invariance(served(request.getfixturevalue(form)), reviews, batch_size=32, seed=1)
    assert result.texts == TEXTS
    assert result.label_changes == 0
    assert result.max_abs_diff <= TOLERANCE
    assert result.invariant


def test_the_served_int8_form_has_fixed_activation_scales(tiny_int8_dir: Path) -> None:
    record = json.loads((tiny_int8_dir / METADATA_FILE).read_text(encoding="utf-8"))["quantization"]
    assert record["method"] == "ort-static" and record["batch_invariant"] is True


def test_dynamic_quantization_is_caught_depending_on_batch_mates(
    tiny_onnx_dir: Path, reviews: list[str], tmp_path: Path
) -> None:
    quantize_model(tiny_onnx_dir, tmp_path / "dynamic", method="ort-dynamic", heldout_limit=50)
    record = json.loads((tmp_path / "dynamic" / METADATA_FILE).read_text(encoding="utf-8"))["quantization"]
    assert record["batch_invariant"] is False
    result = batch_invariance(served(tmp_path / "dynamic"), reviews, batch_size=32, seed=1)
    assert result.max_abs_diff > TOLERANCE and not result.invariant


class _ByLength(TextClassifierBase):
    """A stand-in whose p(positive) is a review's length over the longest in its batch (when ``scaled``,
    like dynamic quantization's per-batch range) or over 100 (a fixed scale)."""

    labels = ["negative", "positive"]

    def __init__(self, scaled: bool) -> None:
        self.scaled = scaled

    def predict_texts(self, texts: Sequence[str]) -> np.ndarray:
        scale = max(len(t) for t in texts) if self.scaled else 100
        p = np.array([len(t) / scale for t in texts], dtype=np.float32)
        return np.stack([1 - p, p], axis=1)


def test_the_check_compares_each_review_with_itself() -> None:
    texts = ["好" * n for n in (3, 90, 7, 40, 12, 66, 5, 25)]
    fixed = batch_invariance(_ByLength(scaled=False), texts, batch_size=3, seed=4)
    assert (fixed.label_changes, fixed.max_abs_diff, fixed.invariant) == (0, 0.0, True)
    scaled = batch_invariance(_ByLength(scaled=True), texts, batch_size=3, seed=4)
    assert scaled.label_changes > 0 and scaled.max_abs_diff > 0.5 and not scaled.invariant
    with pytest.raises(ValueError, match="at least 2"):
        batch_invariance(_ByLength(scaled=False), texts, batch_size=1)
