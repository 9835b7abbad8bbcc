"""Speed of a model on this machine: dynamic vs static seq/s on one synthetic batch, and FLOP efficiency
against numpy's sgemm measured in the same run (`inference-speed`, `evaluate`'s throughput line)."""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, load_classifier
from worker.model.manifest import verify_model_dir
from worker.model.metadata import CONFIG_FILES, find_weights
from worker.model.static_backend import is_exported_dir
from worker.training.export import export_model


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs: layers, hidden and feed-forward sizes."""

    num_layers: int
    hidden_size: int
    intermediate_size: int


def encoder_flops(shape: ModelShape, seq_len: int) -> float:
    """Multiply-add FLOPs (×2) of one sequence through the encoder: Q/K/V/O projections, attention scores
    and weighted sum, feed-forward; embeddings, layer norms, softmax and the classifier head are ignored."""
    h, i, n = shape.hidden_size, shape.intermediate_size, seq_len
    per_layer = 2 * (4 * n * h * h + 2 * n * n * h + 2 * n * h * i)
    return float(shape.num_layers * per_layer)


def sgemm_flops_per_s(size: int = 1024, repeats: int = 5) -> float:
    """numpy float32 matrix multiply speed (best of ``repeats`` size×size products), FLOP/s."""
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    a @ b  # warm-up: thread pool start
    best = math.inf
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2.0 * size**3 / best


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    """Best wall time of ``repeats`` calls after one warm-up call."""
    run()
    best = math.inf
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


@dataclass(frozen=True)
class BackendSpeed:
    """Sequences/s of each backend on one [batch_size, seq_len] batch, and FLOP efficiency vs sgemm."""

    batch_size: int
    seq_len: int
    cpu_threads: int
    model_gflop_per_seq: float
    sgemm_gflop_per_s: float
    seq_per_s: dict[str, float]
    efficiency: dict[str, float]
    """Model FLOP/s ÷ numpy sgemm FLOP/s measured in the same run, per backend."""
    static_over_dynamic: float | None
    """static seq/s ÷ dynamic seq/s (None unless both ran)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly values."""
        return asdict(self)


def measure_classifiers_speed(
    classifiers: dict[str, Any],
    shape: ModelShape,
    *,
    batch_size: int = 32,
    seq_len: int = 128,
    repeats: int = 3,
    cpu_threads: int = 0,
) -> BackendSpeed:
    """Times ``predict_ids`` of each classifier (name → classifier: "dynamic", "static") on the same
    synthetic [batch_size, seq_len] batch, measures numpy sgemm in the same run, and reports seq/s and
    efficiency. ``seq_len`` must not exceed the classifiers' max_seq_len."""
    rng = np.random.default_rng(0)
    first = next(iter(classifiers.values()))
    cls_sep = first.token_ids([""])[0]
    body = rng.integers(5, 100, size=(batch_size, seq_len - 2)).tolist()  # ids present in any vocab
    batch = [[cls_sep[0], *row, cls_sep[-1]] for row in body]
    sgemm = sgemm_flops_per_s()
    flops = encoder_flops(shape, seq_len)
    rates: dict[str, float] = {}
    efficiency: dict[str, float] = {}
    for name, classifier in classifiers.items():
        seconds = best_seconds(functools.partial(classifier.predict_ids, batch), repeats)
        rates[name] = batch_size / seconds
        efficiency[name] = rates[name] * flops / sgemm
    ratio = rates["static"] / rates["dynamic"] if {"static", "dynamic"} <= rates.keys() else None
    return BackendSpeed(batch_size, seq_len, cpu_threads, flops / 1e9, sgemm / 1e9, rates, efficiency, ratio)


def measure_backend_speed(
    model_dir: str | Path,
    *,
    exported_dir: str | Path | None = None,
    batch_size: int = 32,
    seq_len: int = 128,
    repeats: int = 3,
    cpu_threads: int | None = None,
) -> BackendSpeed:
    """Dynamic vs static seq/s on CPU for a model directory (for `evaluate`'s throughput report).

    ``model_dir`` is a training directory (exported to a temporary directory unless ``exported_dir`` is
    given) or an exported one (then static only). ``seq_len`` is capped by the model's position
    embeddings. Raises ModelLoadError / ExportError when a model can't be loaded or exported.
    """
    source = Path(model_dir).expanduser()
    verify_model_dir(source)  # before its config is read
    config_path = next((source / n for n in CONFIG_FILES if (source / n).is_file()), None)
    if config_path is None:
        raise FileNotFoundError(f"no {' or '.join(CONFIG_FILES)} in {source}")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    seq_len = min(seq_len, int(config.get("max_position_embeddings") or seq_len))
    threads = cpu_threads or os.cpu_count() or 1
    cpu = choose_device("cpu")
    static_options = InferenceOptions(backend="static", tokenizer="slow", cpu_threads=threads)
    with tempfile.TemporaryDirectory(prefix="sentiment-export-") as tmp:
        classifiers: dict[str, Any] = {}
        if find_weights(source) is not None:
            dynamic_options = InferenceOptions(backend="dynamic", tokenizer="slow")
            classifiers["dynamic"] = load_classifier(
                str(source), cpu, max_seq_len=seq_len, options=dynamic_options
            )
            if exported_dir is None and not is_exported_dir(source):
                exported_dir = export_model(source, Path(tmp) / "exported").output_dir
        static_dir = exported_dir if exported_dir is not None else source
        classifiers["static"] = load_classifier(
            str(static_dir), cpu, max_seq_len=seq_len, options=static_options
        )
        return measure_classifiers_speed(
            classifiers,
            model_shape(config),
            batch_size=batch_size,
            seq_len=seq_len,
            repeats=repeats,
            cpu_threads=threads,
        )


def model_shape(config: dict[str, Any]) -> ModelShape:
    """The shape fields of a PaddleNLP ``config.json``."""
    return ModelShape(
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
    )
