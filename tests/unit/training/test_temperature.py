"""Temperature scaling: the fit (pure numbers), and `calibrate` on the session's tiny trained model (real
Paddle weights, folded in place; labels unchanged, confidences moved, everything recorded)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from worker.cli import main
from worker.model.metadata import METADATA_FILE, weights_version
from worker.training.evaluate import HELDOUT_FILE, expected_calibration_error, read_heldout
from worker.training.options import METRICS_FILE, MODEL_CARD_FILE
from worker.training.temperature import (
    CALIBRATION_KEY,
    CalibrationError,
    fit_temperature,
    negative_log_likelihood,
    rebuild_dev_split,
    rescaled,
)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_fit_recovers_the_temperature_of_an_overconfident_model() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 2.0, size=(20_000, 2))
    labels = np.array([rng.choice(2, p=p) for p in _softmax(logits)])  # calibrated at T = 1
    overconfident = _softmax(logits * 2.5)
    temperature = fit_temperature(overconfident, labels)
    assert temperature == pytest.approx(2.5, rel=0.06)
    fixed = rescaled(overconfident, temperature)
    assert negative_log_likelihood(fixed, labels) < negative_log_likelihood(overconfident, labels) - 0.05
    assert expected_calibration_error(labels, fixed) < 0.3 * expected_calibration_error(labels, overconfident)
    assert (fixed.argmax(axis=1) == overconfident.argmax(axis=1)).all()


def test_an_underconfident_model_gets_a_temperature_below_one() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(0.0, 2.0, size=(5_000, 2))
    labels = np.array([rng.choice(2, p=p) for p in _softmax(logits)])
    assert fit_temperature(_softmax(logits * 0.5), labels) == pytest.approx(0.5, rel=0.08)


def test_rescaled_at_one_is_the_identity_and_fit_needs_examples() -> None:
    probs = np.array([[0.9, 0.1], [0.3, 0.7]])
    assert np.allclose(rescaled(probs, 1.0), probs)
    with pytest.raises(CalibrationError, match="no examples"):
        fit_temperature(np.zeros((0, 2)), np.zeros(0, dtype=np.int64))


def test_the_dev_split_is_rebuilt_and_checked_against_the_heldout_file(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    dev = rebuild_dev_split(tiny_model_dir, lambda _: None)
    metrics = json.loads((tiny_model_dir / METRICS_FILE).read_text("utf-8"))
    assert len(dev) == metrics["split_sizes"]["dev"] > 0
    heldout = {ex.text for ex in read_heldout(tiny_model_dir / HELDOUT_FILE)}
    assert not heldout & {ex.text for ex in dev}

    altered = tmp_path / "altered"
    shutil.copytree(tiny_model_dir, altered)
    lines = (altered / HELDOUT_FILE).read_text("utf-8").splitlines(keepends=True)
    (altered / HELDOUT_FILE).write_text("".join(lines[1:]), "utf-8")
    with pytest.raises(CalibrationError, match="cannot be recovered"):
        rebuild_dev_split(altered, lambda _: None)


def test_calibrate_folds_the_temperature_keeps_the_labels_and_refuses_twice(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from worker.model.device import choose_device
    from worker.model.loading import load_classifier
    from worker.training.evaluate import predict_probs

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    texts = [ex.text for ex in read_heldout(model / HELDOUT_FILE)]
    before = predict_probs(load_classifier(str(model), choose_device("cpu")), texts, 32)[0]
    version_before = json.loads((model / METADATA_FILE).read_text("utf-8"))["version"]

    assert main(["calibrate", "--model", str(model), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"calibrated {model}" in out and "0 of" in out and "labels changed" in out

    metrics = json.loads((model / METRICS_FILE).read_text("utf-8"))
    record = metrics[CALIBRATION_KEY]
    temperature = record["temperature"]
    assert (
        abs(temperature - 1.0) > 0.1
    )  # a real rescaling (the tiny model: T ≈ 1.4), or the checks say nothing
    after = predict_probs(load_classifier(str(model), choose_device("cpu")), texts, 32)[0]
    assert (after.argmax(axis=1) == before.argmax(axis=1)).all()
    assert np.allclose(after, rescaled(before, temperature), atol=2e-3)  # T is in the weights
    assert record["dev_nll_after"] <= record["dev_nll_before"] + 1e-9
    assert record["heldout_accuracy_after"] == record["heldout_accuracy_before"]
    assert (
        metrics["test_ece"] == metrics["test"]["ece"] == pytest.approx(record["heldout_ece_after"], abs=1e-6)
    )
    meta = json.loads((model / METADATA_FILE).read_text("utf-8"))
    assert meta["version"] == weights_version(model) == record["version"] != version_before
    assert meta["training"]["temperature"] == pytest.approx(temperature, abs=1e-6)
    card = (model / MODEL_CARD_FILE).read_text("utf-8")
    assert "## Calibration" in card and f"T = {temperature:.3f}" in card
    assert f"{record['heldout_ece_after']:.4f} |" in card  # the metrics table's held-out ECE

    assert main(["calibrate", "--model", str(model), "--device", "cpu"]) == 1
    assert "already calibrated" in capsys.readouterr().err
    assert json.loads((model / METADATA_FILE).read_text("utf-8"))["version"] == meta["version"]


def test_calibrate_refuses_a_directory_not_made_by_train(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="made by `sentiment-worker train`"):
        rebuild_dev_split(tmp_path, lambda _: None)
