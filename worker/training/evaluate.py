"""Evaluate a classifier on labelled reviews: accuracy, macro-F1, per-class P/R, confusion, ECE, speed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from worker.training.corpus import LabeledText, load_labeled_file
from worker.training.speed import measure_backend_speed

HELDOUT_FILE = "heldout.jsonl"
ECE_BINS = 10
ECE_MARGIN = 0.02
"""The promotion gate's default: how much higher the candidate's calibration error may be."""


@dataclass(frozen=True)
class ClassMetrics:
    """Precision, recall and F1 of one label (0.0 when undefined) and its number of true examples."""

    precision: float
    recall: float
    f1: float
    support: int


@dataclass(frozen=True)
class ClassificationMetrics:
    """Quality of predictions against gold labels.

    ``confusion[i][j]`` counts examples of true label ``i`` predicted as ``j``. ``ece`` is the expected
    calibration error of the top-label confidence over ``ECE_BINS`` equal-width bins (0 = calibrated).
    """

    n: int
    accuracy: float
    macro_f1: float
    per_class: dict[str, ClassMetrics]
    confusion: list[list[int]]
    ece: float
    labels: list[str]


def classification_metrics(
    labels: np.ndarray, probs: np.ndarray, names: Sequence[str], bins: int = ECE_BINS
) -> ClassificationMetrics:
    """Metrics of ``probs`` (float [n, k]) against integer ``labels`` [n]; ``names[i]`` names label ``i``."""
    labels = np.asarray(labels, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    k = len(names)
    if probs.shape != (len(labels), k):
        raise ValueError(f"probs shape {probs.shape} does not match {len(labels)} labels x {k} classes")
    preds = probs.argmax(axis=1) if len(labels) else np.zeros(0, dtype=np.int64)
    confusion = np.zeros((k, k), dtype=np.int64)
    np.add.at(confusion, (labels, preds), 1)
    per_class: dict[str, ClassMetrics] = {}
    for i, name in enumerate(names):
        tp = int(confusion[i, i])
        predicted, actual = int(confusion[:, i].sum()), int(confusion[i, :].sum())
        precision = tp / predicted if predicted else 0.0
        recall = tp / actual if actual else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class[name] = ClassMetrics(precision, recall, f1, actual)
    n = len(labels)
    return ClassificationMetrics(
        n=n,
        accuracy=float((preds == labels).mean()) if n else 0.0,
        macro_f1=float(np.mean([c.f1 for c in per_class.values()])) if k else 0.0,
        per_class=per_class,
        confusion=confusion.tolist(),
        ece=expected_calibration_error(labels, probs, bins),
        labels=list(names),
    )


def expected_calibration_error(labels: np.ndarray, probs: np.ndarray, bins: int = ECE_BINS) -> float:
    """Σ_b |B_b|/n · |accuracy(B_b) − mean confidence(B_b)| over equal-width bins of the top probability."""
    n = len(labels)
    if n == 0:
        return 0.0
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    # bin b holds confidences in (b/bins, (b+1)/bins]; a confidence of exactly 0 goes to bin 0
    index = np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)
    total = 0.0
    for b in range(bins):
        members = index == b
        count = int(members.sum())
        if count:
            total += count / n * abs(float(correct[members].mean()) - float(confidence[members].mean()))
    return total


@dataclass(frozen=True)
class Throughput:
    """Dynamic-graph inference speed over the evaluation (tokenization included), plus the static probe.

    ``static`` holds ``measure_backend_speed``'s report (static vs dynamic ratio, efficiency) when the
    static backend module is available, else None and ``note`` says why.
    """

    sequences: int
    seconds: float
    sequences_per_second: float
    batch_size: int
    static: dict[str, Any] | None = None
    note: str = ""


@dataclass(frozen=True)
class EvaluationReport:
    """What ``evaluate`` prints: the model, the data, the metrics and the throughput."""

    model: str
    model_version: str
    data: str
    metrics: ClassificationMetrics
    throughput: Throughput
    extra: dict[str, Any] = field(default_factory=dict)
    model_ref: str = ""
    """What the model was named by (its directory or hub name), when it was not its `model` name."""

    def identity(self) -> str:
        """`sentiment-bge 2026.1 (models/default-int8)`: name, version and where it was loaded from."""
        where = f" ({self.model_ref})" if self.model_ref and self.model_ref != self.model else ""
        return f"{self.model} {self.model_version}{where}"

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly dict (floats rounded to 6 digits)."""
        return rounded(asdict(self))


def rounded(value: Any) -> Any:
    """`value` with every float in it (through dicts and lists) rounded to 6 digits."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def read_heldout(path: Path) -> list[LabeledText]:
    """The ``heldout.jsonl`` written by training (``{"id","text","label"}`` lines) as labelled texts."""
    return load_labeled_file(path)[0]


def write_heldout(path: Path, examples: Sequence[LabeledText], names: Sequence[str]) -> None:
    """One ``{"id": "heldout-00000", "text": ..., "label": "negative"|"positive"}`` line per example."""
    with path.open("w", encoding="utf-8") as fh:
        for i, ex in enumerate(examples):
            row = {"id": f"heldout-{i:05d}", "text": ex.text, "label": names[ex.label_id]}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def predict_probs(classifier: Any, texts: Sequence[str], batch_size: int) -> tuple[np.ndarray, float]:
    """Probabilities in input order (batches of similar length) and the wall seconds it took."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    probs = np.zeros((len(texts), len(classifier.labels)), dtype=np.float32)
    started = time.perf_counter()
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        probs[idx] = classifier.predict_texts([texts[i] for i in idx])
    return probs, time.perf_counter() - started


def static_speed_probe(
    model_dir: str, measure: Callable[[str], Any] = measure_backend_speed
) -> tuple[dict[str, Any] | None, str]:
    """``measure_backend_speed`` (static vs dynamic seq/s) of a model directory; (None, why) if it fails."""
    try:
        result = measure(model_dir)
    except Exception as exc:  # noqa: BLE001 - a failing probe must not hide the quality metrics
        return None, f"static speed probe failed: {type(exc).__name__}: {exc}; dynamic throughput only"
    if hasattr(result, "__dataclass_fields__"):
        result = asdict(result)
    return (dict(result) if isinstance(result, dict) else {"result": str(result)}), ""


def evaluate(
    classifier: Any,
    examples: Sequence[LabeledText],
    *,
    model_ref: str,
    data: str,
    batch_size: int = 32,
    static_probe: bool = True,
) -> EvaluationReport:
    """Classify ``examples`` with ``classifier`` (a SentimentClassifier) and measure quality and speed."""
    if not examples:
        raise ValueError("no examples to evaluate")
    texts = [ex.text for ex in examples]
    labels = np.array([ex.label_id for ex in examples], dtype=np.int64)
    if labels.max() >= len(classifier.labels):
        raise ValueError(f"label id {labels.max()} but the model has labels {classifier.labels}")
    probs, seconds = predict_probs(classifier, texts, batch_size)
    static, note = static_speed_probe(model_ref) if static_probe else (None, "static probe not requested")
    throughput = Throughput(
        sequences=len(texts),
        seconds=seconds,
        sequences_per_second=len(texts) / seconds if seconds > 0 else 0.0,
        batch_size=batch_size,
        static=static,
        note=note,
    )
    return EvaluationReport(
        model=classifier.name,
        model_version=classifier.version,
        data=data,
        metrics=classification_metrics(labels, probs, classifier.labels),
        throughput=throughput,
        model_ref=model_ref,
    )


def format_report(report: EvaluationReport) -> str:
    """Human-readable tables: overall metrics, per-class P/R/F1, confusion matrix, throughput."""
    m = report.metrics
    lines = [
        f"model {report.identity()} on {report.data}: {m.n} reviews",
        "",
        f"{'accuracy':<24}{m.accuracy:>10.4f}",
        f"{'macro-F1':<24}{m.macro_f1:>10.4f}",
        f"{'ECE (' + str(ECE_BINS) + ' bins)':<24}{m.ece:>10.4f}",
        "",
        f"{'label':<12}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}",
    ]
    for name, c in m.per_class.items():
        lines.append(f"{name:<12}{c.precision:>10.4f}{c.recall:>10.4f}{c.f1:>10.4f}{c.support:>10}")
    width = max(10, *(len(n) + 2 for n in m.labels))
    lines += [
        "",
        "confusion (rows: true, columns: predicted)",
        " " * 12 + "".join(f"{n:>{width}}" for n in m.labels),
    ]
    for name, row in zip(m.labels, m.confusion, strict=True):
        lines.append(f"{name:<12}" + "".join(f"{v:>{width}}" for v in row))
    t = report.throughput
    lines += [
        "",
        f"throughput (dynamic, batch {t.batch_size}, tokenization included): "
        f"{t.sequences_per_second:.1f} seq/s ({t.sequences} in {t.seconds:.2f} s)",
    ]
    if t.static:
        lines.append("static backend probe: " + ", ".join(f"{k}={_short(v)}" for k, v in t.static.items()))
    if t.note:
        lines.append(t.note)
    return "\n".join(lines)


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


@dataclass(frozen=True)
class Comparison:
    """A candidate against the model it would replace, on the same reviews: the promotion gate."""

    candidate: EvaluationReport
    incumbent: EvaluationReport
    margin: float
    """How much lower the candidate's accuracy and macro-F1 may be (absolute, e.g. 0.01 = one point)."""
    ece_margin: float = ECE_MARGIN
    """How much higher the candidate's expected calibration error may be (absolute)."""

    @property
    def regressions(self) -> list[str]:
        """What the candidate loses by more than the margins (empty: it may replace the incumbent)."""
        out = []
        for name in ("accuracy", "macro_f1"):
            new, old = getattr(self.candidate.metrics, name), getattr(self.incumbent.metrics, name)
            if new < old - self.margin:
                out.append(f"{name} {new:.4f} < {old:.4f} - {self.margin:g}")
        new_ece, old_ece = self.candidate.metrics.ece, self.incumbent.metrics.ece
        if new_ece > old_ece + self.ece_margin:
            out.append(
                f"ECE {new_ece:.4f} > {old_ece:.4f} + {self.ece_margin:g} (less calibrated: "
                "`sentiment-worker calibrate` it first)"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly dict: both reports, the margin and the verdict."""
        return {
            "candidate": self.candidate.to_json(),
            "incumbent": self.incumbent.to_json(),
            "margin": self.margin,
            "ece_margin": self.ece_margin,
            "regressions": self.regressions,
            "promote": not self.regressions,
        }


def format_comparison(comparison: Comparison) -> str:
    """Both models side by side on the same data, and the gate's verdict."""
    c, i = comparison.candidate, comparison.incumbent
    rows = [
        ("accuracy", c.metrics.accuracy, i.metrics.accuracy),
        ("macro-F1", c.metrics.macro_f1, i.metrics.macro_f1),
        ("ECE", c.metrics.ece, i.metrics.ece),
        ("seq/s (dynamic)", c.throughput.sequences_per_second, i.throughput.sequences_per_second),
    ]
    lines = [
        f"on {c.data}: {c.metrics.n} reviews",
        f"candidate: {c.identity()}",
        f"incumbent: {i.identity()}",
        f"{'':<18}{'candidate':>14}{'incumbent':>14}{'delta':>10}",
    ]
    for name, new, old in rows:
        digits = 1 if name.startswith("seq/s") else 4
        lines.append(f"{name:<18}{new:>14.{digits}f}{old:>14.{digits}f}{new - old:>+10.{digits}f}")
    verdict = (
        f"PROMOTE: accuracy and macro-F1 not worse by more than {comparison.margin:g}, ECE not higher by "
        f"more than {comparison.ece_margin:g}"
        if not comparison.regressions
        else "KEEP THE INCUMBENT: " + "; ".join(comparison.regressions)
    )
    return "\n".join([*lines, verdict])
