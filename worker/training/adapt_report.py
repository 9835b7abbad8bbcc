"""The report and the gate of an `adapt` run: base against adapted on the user's held-out reviews and on the
corpus held-out, with paired bootstrap intervals, the reviews whose label changed, and the verdict.

Paired bootstrap: the same resampled reviews score both models, so the interval of the difference reflects
what the two disagree on, not the noise both share (Koehn 2004). Seeded: the same predictions give the same
report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from worker.model.classifier import DEFAULT_LABELS
from worker.training.corpus import LabeledText
from worker.training.evaluate import classification_metrics, rounded

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 20261206
CORPUS_ACCURACY_MARGIN = 0.005
"""The gate: the corpus held-out accuracy may fall by at most this (half a point)."""
ECE_MARGIN = 0.02
"""The gate: the calibration error on either held-out set may rise by at most this."""
CHANGED_EXAMPLES = 10
USER, CORPUS = "user_heldout", "corpus_heldout"


@dataclass(frozen=True)
class Interval:
    """A 95 % percentile interval."""

    low: float
    high: float


@dataclass(frozen=True)
class SetReport:
    """One held-out set: both models' figures, the paired differences and their intervals."""

    reviews: int
    base: dict[str, Any]
    adapted: dict[str, Any]
    accuracy_delta: float
    accuracy_delta_interval: Interval
    macro_f1_delta: float
    macro_f1_delta_interval: Interval
    ece_delta: float
    base_accuracy_interval: Interval
    adapted_accuracy_interval: Interval


def _figures(labels: np.ndarray, probs: np.ndarray) -> dict[str, Any]:
    m = classification_metrics(labels, probs, DEFAULT_LABELS)
    return {
        "accuracy": m.accuracy,
        "macro_f1": m.macro_f1,
        "ece": m.ece,
        "per_class": {name: asdict(c) for name, c in m.per_class.items()},
    }


def _macro_f1(labels: np.ndarray, preds: np.ndarray) -> np.ndarray:
    """Macro-F1 of each row of `preds` [r, n] against `labels` [r, n] (binary), vectorised."""
    scores = []
    for c in (0, 1):
        tp = ((preds == c) & (labels == c)).sum(axis=1)
        predicted, actual = (preds == c).sum(axis=1), (labels == c).sum(axis=1)
        denom = predicted + actual
        scores.append(np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0))
    return np.mean(scores, axis=0)


def _interval(values: np.ndarray) -> Interval:
    low, high = np.percentile(values, [2.5, 97.5])
    return Interval(float(low), float(high))


def compare(
    labels: np.ndarray,
    base_probs: np.ndarray,
    adapted_probs: np.ndarray,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> SetReport:
    """Both models on one held-out set, with paired bootstrap intervals over `resamples` seeded resamples."""
    labels = np.asarray(labels, dtype=np.int64)
    base, adapted = _figures(labels, base_probs), _figures(labels, adapted_probs)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(labels), size=(resamples, len(labels)))
    gold = labels[idx]
    base_pred, adapted_pred = base_probs.argmax(axis=1)[idx], adapted_probs.argmax(axis=1)[idx]
    base_acc, adapted_acc = (base_pred == gold).mean(axis=1), (adapted_pred == gold).mean(axis=1)
    f1_delta = _macro_f1(gold, adapted_pred) - _macro_f1(gold, base_pred)
    return SetReport(
        reviews=len(labels),
        base=base,
        adapted=adapted,
        accuracy_delta=adapted["accuracy"] - base["accuracy"],
        accuracy_delta_interval=_interval(adapted_acc - base_acc),
        macro_f1_delta=adapted["macro_f1"] - base["macro_f1"],
        macro_f1_delta_interval=_interval(f1_delta),
        ece_delta=adapted["ece"] - base["ece"],
        base_accuracy_interval=_interval(base_acc),
        adapted_accuracy_interval=_interval(adapted_acc),
    )


def gate_reasons(sets: dict[str, SetReport]) -> list[str]:
    """Why the adapted model must not be promoted (empty: it may)."""
    reasons = []
    corpus, user = sets[CORPUS], sets[USER]
    if corpus.accuracy_delta < -CORPUS_ACCURACY_MARGIN:
        reasons.append(
            f"forgetting: corpus held-out accuracy fell {-100 * corpus.accuracy_delta:.2f} points "
            f"({corpus.base['accuracy']:.4f} → {corpus.adapted['accuracy']:.4f}; at most "
            f"{100 * CORPUS_ACCURACY_MARGIN:g} allowed)"
        )
    for name, report in sets.items():
        if report.ece_delta > ECE_MARGIN:
            reasons.append(
                f"calibration: ECE on the {name.replace('_heldout', '')} held-out rose "
                f"{report.ece_delta:.4f} "
                f"({report.base['ece']:.4f} → {report.adapted['ece']:.4f}; at most {ECE_MARGIN:g} allowed)"
            )
    low = user.accuracy_delta_interval.low
    if low <= 0.0:
        reasons.append(
            f"no measurable gain: the user held-out accuracy changed {100 * user.accuracy_delta:+.2f} "
            f"points, 95 % interval [{100 * low:+.2f}, {100 * user.accuracy_delta_interval.high:+.2f}] "
            "includes 0"
        )
    return reasons


@dataclass(frozen=True)
class ChangedLabel:
    """A held-out review the adapted model labels otherwise than the base."""

    set: str
    text: str
    gold: str
    base: str
    adapted: str
    base_p_positive: float
    adapted_p_positive: float


def changed_labels(
    named: dict[str, tuple[Sequence[LabeledText], np.ndarray, np.ndarray]], limit: int = CHANGED_EXAMPLES
) -> tuple[list[ChangedLabel], dict[str, dict[str, int]]]:
    """Up to `limit` reviews whose label changed (user set first, fixes before breaks), and per set how
    many changed: fixed (now right), broken (now wrong)."""
    examples: list[ChangedLabel] = []
    counts: dict[str, dict[str, int]] = {}
    for name, (reviews, base, adapted) in named.items():
        b, a = base.argmax(axis=1), adapted.argmax(axis=1)
        gold = np.array([ex.label_id for ex in reviews])
        changed = np.flatnonzero(b != a)
        fixed = [int(i) for i in changed if a[i] == gold[i]]
        broken = [int(i) for i in changed if a[i] != gold[i]]
        counts[name] = {"changed": len(changed), "fixed": len(fixed), "broken": len(broken)}
        for i in fixed[: max(0, limit // 2)] + broken[: max(0, limit // 4)]:
            examples.append(
                ChangedLabel(
                    name,
                    reviews[i].text,
                    DEFAULT_LABELS[gold[i]],
                    DEFAULT_LABELS[b[i]],
                    DEFAULT_LABELS[a[i]],
                    round(float(base[i, 1]), 4),
                    round(float(adapted[i, 1]), 4),
                )  # fmt: skip
            )
    return examples[:limit], counts


@dataclass(frozen=True)
class AdaptReport:
    """What report.json holds."""

    sets: dict[str, SetReport]
    promotable: bool
    reasons: list[str]
    forced: bool
    changed: list[ChangedLabel]
    changed_counts: dict[str, dict[str, int]]
    sizes: dict[str, int]
    temperature: float
    training: dict[str, Any] = field(default_factory=dict)
    bootstrap: dict[str, int] = field(
        default_factory=lambda: {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED}
    )

    def to_json(self) -> dict[str, Any]:
        return rounded(asdict(self))


def table(report: AdaptReport) -> str:
    """The short human table: both sets, base vs adapted, the deltas with their intervals, the verdict."""
    lines = [
        f"{'held-out set':<16}{'n':>6}{'':>2}{'base acc':>9}{'adapted':>9}{'Δ points (95 % CI)':>26}"
        f"{'macro-F1':>16}{'ECE':>16}"
    ]
    for name, s in report.sets.items():
        ci = s.accuracy_delta_interval
        delta = f"{100 * s.accuracy_delta:+.2f} [{100 * ci.low:+.2f}, {100 * ci.high:+.2f}]"
        f1 = f"{s.base['macro_f1']:.3f}→{s.adapted['macro_f1']:.3f}"
        ece = f"{s.base['ece']:.3f}→{s.adapted['ece']:.3f}"
        lines.append(
            f"{name.replace('_heldout', ''):<16}{s.reviews:>6}{'':>2}{s.base['accuracy']:>9.4f}"
            f"{s.adapted['accuracy']:>9.4f}{delta:>26}{f1:>16}{ece:>16}"
        )
    for name, c in report.changed_counts.items():
        lines.append(f"{name}: {c['changed']} labels changed ({c['fixed']} fixed, {c['broken']} broken)")
    if report.promotable:
        lines.append("GATE: promotable (corpus kept, calibration kept, user gain outside noise)")
    elif report.forced:
        lines.append("GATE: NOT promotable, written anyway because of --force: " + "; ".join(report.reasons))
    else:
        lines.append("GATE: NOT promotable: " + "; ".join(report.reasons))
    return "\n".join(lines)
