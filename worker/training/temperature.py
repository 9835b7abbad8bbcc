"""Temperature scaling (Guo et al., 2017): the classifier's logits divided by one number T, fitted on the dev
split by minimising the negative log-likelihood. T is folded into the classification layer's weights (W / T,
b / T), so every form derived from the weights (ONNX, INT8, Paddle Inference) inherits it with nothing to
configure, and the labels (the argmax) stay as they were: only the confidences move.

The dev split is rebuilt from the options recorded in ``metrics.json``; the rebuilt test split must equal the
directory's ``heldout.jsonl``, which proves it is the split the model was trained and selected on."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from worker.errors import OperationError
from worker.model.manifest import write_manifest
from worker.model.metadata import METADATA_FILE, ModelMetadata, find_weights, weights_version
from worker.model.weights import read_weights, save_weights
from worker.training.corpus import LabeledText, split
from worker.training.data import load_examples
from worker.training.evaluate import HELDOUT_FILE, expected_calibration_error, read_heldout
from worker.training.options import METRICS_FILE, MODEL_CARD_FILE, TrainOptions

CALIBRATION_KEY = "calibration"
"""The ``metrics.json`` record of a calibrated model (temperature and the before/after figures)."""
CLASSIFIER_KEYS = ("classifier.weight", "classifier.bias")
TEMPERATURE_RANGE = (0.05, 20.0)
LABELS_CHANGED_TOLERANCE = 0.001
"""Largest share of held-out labels that folding T into float16 weights may flip (rounding near a tie)."""

Predict = Callable[[Path, Sequence[str]], np.ndarray]
"""Probabilities of a model directory for texts, in input order (a fresh load each call)."""


class CalibrationError(OperationError):
    """The directory cannot be calibrated as it is; the message says why and what to do."""


def _log_probs(probs: np.ndarray) -> np.ndarray:
    return np.log(np.clip(probs.astype(np.float64), 1e-12, 1.0))


def rescaled(probs: np.ndarray, temperature: float) -> np.ndarray:
    """``softmax(log(probs) / T)``: the probabilities the model gives once its logits are divided by T."""
    scores = _log_probs(probs) / temperature
    scores -= scores.max(axis=1, keepdims=True)
    exp = np.exp(scores)
    return exp / exp.sum(axis=1, keepdims=True)


def negative_log_likelihood(probs: np.ndarray, labels: np.ndarray) -> float:
    """Mean −log p(gold label)."""
    return float(-_log_probs(probs)[np.arange(len(labels)), labels].mean())


def fit_temperature(probs: np.ndarray, labels: np.ndarray, iterations: int = 80) -> float:
    """The T in ``TEMPERATURE_RANGE`` that minimises the NLL of ``rescaled(probs, T)`` on ``labels``.

    The NLL is convex in 1/T (a log-sum-exp of terms linear in it, minus one), so a golden-section search
    over 1/T finds the minimum."""
    if len(labels) == 0:
        raise CalibrationError("no examples to fit a temperature on")
    low, high = 1.0 / TEMPERATURE_RANGE[1], 1.0 / TEMPERATURE_RANGE[0]
    ratio = (np.sqrt(5.0) - 1.0) / 2.0

    def loss(beta: float) -> float:
        return negative_log_likelihood(rescaled(probs, 1.0 / beta), labels)

    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(iterations):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = loss(d)
    return float(1.0 / ((a + b) / 2.0))


def fold_temperature(directory: Path, temperature: float) -> None:
    """Divide the classification layer's weight and bias by ``temperature`` in the directory's weights (in
    place, each tensor keeping its dtype)."""
    weights = find_weights(directory)
    if weights is None:
        raise CalibrationError(f"no model.safetensors in {directory}")
    state = read_weights(weights)
    missing = [key for key in CLASSIFIER_KEYS if key not in state]
    if missing:
        raise CalibrationError(f"{weights} has no {', '.join(missing)}: not a sequence classifier")
    for key in CLASSIFIER_KEYS:
        tensor = state[key]
        state[key] = (tensor.astype(np.float32) / np.float32(temperature)).astype(tensor.dtype)
    save_weights(state, directory)


def rebuild_dev_split(directory: Path, progress: Callable[[str], None]) -> list[LabeledText]:
    """The dev split the model in ``directory`` was selected on, rebuilt from its ``metrics.json`` options;
    raises CalibrationError unless the rebuilt test split equals its ``heldout.jsonl``."""
    metrics_path, heldout_path = directory / METRICS_FILE, directory / HELDOUT_FILE
    if not metrics_path.is_file() or not heldout_path.is_file():
        raise CalibrationError(
            f"{directory} has no {METRICS_FILE} and {HELDOUT_FILE}: calibrate a directory made by "
            "`sentiment-worker train`"
        )
    recorded = json.loads(metrics_path.read_text(encoding="utf-8")).get("hyper_parameters") or {}
    known = {f.name for f in fields(TrainOptions)}
    kept = {k: v for k, v in recorded.items() if k in known and k != "output_dir"}
    options = TrainOptions(output_dir=directory, **kept)
    examples, _ = load_examples(options, progress)
    parts = split(examples, options.data_split_seed, options.dev_fraction, options.test_fraction)
    heldout = read_heldout(heldout_path)
    if [(ex.text, ex.label_id) for ex in parts.test] != [(ex.text, ex.label_id) for ex in heldout]:
        raise CalibrationError(
            f"the split rebuilt from {metrics_path}'s options does not give {heldout_path} "
            "(another corpus version or data file?): the dev split cannot be recovered, retrain instead"
        )
    return list(parts.dev)


@dataclass(frozen=True)
class CalibrationReport:
    """The fitted temperature and what it changed, on the dev split (fitted on) and the held-out split."""

    temperature: float
    dev_reviews: int
    dev_nll_before: float
    dev_nll_after: float
    dev_ece_before: float
    dev_ece_after: float
    heldout_reviews: int
    heldout_ece_before: float
    heldout_ece_after: float
    heldout_accuracy_before: float
    heldout_accuracy_after: float
    labels_changed: int
    version: str

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}

    def summary(self) -> str:
        return (
            f"temperature {self.temperature:.3f} fitted on {self.dev_reviews} dev reviews (NLL "
            f"{self.dev_nll_before:.4f} → {self.dev_nll_after:.4f}, ECE {self.dev_ece_before:.4f} → "
            f"{self.dev_ece_after:.4f}); held-out ECE {self.heldout_ece_before:.4f} → "
            f"{self.heldout_ece_after:.4f}, accuracy {self.heldout_accuracy_before:.2%} → "
            f"{self.heldout_accuracy_after:.2%} ({self.labels_changed} of {self.heldout_reviews} labels "
            "changed)"
        )


def calibrate(directory: Path, predict: Predict, progress: Callable[[str], None]) -> CalibrationReport:
    """Fit T on the dev split, fold it into ``directory``'s weights and record it (metadata version,
    ``metrics.json``, the model card). Refuses a directory already calibrated."""
    metrics_path = directory / METRICS_FILE
    metrics = json.loads(metrics_path.read_text(encoding="utf-8")) if metrics_path.is_file() else {}
    if CALIBRATION_KEY in metrics:
        raise CalibrationError(
            f"{directory} is already calibrated (temperature {metrics[CALIBRATION_KEY]['temperature']}); "
            "calibrate a model once, after `train`"
        )
    dev = rebuild_dev_split(directory, progress)
    heldout = read_heldout(directory / HELDOUT_FILE)
    dev_labels = np.array([ex.label_id for ex in dev])
    test_labels = np.array([ex.label_id for ex in heldout])
    progress(f"dev {len(dev)} reviews, held-out {len(heldout)}: labelling with the model as it is")
    texts = [ex.text for ex in dev] + [ex.text for ex in heldout]  # one model load per state of the weights
    before = predict(directory, texts)
    dev_before, test_before = before[: len(dev)], before[len(dev) :]
    temperature = fit_temperature(dev_before, dev_labels)
    progress(f"temperature {temperature:.3f}: folding it into the classification layer")
    fold_temperature(directory, temperature)
    write_manifest(directory)  # the folded weights are this run's: the directory loads again
    after = predict(directory, texts)
    dev_after, test_after = after[: len(dev)], after[len(dev) :]
    changed = int((test_before.argmax(axis=1) != test_after.argmax(axis=1)).sum())
    if changed > LABELS_CHANGED_TOLERANCE * len(heldout):
        raise CalibrationError(
            f"folding the temperature changed {changed} of {len(heldout)} held-out labels: "
            f"the weights in {directory} are now inconsistent, restore them from the training run"
        )
    version = weights_version(directory)
    report = CalibrationReport(
        temperature=temperature,
        dev_reviews=len(dev),
        dev_nll_before=negative_log_likelihood(dev_before, dev_labels),
        dev_nll_after=negative_log_likelihood(dev_after, dev_labels),
        dev_ece_before=expected_calibration_error(dev_labels, dev_before),
        dev_ece_after=expected_calibration_error(dev_labels, dev_after),
        heldout_reviews=len(heldout),
        heldout_ece_before=expected_calibration_error(test_labels, test_before),
        heldout_ece_after=expected_calibration_error(test_labels, test_after),
        heldout_accuracy_before=float((test_before.argmax(axis=1) == test_labels).mean()),
        heldout_accuracy_after=float((test_after.argmax(axis=1) == test_labels).mean()),
        labels_changed=changed,
        version=version,
    )
    _record(directory, metrics, report)
    write_manifest(directory)
    return report


def _record(directory: Path, metrics: dict[str, Any], report: CalibrationReport) -> None:
    metadata_path = directory / METADATA_FILE
    if metadata_path.is_file():
        metadata = ModelMetadata.read(metadata_path)
        training = {**metadata.training, "temperature": round(report.temperature, 6)}
        replace(metadata, version=report.version, training=training).write(metadata_path)
    if metrics:
        metrics["test_ece"] = report.heldout_ece_after
        if isinstance(metrics.get("test"), dict):
            metrics["test"]["ece"] = report.heldout_ece_after
        metrics[CALIBRATION_KEY] = report.to_json()
        (directory / METRICS_FILE).write_text(
            json.dumps(metrics, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
        )
    card = directory / MODEL_CARD_FILE
    if card.is_file():
        text = re.sub(
            r"^(\| test \(held out\) \|[^|\n]*\|[^|\n]*\| )[0-9.]+( \|)$",
            lambda m: f"{m.group(1)}{report.heldout_ece_after:.4f}{m.group(2)}",
            card.read_text(encoding="utf-8"),
            flags=re.MULTILINE,
        )
        text = text.rstrip("\n") + (
            "\n\n## Calibration\n\n"
            f"Temperature scaling (`sentiment-worker calibrate`): the logits divided by T = "
            f"{report.temperature:.3f}, fitted on the {report.dev_reviews} dev reviews and folded into the "
            f"classification layer's weights, so every served form inherits it and no label changes. "
            f"Held-out ECE {report.heldout_ece_before:.4f} → {report.heldout_ece_after:.4f}; dev NLL "
            f"{report.dev_nll_before:.4f} → {report.dev_nll_after:.4f}.\n"
        )
        card.write_text(text, encoding="utf-8")
