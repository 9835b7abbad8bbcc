"""`model-table` on the tiny model: the held-out metrics equal `evaluate`'s, the parameter count equals the
weights', and a model with another held-out split is flagged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from worker.bench.model_table import format_model_table, model_table
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, load_classifier
from worker.model.manifest import write_manifest
from worker.model.metadata import find_weights
from worker.model.weights import read_weights
from worker.training.evaluate import HELDOUT_FILE, classification_metrics, predict_probs, read_heldout
from worker.training.quantize import quantize_model


def test_one_row_per_model_on_the_same_heldout_reviews(tiny_model_dir: Path, tmp_path: Path) -> None:
    # A second model directory whose own held-out split is another one (its first 50 reviews dropped).
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    lines = (tiny_model_dir / HELDOUT_FILE).read_text(encoding="utf-8").splitlines(keepends=True)
    (other / HELDOUT_FILE).write_text("".join(lines[50:]), encoding="utf-8")
    write_manifest(other)

    rows = model_table([tiny_model_dir, other], texts=128, repeats=2)

    examples = read_heldout(tiny_model_dir / HELDOUT_FILE)
    dygraph = load_classifier(
        str(tiny_model_dir), choose_device("cpu"), options=InferenceOptions(backend="dynamic")
    )
    probs, _ = predict_probs(dygraph, [e.text for e in examples], 32)
    expected = classification_metrics(np.array([e.label_id for e in examples]), probs, dygraph.labels)
    first, second = rows
    assert first.heldout_texts == second.heldout_texts == len(examples)
    assert first.accuracy == pytest.approx(expected.accuracy, abs=1.5 / len(examples))  # static ≈ dygraph
    assert first.macro_f1 == pytest.approx(expected.macro_f1, abs=0.002)
    assert first.ece == pytest.approx(expected.ece, abs=0.002)
    assert (first.accuracy, first.macro_f1) == (
        second.accuracy,
        second.macro_f1,
    )  # same weights, same reviews
    assert not first.own_heldout_differs and second.own_heldout_differs

    weights = find_weights(tiny_model_dir)
    assert weights is not None
    state = read_weights(weights)
    assert first.parameters == sum(int(np.prod(t.shape)) for t in state.values())
    config = json.loads((tiny_model_dir / "config.json").read_text(encoding="utf-8"))
    assert first.shape == f"{config['num_hidden_layers']} × {config['hidden_size']}"
    assert len(first.passes_reviews_per_s) == 2 and first.reviews_per_s > 0

    table = format_model_table(rows)
    assert sum(line.startswith("| ") for line in table.splitlines()) == 3  # the header and two rows
    assert "(own held-out split differs)" in table and f"{first.accuracy:.2%}" in table


def test_a_served_int8_form_is_measured_as_it_is_served(tiny_model_dir: Path, tiny_int8_dir: Path) -> None:
    trained, served = model_table([tiny_model_dir, tiny_int8_dir], texts=64, repeats=1)

    examples = read_heldout(tiny_model_dir / HELDOUT_FILE)
    int8 = load_classifier(str(tiny_int8_dir), choose_device("cpu"), options=InferenceOptions(backend="onnx"))
    probs, _ = predict_probs(int8, [e.text for e in examples], 32)
    expected = classification_metrics(np.array([e.label_id for e in examples]), probs, int8.labels)
    assert trained.served_as == "Paddle Inference fp32"
    assert served.served_as == "ONNX Runtime INT8 (ort-static)"
    assert served.accuracy == pytest.approx(expected.accuracy, abs=1.5 / len(examples))
    assert served.weights_dtype == "int8" and served.parameters == trained.parameters
    assert served.weights_mb == pytest.approx((tiny_int8_dir / "model.onnx").stat().st_size / 1e6)
    assert "| ONNX Runtime INT8 (ort-static) |" in format_model_table([trained, served])
    record = json.loads((tiny_int8_dir / "sentiment_model.json").read_text(encoding="utf-8"))["quantization"]
    assert served.agrees_with_fp32 == record["accuracy"]["agreement"] and trained.agrees_with_fp32 is None
    assert served.batch_invariant and trained.batch_invariant and served.batch_label_changes == 0


def test_a_form_whose_labels_depend_on_batch_mates_says_so(
    tiny_model_dir: Path, tiny_onnx_dir: Path, tmp_path: Path
) -> None:
    dynamic = tmp_path / "dynamic"
    quantize_model(tiny_onnx_dir, dynamic, method="ort-dynamic", heldout_limit=50)
    (row,) = model_table([dynamic], heldout=tiny_model_dir / HELDOUT_FILE, texts=32, repeats=1)
    assert not row.batch_invariant and row.batch_max_abs_diff > 1e-4
    assert row.served_as == "ONNX Runtime INT8 (ort-dynamic)"
    line = format_model_table([row]).splitlines()[2]
    assert f"**no**: {row.batch_label_changes} labels change, Δp up to {row.batch_max_abs_diff:.3f}" in line
