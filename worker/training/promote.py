"""Promotion: a candidate model replaces the default only through the gate (`evaluate.Comparison` on the same
held-out reviews), and is shipped lean: no checkpoint, the vocabulary rows its tokenizer can never emit
dropped (`vocab.prune_vocabulary`, token parity checked), weights stored in float16 (computed in float32 when
loaded), probabilities checked to be unchanged by both before the directory is swapped into place."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from worker.errors import OperationError
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, load_classifier
from worker.model.manifest import verify_model_dir, write_manifest
from worker.model.metadata import (
    METADATA_FILE,
    TOKENIZER_CONFIG_FILE,
    ModelMetadata,
    drop_machine_paths,
    find_weights,
    weights_version,
)
from worker.model.weights import read_weights, save_weights
from worker.training.export import staged_directory
from worker.training.vocab import VocabularyError, prune_vocabulary, read_vocab

HALVING_TOLERANCE = 1e-3
"""Largest change in any probability that storing the weights in float16 may cause."""
SKIPPED = ("checkpoint",)


class PromotionError(OperationError):
    """The candidate cannot be shipped as it is; the message says why."""


@dataclass(frozen=True)
class ShipReport:
    """What was written: where, the new version, the weights' bytes before and after, the halving's effect."""

    target: Path
    version: str
    weights_bytes_before: int
    weights_bytes_after: int
    max_abs_diff: float
    probe_texts: int
    vocab_rows_before: int
    vocab_rows_after: int


def promotion_refusal(directory: Path) -> str | None:
    """Why `directory` must not be promoted, when its own run marked it so (`adapt`'s gate: metrics.json
    ``"promotable": false``), else None."""
    metrics = directory / "metrics.json"
    if not metrics.is_file():
        return None
    try:
        recorded = json.loads(metrics.read_text(encoding="utf-8"))
    except ValueError:
        return None
    if not isinstance(recorded, dict) or recorded.get("promotable", True) is not False:
        return None
    reasons = recorded.get("gate_reasons") or ["its run's gate refused it"]
    return f"{directory} is marked not promotable: " + "; ".join(str(r) for r in reasons)


def halve_weights(directory: Path) -> None:
    """Store every float32 tensor of the directory's weights as float16 (in place)."""
    weights = find_weights(directory)
    if weights is None:
        raise PromotionError(f"no model.safetensors in {directory}")
    state = read_weights(weights)
    save_weights(
        {name: t.astype(np.float16) if t.dtype == np.float32 else t for name, t in state.items()}, directory
    )


def ship(
    candidate: Path,
    target: Path,
    texts: list[str],
    *,
    fp16: bool = True,
    prune_vocab: bool = True,
    parity_texts: list[str] | None = None,
) -> ShipReport:
    """Copy `candidate` (a training directory) to `target`, unreachable vocabulary rows dropped when
    `prune_vocab` (tokens checked unchanged on `parity_texts`, default `texts`), weights halved when `fp16`;
    probabilities on `texts` must stay within HALVING_TOLERANCE of the candidate's, else nothing is
    replaced."""
    if not (candidate / METADATA_FILE).is_file():
        raise PromotionError(f"{candidate} is not a model directory made by `sentiment-worker train`")
    verify_model_dir(candidate)  # what is copied is what its run wrote
    target.parent.mkdir(parents=True, exist_ok=True)
    with staged_directory(target) as staging:
        shutil.copytree(candidate, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*SKIPPED))
        before = _weights_bytes(staging)
        rows_before = rows_after = _vocab_rows(staging)
        if prune_vocab:
            try:
                pruned = prune_vocabulary(staging, texts if parity_texts is None else parity_texts)
            except VocabularyError as exc:
                raise PromotionError(str(exc)) from None
            rows_after = pruned.rows_after
        if fp16:
            halve_weights(staging)
        drop_machine_paths(staging / TOKENIZER_CONFIG_FILE)  # directories trained before save_tokenizer
        meta = ModelMetadata.read(staging / METADATA_FILE)
        version = weights_version(staging)
        training = {**meta.training, "weights_dtype": "float16" if fp16 else "float32"}
        replace(meta, version=version, training=training).write(staging / METADATA_FILE)
        write_manifest(staging)
        diff = _max_abs_diff(candidate, staging, texts)
        if diff > HALVING_TOLERANCE:
            raise PromotionError(
                f"the shipped form changes probabilities by {diff:.1e} (> {HALVING_TOLERANCE:g})"
            )
        report = ShipReport(
            target, version, before, _weights_bytes(staging), diff, len(texts), rows_before, rows_after
        )
    return report


def _vocab_rows(directory: Path) -> int:
    vocab = directory / "vocab.txt"
    return len(read_vocab(vocab)) if vocab.is_file() else 0


def _weights_bytes(directory: Path) -> int:
    weights = find_weights(directory)
    return weights.stat().st_size if weights is not None else 0


def _max_abs_diff(a: Path, b: Path, texts: list[str]) -> float:
    cpu = choose_device("cpu")
    options = InferenceOptions(backend="dynamic", tokenizer="slow")
    first = load_classifier(str(a), cpu, options=options).predict_texts(texts)
    second = load_classifier(str(b), cpu, options=options).predict_texts(texts)
    return float(np.abs(first - second).max()) if len(texts) else 0.0
