"""Promotion: a candidate model replaces the default only through the gate (`evaluate.Comparison` on the same
held-out reviews), and is shipped lean: no checkpoint, weights stored in float16 (computed in float32 when
loaded), labels checked to be unchanged by the halving before the directory is swapped into place."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, load_classifier
from worker.model.metadata import (
    METADATA_FILE,
    TOKENIZER_CONFIG_FILE,
    ModelMetadata,
    drop_machine_paths,
    find_weights,
    weights_version,
)

HALVING_TOLERANCE = 1e-3
"""Largest change in any probability that storing the weights in float16 may cause."""
SKIPPED = ("checkpoint",)


class PromotionError(RuntimeError):
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


def halve_weights(directory: Path) -> None:
    """Store every float32 tensor of the directory's weights as float16 (in place)."""
    import paddle

    weights = find_weights(directory)
    if weights is None or weights.suffix != ".pdparams":
        raise PromotionError(f"no model_state.pdparams in {directory}")
    state = paddle.load(str(weights))
    paddle.save(
        {name: t.astype("float16") if t.dtype == paddle.float32 else t for name, t in state.items()},
        str(weights),
    )


def ship(candidate: Path, target: Path, texts: list[str], *, fp16: bool = True) -> ShipReport:
    """Copy `candidate` (a training directory) to `target`, weights halved when `fp16`; probabilities on
    `texts` must stay within HALVING_TOLERANCE of the candidate's, else nothing is replaced."""
    if not (candidate / METADATA_FILE).is_file():
        raise PromotionError(f"{candidate} is not a model directory made by `sentiment-worker train`")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        shutil.copytree(candidate, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*SKIPPED))
        before = _weights_bytes(staging)
        if fp16:
            halve_weights(staging)
        drop_machine_paths(staging / TOKENIZER_CONFIG_FILE)  # directories trained before save_tokenizer
        meta = ModelMetadata.read(staging / METADATA_FILE)
        version = weights_version(staging)
        training = {**meta.training, "weights_dtype": "float16" if fp16 else "float32"}
        replace(meta, version=version, training=training).write(staging / METADATA_FILE)
        diff = _max_abs_diff(candidate, staging, texts)
        if diff > HALVING_TOLERANCE:
            raise PromotionError(
                f"float16 weights change probabilities by {diff:.1e} (> {HALVING_TOLERANCE:g})"
            )
        report = ShipReport(target, version, before, _weights_bytes(staging), diff, len(texts))
        old = target.with_name(f".{target.name}-replaced")
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        return report
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _weights_bytes(directory: Path) -> int:
    weights = find_weights(directory)
    return weights.stat().st_size if weights is not None else 0


def _max_abs_diff(a: Path, b: Path, texts: list[str]) -> float:
    cpu = choose_device("cpu")
    options = InferenceOptions(backend="dynamic", tokenizer="slow")
    first = load_classifier(str(a), cpu, options=options).predict_texts(texts)
    second = load_classifier(str(b), cpu, options=options).predict_texts(texts)
    return float(np.abs(first - second).max()) if len(texts) else 0.0
