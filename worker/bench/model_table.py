"""`sentiment-worker model-table`: the README's model table, every row measured in one run.

For each training directory: its static export (parity-checked against dygraph, in a temporary directory);
for each served form (an `export` or `quantize` output such as `make model`'s INT8 directory): that form
itself. Each labels one held-out file — accuracy, macro-F1, ECE — and then runs ``repeats`` passes of
`bench`'s model-only phase (the worker's windows, batch size and token budget, tokenization included) over
the same shuffled corpus reviews (the demo's length mix); the median pass is reported. Shape, parameter
count and the size and precision of the weights file come from the directory itself. With a broker
(``bootstrap_servers``), each served form also drains a backlog of the same reviews through a real
`sentiment-worker run` subprocess (`bench`'s end-to-end phase: conservation checked by id), which gives the
end-to-end reviews/s and the worker's peak RSS. Each also labels every held-out review alone and inside mixed
batches of 32 (`batch-invariance`): a form whose labels depend on their batch-mates says so in the table. An
INT8 form's label agreement with its float32 source comes from its `quantize` record. Every model is
measured on the same held-out reviews: by default the first model's ``heldout.jsonl``; a model whose own
held-out split differs is flagged, since it may have trained on some of those reviews.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.bench.batch_invariance import BatchInvariance, batch_invariance
from worker.bench.bench import BenchOptions, bench_end_to_end, bench_model_only, review_texts
from worker.bench.topic_io import delete_run_topics
from worker.config import WorkerSettings
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, load_classifier
from worker.model.manifest import verify_model_dir
from worker.model.metadata import CONFIG_FILES, METADATA_FILE, find_weights
from worker.model.onnx_backend import ONNX_FILE, is_onnx_dir
from worker.model.static_backend import is_exported_dir
from worker.training.evaluate import HELDOUT_FILE, classification_metrics, predict_probs, read_heldout
from worker.training.export import export_model


@dataclass(frozen=True)
class ModelRow:
    """One model's line of the table."""

    directory: str
    name: str
    version: str
    shape: str
    """layers × hidden size"""
    parameters: int
    weights_mb: float
    weights_dtype: str
    heldout_texts: int
    accuracy: float
    macro_f1: float
    ece: float
    reviews_per_s: float
    passes_reviews_per_s: list[float]
    own_heldout_differs: bool
    """True when the model's own heldout.jsonl is not the file the table used."""
    served_as: str = "Paddle Inference fp32"
    """The backend and precision the row was measured with."""
    end_to_end_reviews_per_s: float | None = None
    """Backlog drained through the broker by a worker process (None: no broker given)."""
    peak_rss_mb: float | None = None
    """The worker process's peak resident memory while draining (MB; None: no broker given)."""
    batch_label_changes: int = 0
    """Held-out labels that differ between each review alone and inside mixed batches of 32."""
    batch_max_abs_diff: float = 0.0
    """The largest probability move between alone and batched."""
    batch_invariant: bool = True
    """No label changed and no probability moved more than 1e-4 (see worker.bench.batch_invariance)."""
    agrees_with_fp32: float | None = None
    """An INT8 form: share of held-out labels equal to its float32 source's (its quantize record)."""


@dataclass(frozen=True)
class EndToEnd:
    """Where and how much the end-to-end column drains: the broker and client settings, a backlog size."""

    settings: WorkerSettings
    messages: int = 2000
    partitions: int = 3


def model_row(
    directory: Path,
    heldout: Path,
    texts: Sequence[str],
    *,
    repeats: int,
    cpu_threads: int | None = None,
    end_to_end: EndToEnd | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> ModelRow:
    """Measures one training directory (see the module docstring)."""
    examples = read_heldout(heldout)
    defaults = WorkerSettings.model_fields
    verify_model_dir(directory)  # before its metadata is read
    meta = json.loads((directory / METADATA_FILE).read_text(encoding="utf-8"))
    onnx_only = is_onnx_dir(directory) and not is_exported_dir(directory)
    precision = str((meta.get("onnx") or {}).get("precision", "float32")) if onnx_only else "float32"
    method = (meta.get("onnx") or {}).get("quantization_method")
    served_as = (
        f"ONNX Runtime {f'INT8 ({method})' if precision == 'int8' else 'fp32'}"
        if onnx_only
        else "Paddle Inference fp32"
    )
    with tempfile.TemporaryDirectory(prefix="model-table-") as tmp:
        served = directory
        if not (onnx_only or is_exported_dir(directory)):
            served = Path(tmp) / "static"
            export_model(directory, served)
        classifier = load_classifier(
            str(served),
            choose_device("cpu"),
            options=InferenceOptions(backend="onnx" if onnx_only else "static", cpu_threads=cpu_threads),
        )
        probs, _ = predict_probs(classifier, [e.text for e in examples], 32)
        invariance = batch_invariance(classifier, [e.text for e in examples], batch_size=32)
        gold = np.array([e.label_id for e in examples], dtype=np.int64)
        metrics = classification_metrics(gold, probs, classifier.labels)
        passes = [
            bench_model_only(
                classifier,
                texts,
                window=int(defaults["max_window_messages"].default),
                max_batch_size=int(defaults["max_batch_size"].default),
                max_batch_tokens=int(defaults["max_batch_tokens"].default),
            ).messages_per_second
            for _ in range(max(1, repeats))
        ]
        drained = (
            _end_to_end(
                served, "onnx" if onnx_only else "static", cpu_threads, texts, end_to_end, Path(tmp), say
            )
            if end_to_end is not None
            else None
        )
    config = _config(directory)
    weights = directory / ONNX_FILE if onnx_only else find_weights(directory)
    own = directory / HELDOUT_FILE
    return ModelRow(
        directory=str(directory),
        name=str(meta.get("name", directory.name)),
        version=str(meta.get("version", "")),
        shape=f"{config['num_hidden_layers']} × {config['hidden_size']}",
        parameters=_parameters(config),
        weights_mb=weights.stat().st_size / 1e6 if weights is not None else 0.0,
        weights_dtype="int8"
        if precision == "int8"
        else str((meta.get("training") or {}).get("weights_dtype", "float32")),
        heldout_texts=len(examples),
        accuracy=metrics.accuracy,
        macro_f1=metrics.macro_f1,
        ece=metrics.ece,
        reviews_per_s=statistics.median(passes),
        passes_reviews_per_s=passes,
        own_heldout_differs=own.is_file() and _texts(own) != [e.text for e in examples],
        served_as=served_as,
        end_to_end_reviews_per_s=drained[0] if drained else None,
        peak_rss_mb=drained[1] if drained else None,
        **_invariance_fields(invariance),
        agrees_with_fp32=_agreement(meta),
    )


def _invariance_fields(result: BatchInvariance) -> dict[str, Any]:
    return {
        "batch_label_changes": result.label_changes,
        "batch_max_abs_diff": result.max_abs_diff,
        "batch_invariant": result.invariant,
    }


def _agreement(meta: dict[str, Any]) -> float | None:
    """The quantize record's label agreement with the float32 source (None: not an INT8 form)."""
    accuracy = (meta.get("quantization") or {}).get("accuracy") or {}
    value = accuracy.get("agreement")
    return float(value) if value is not None else None


def _end_to_end(
    served: Path,
    backend: str,
    cpu_threads: int | None,
    texts: Sequence[str],
    where: EndToEnd,
    workdir: Path,
    say: Callable[[str], None],
) -> tuple[float, float | None]:
    """(reviews/s, peak RSS in MB) of a worker process draining ``where.messages`` reviews; topics deleted."""
    settings = where.settings.model_copy(
        update={"model": str(served), "backend": backend, "device": "cpu", "cpu_threads": cpu_threads}
    )
    backlog = [texts[i % len(texts)] for i in range(where.messages)]
    prefix = f"model-table-{os.getpid()}-{served.name}-{int(time.time())}"
    options = BenchOptions(messages=where.messages, partitions=where.partitions, worker_timeout_s=1800.0)
    try:
        phase = bench_end_to_end(settings, backlog, options, prefix, workdir, say)
    finally:
        delete_run_topics(settings.librdkafka_common(), prefix)
    check = phase.extra["conservation"]
    if not check.get("ok", True):
        raise RuntimeError(f"end-to-end drain of {served} lost or duplicated reviews: {check}")
    peak = phase.extra["rss"]["peak_bytes"]
    return phase.messages_per_second, peak / 1e6 if peak else None


def model_table(
    directories: Sequence[Path],
    *,
    heldout: Path | None = None,
    texts: int = 2048,
    repeats: int = 3,
    seed: int = 0,
    cpu_threads: int | None = None,
    end_to_end: EndToEnd | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> list[ModelRow]:
    """One row per directory, all on the same held-out file and the same corpus reviews."""
    if not directories:
        raise ValueError("name at least one model directory")
    heldout = heldout or directories[0] / HELDOUT_FILE
    if not heldout.is_file():
        raise FileNotFoundError(
            f"no held-out file {heldout}: pass --heldout FILE (a heldout.jsonl from train)"
        )
    reviews = review_texts(texts, seed)
    rows = []
    for directory in directories:
        progress(f"{directory}: {heldout.name}, {repeats} model-only passes of {texts} reviews")
        rows.append(
            model_row(
                directory, heldout, reviews, repeats=repeats, cpu_threads=cpu_threads, end_to_end=end_to_end,
                say=progress,
            )
        )  # fmt: skip
    return rows


def format_model_table(rows: Sequence[ModelRow]) -> str:
    """The rows as the README's Markdown table."""
    lines = [
        "| model | served as | shape | parameters | held-out accuracy | macro-F1 | ECE "
        "| labels agree with fp32 | alone = in batches | reviews/s model-only | reviews/s end to end "
        "| peak RSS | weights |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        flag = " (own held-out split differs)" if row.own_heldout_differs else ""
        lines.append(
            f"| {row.name} ({row.version}){flag} | {row.served_as} | {row.shape} | "
            f"{row.parameters / 1e6:.1f}M | "
            f"{row.accuracy:.2%} | {row.macro_f1:.3f} | {row.ece:.3f} | "
            f"{_maybe(row.agrees_with_fp32, '.2%')} | {_invariance_cell(row)} | {row.reviews_per_s:,.0f} | "
            f"{_maybe(row.end_to_end_reviews_per_s, ',.0f')} | {_maybe(row.peak_rss_mb, ',.0f', ' MB')} | "
            f"{row.weights_mb:.1f} MB {row.weights_dtype} |"
        )
    if rows:
        lines.append(
            f"\n{rows[0].heldout_texts} held-out reviews; alone = in batches: each labelled alone and in "
            "mixed batches of 32, no label changed and no probability moved over 1e-4; reviews/s: median of "
            f"{len(rows[0].passes_reviews_per_s)} model-only passes at the demo's length mix"
            + (
                "; end to end: a backlog drained through the broker by a worker process (its peak RSS)."
                if rows[0].end_to_end_reviews_per_s is not None
                else "; end to end and RSS: pass --bootstrap-servers."
            )
        )
    return "\n".join(lines)


def _invariance_cell(row: ModelRow) -> str:
    if row.batch_invariant:
        return f"yes (max Δp {row.batch_max_abs_diff:.0e})"
    return f"**no**: {row.batch_label_changes} labels change, Δp up to {row.batch_max_abs_diff:.3f}"


def _maybe(value: float | None, spec: str, unit: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{unit}"


def rows_as_json(rows: Sequence[ModelRow]) -> list[dict[str, Any]]:
    return [asdict(row) for row in rows]


def _config(directory: Path) -> dict[str, Any]:
    for name in CONFIG_FILES:
        if (directory / name).is_file():
            return dict(json.loads((directory / name).read_text(encoding="utf-8")))
    raise FileNotFoundError(f"no {' or '.join(CONFIG_FILES)} in {directory}")


def _parameters(config: dict[str, Any]) -> int:
    """Parameters of an ERNIE/BERT classifier from its config (embeddings, layers, pooler, 2-way head)."""
    h, i, layers = (
        int(config["hidden_size"]),
        int(config["intermediate_size"]),
        int(config["num_hidden_layers"]),
    )
    vocab, positions = int(config["vocab_size"]), int(config["max_position_embeddings"])
    types = int(config.get("type_vocab_size", 2))
    embeddings = (vocab + positions + types) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    return embeddings + layers * layer + (h * h + h) + (2 * h + 2)


def _texts(path: Path) -> list[str]:
    return [example.text for example in read_heldout(path)]
