"""What `adapt` writes: a model directory ready to serve (`save_classifier`, sentiment_model.json,
metrics.json with the gate's mark, heldout.jsonl, report.json, predictions.jsonl, the model card, the
manifest last), and unless told otherwise its served CPU form beside it, `DIR-int8` (ONNX Runtime static
INT8, as `make model` derives it, through `DIR-onnx`).

The gate's mark: metrics.json `"promotable": false` with `"gate_reasons"`, and the same in
sentiment_model.json's `training` section (which the exported and INT8 forms carry along), read by
`promote.promotion_refusal`."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.classifier import DEFAULT_LABELS
from worker.model.manifest import verify_model_dir, write_manifest
from worker.model.metadata import METADATA_FILE, ModelMetadata, weights_version
from worker.model.weights import save_classifier
from worker.training.adapt_options import AdaptOptions
from worker.training.adapt_report import AdaptReport, table
from worker.training.corpus import LabeledText
from worker.training.evaluate import HELDOUT_FILE, write_heldout
from worker.training.model_card import adapted_model_card, hardware_description
from worker.training.onnx_export import export_onnx
from worker.training.options import CHECKPOINT_DIR, METRICS_FILE, MODEL_CARD_FILE
from worker.training.quantize import quantize_model

REPORT_FILE = "report.json"
PREDICTIONS_FILE = "predictions.jsonl"
"""One line per held-out review: set, text, gold label, the base's and the adapted model's probabilities."""
BASE_PROBS_FILE = "adapt_base_probs.npz"
"""The base's probabilities, kept while a run may be resumed (gone with the checkpoint)."""
PROMOTABLE_KEY = "promotable"
GATE_REASONS_KEY = "gate_reasons"


def write_predictions(
    path: Path,
    reviews: Mapping[str, Sequence[LabeledText]],
    gold: dict[str, np.ndarray],
    base: dict[str, np.ndarray],
    adapted: dict[str, np.ndarray],
) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for name, rows in reviews.items():
            for i, ex in enumerate(rows):
                line = {
                    "set": name, "index": i, "text": ex.text, "label": DEFAULT_LABELS[int(gold[name][i])],
                    "base": [round(float(p), 6) for p in base[name][i]],
                    "adapted": [round(float(p), 6) for p in adapted[name][i]],
                }  # fmt: skip
                fh.write(json.dumps(line, ensure_ascii=False) + "\n")


def read_predictions(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """predictions.jsonl back as arrays per set: gold label ids, base and adapted probabilities."""
    sets: dict[str, dict[str, list[Any]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        entry = sets.setdefault(row["set"], {"gold": [], "base": [], "adapted": []})
        entry["gold"].append(DEFAULT_LABELS.index(row["label"]))
        entry["base"].append(row["base"])
        entry["adapted"].append(row["adapted"])
    return {name: {k: np.array(v) for k, v in entry.items()} for name, entry in sets.items()}


def write_adapted(
    out: Path,
    model: Any,
    tokenizer: Any,
    report: AdaptReport,
    reviews: Mapping[str, Sequence[LabeledText]],
    gold: dict[str, np.ndarray],
    base: dict[str, np.ndarray],
    adapted: dict[str, np.ndarray],
    *,
    seq_len: int,
    options: AdaptOptions,
    progress: Callable[[str], None],
) -> Path | None:
    """The model directory (verified after writing) and, when `options.int8`, `out`-int8; returns the
    INT8 directory or None."""
    save_classifier(model, tokenizer, out)
    write_heldout(out / HELDOUT_FILE, reviews["user_heldout"], DEFAULT_LABELS)
    write_predictions(out / PREDICTIONS_FILE, reviews, gold, base, adapted)
    data = report.to_json()
    (out / REPORT_FILE).write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    user, corpus = report.sets["user_heldout"], report.sets["corpus_heldout"]
    hardware = hardware_description("gpu" if report.training["device"].startswith("gpu") else "cpu", 1)
    metrics = {
        PROMOTABLE_KEY: report.promotable,
        GATE_REASONS_KEY: report.reasons,
        "forced": report.forced,
        "test_accuracy": user.adapted["accuracy"],
        "test_macro_f1": user.adapted["macro_f1"],
        "test_ece": user.adapted["ece"],
        "corpus_heldout_accuracy": corpus.adapted["accuracy"],
        "split_sizes": report.sizes,
        "adapted_from": str(options.base),
        "temperature": report.temperature,
        "hardware": hardware,
        "report": REPORT_FILE,
        "hyper_parameters": options.to_json(),
    }
    (out / METRICS_FILE).write_text(
        json.dumps(metrics, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    base_meta = ModelMetadata.read(options.base / METADATA_FILE)
    ModelMetadata(
        name=f"{base_meta.name}-adapted",
        version=weights_version(out),
        labels=list(DEFAULT_LABELS),
        max_seq_len=seq_len,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        training={
            "adapted_from": f"{base_meta.name} {base_meta.version}",
            PROMOTABLE_KEY: report.promotable,
            GATE_REASONS_KEY: report.reasons,
            "test_accuracy": user.adapted["accuracy"],
            "corpus_heldout_accuracy": corpus.adapted["accuracy"],
            "temperature": round(report.temperature, 6),
            "train_size": report.sizes["user_train"],
        },
    ).write(out / METADATA_FILE)
    (out / MODEL_CARD_FILE).write_text(
        adapted_model_card(data, base_meta.name, hardware, table(report)), "utf-8"
    )
    shutil.rmtree(out / CHECKPOINT_DIR, ignore_errors=True)
    (out / BASE_PROBS_FILE).unlink(missing_ok=True)
    write_manifest(out)
    verify_model_dir(out)
    progress(f"saved {out} (version {weights_version(out)})")
    if not options.int8:
        return None
    onnx_dir, int8_dir = out.with_name(out.name + "-onnx"), out.with_name(out.name + "-int8")
    progress(f"served CPU form: exporting {onnx_dir}, then static INT8 into {int8_dir}")
    export_onnx(out, onnx_dir, overwrite=True)
    quantized = quantize_model(
        onnx_dir, int8_dir, heldout=out / HELDOUT_FILE, overwrite=True, seed=options.seed
    )
    acc = quantized.accuracy
    progress(
        f"INT8: user held-out accuracy {acc.float32:.2%} → {acc.int8:.2%} ({acc.delta_points:+.2f} points, "
        f"labels agree on {acc.agreement:.2%})"
    )
    return int8_dir
