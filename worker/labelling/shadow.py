"""The shadow's agreement with the primary on live traffic: each group both labelled is compared review by
review (the top label of each), counted in the metrics (a confusion table by label pair, the shadow's
confidence) and kept as running figures since the shadow started, which the replica reports on the status
topic and `models promote --live` gates on."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from schemas.control import Agreement
from worker.inference.classifier import Output
from worker.metrics import LiveModelMetrics

__all__ = ["ShadowAgreement"]


class ShadowAgreement:
    """Running agreement figures of one shadow (identified by `shadow_hash`) beside the primary. Thread-safe:
    groups are compared on the engines' threads."""

    def __init__(self, labels: Sequence[str], shadow_hash: str | None, shadow_version: str) -> None:
        self._labels = list(labels)
        self._lock = threading.Lock()
        self._figures = Agreement(shadow_hash=shadow_hash, shadow_version=shadow_version)
        self._confusion: dict[str, int] = {}
        self._reviews = self._agreeing = self._shadowed = self._skipped = 0
        self._primary_confidence = self._shadow_confidence = 0.0
        self._primary_version = ""

    def skipped(self, metrics: LiveModelMetrics | None) -> None:
        """A group the shadow did not label (it was behind)."""
        with self._lock:
            self._skipped += 1
        if metrics is not None:
            metrics.shadow_groups.labels("skipped").inc()

    def compare(
        self,
        primary: Sequence[Output],
        shadow: Sequence[Output],
        primary_version: str,
        metrics: LiveModelMetrics | None,
    ) -> None:
        """One group labelled by both (outputs in the same review order); a review either model failed on is
        not compared."""
        pairs: dict[tuple[str, str], int] = {}
        confidences: list[float] = []
        primary_confidence = 0.0
        for ours, theirs in zip(primary, shadow, strict=True):
            if not isinstance(ours, np.ndarray) or not isinstance(theirs, np.ndarray):
                continue
            p_values, s_values = ours.tolist(), theirs.tolist()
            p_top, s_top = max(p_values), max(s_values)
            pair = (self._labels[p_values.index(p_top)], self._labels[s_values.index(s_top)])
            pairs[pair] = pairs.get(pair, 0) + 1
            confidences.append(s_top)
            primary_confidence += p_top
        reviews = sum(pairs.values())
        with self._lock:
            self._shadowed += 1
            self._reviews += reviews
            self._agreeing += sum(count for (mine, other), count in pairs.items() if mine == other)
            for (mine, other), count in pairs.items():
                key = f"{mine}->{other}"
                self._confusion[key] = self._confusion.get(key, 0) + count
            self._primary_confidence += primary_confidence
            self._shadow_confidence += sum(confidences)
            self._primary_version = primary_version
        if metrics is not None:
            metrics.observe_shadowed(pairs, confidences, self._figures.shadow_version)

    def snapshot(self) -> Agreement:
        """The figures so far."""
        with self._lock:
            return self._figures.model_copy(
                update={
                    "primary_version": self._primary_version,
                    "reviews": self._reviews,
                    "agreeing": self._agreeing,
                    "confusion": dict(self._confusion),
                    "primary_confidence_sum": round(self._primary_confidence, 6),
                    "shadow_confidence_sum": round(self._shadow_confidence, 6),
                    "groups_shadowed": self._shadowed,
                    "groups_skipped": self._skipped,
                }
            )
