"""What a training run writes: the model (`save_classifier`: config, model.safetensors, tokenizer), the
interim best model, metrics.json, heldout.jsonl, sentiment_model.json and the README.md model card; the
manifest last (`write_manifest`, after the run's last file)."""

from __future__ import annotations

import json
import os
import platform
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.classifier import DEFAULT_LABELS
from worker.model.manifest import MANIFEST_FILE, write_manifest
from worker.model.metadata import METADATA_FILE, ModelMetadata, weights_version
from worker.model.weights import save_classifier
from worker.training.corpus import (
    Split,
)
from worker.training.evaluate import (
    HELDOUT_FILE,
    ClassificationMetrics,
    write_heldout,
)
from worker.training.options import (
    CLEANING_FILE,
    METRICS_FILE,
    MODEL_CARD_FILE,
    SCRATCH,
    EpochRecord,
    TrainOptions,
    TrainReport,
)


def hardware_description(device_kind: str, world: int) -> str:
    cpu = platform.processor() or platform.machine()
    desc = f"{os.cpu_count()} CPU cores ({cpu}), {platform.system()}"
    if device_kind == "gpu":
        import paddle

        desc += f"; GPU {paddle.device.cuda.get_device_name()} x {world}"
    return desc


def write_interim(
    options: TrainOptions, net: Any, tokenizer: Any, parts: Split, dev_accuracy: float, step: int
) -> None:
    """The best model so far into ``output_dir``, loadable; metrics.json and the card come at the end.

    Files are written into a scratch directory and moved in one by one (each move atomic), so a kill
    mid-write leaves the previous best model's files whole; the manifest is written last, so a directory
    caught between two moves is refused (its files do not match), never loaded half old, half new.
    """
    out = Path(options.output_dir)
    scratch = out / ".interim.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    save_classifier(net, tokenizer, scratch)
    write_heldout(scratch / HELDOUT_FILE, parts.test, DEFAULT_LABELS)
    _write_metadata(scratch, options, interim=True, step=step, dev_accuracy=dev_accuracy, init=options.init)
    (out / MANIFEST_FILE).unlink(missing_ok=True)  # the old model's: refused from the first move on
    for path in sorted(scratch.iterdir(), key=lambda p: p.name == METADATA_FILE):  # metadata last
        os.replace(path, out / path.name)
    scratch.rmdir()
    write_manifest(out)


def summary_table(history: Sequence[EpochRecord], best_epoch: int) -> str:
    """A fixed-width table of the epochs; the kept (best dev) epoch is marked with ``*``."""
    lines = [f"{'epoch':>5} {'train loss':>10} {'dev acc':>8} {'dev F1':>8} {'seconds':>8} {'seq/s':>7}"]
    for r in history:
        mark = " *" if r.epoch == best_epoch else ""
        lines.append(
            f"{r.epoch:>5} {r.train_loss:>10.4f} {r.dev_accuracy:>8.4f} {r.dev_macro_f1:>8.4f} "
            f"{r.seconds:>8.1f} {r.sequences_per_second:>7.1f}{mark}"
        )
    return "\n".join(lines)


def write_outputs(
    options: TrainOptions,
    report: TrainReport,
    net: Any,
    tokenizer: Any,
    parts: Split,
    source: str,
    test: ClassificationMetrics | None,
    device_kind: str,
    world: int,
    train_labels: np.ndarray,
) -> None:
    """The finished model directory, all but its manifest (`train` writes that after its clean-up)."""
    out = report.output_dir
    save_classifier(net, tokenizer, out)
    write_heldout(out / HELDOUT_FILE, parts.test, DEFAULT_LABELS)
    hardware = hardware_description(device_kind, world)
    metrics = {
        "test_accuracy": report.test_accuracy,
        "test_macro_f1": report.test_macro_f1,
        "test_ece": report.test_ece,
        "dev_accuracy": report.dev_accuracy,
        "best_epoch": report.best_epoch,
        "test_per_class": report.test_per_class,
        "test": asdict(test) if test is not None else None,
        "history": [asdict(h) for h in report.history],
        "train_label_counts": {n: int((train_labels == i).sum()) for i, n in enumerate(DEFAULT_LABELS)},
        "split_sizes": {"train": report.train_size, "dev": report.dev_size, "test": report.test_size},
        "data": source,
        "init": options.init,
        "vocab_size": report.vocab_size,
        "seed": options.seed,
        "split_seed": options.data_split_seed,
        "steps": report.steps,
        "seconds": round(report.seconds, 1),
        "hardware": hardware,
        "amp_used": report.amp_used,
        "averaged_steps": report.averaged_steps,
        "hyper_parameters": options.hyper_parameters(),
    }
    (out / METRICS_FILE).write_text(
        json.dumps(metrics, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    _write_metadata(
        out,
        options,
        test_accuracy=report.test_accuracy,
        dev_accuracy=report.dev_accuracy,
        train_size=report.train_size,
        seconds=round(report.seconds, 1),
        data=source,
        init=options.init,
    )
    (out / MODEL_CARD_FILE).write_text(model_card(options, report, source, test, hardware), encoding="utf-8")


def _write_metadata(directory: Path, options: TrainOptions, **training: Any) -> None:
    """The sentiment_model.json of the weights in `directory`, trained with `options` (`training`: its
    summary)."""
    ModelMetadata(
        name=options.model_name(),
        version=weights_version(directory),
        labels=list(DEFAULT_LABELS),
        max_seq_len=options.max_seq_len,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        training=training,
    ).write(directory / METADATA_FILE)


def _distilled(options: TrainOptions) -> str:
    ensemble = " (an ensemble: the teachers' mean probability)" if len(options.teacher_dirs()) > 1 else ""
    return (
        f"distilled from `{options.teacher}`{ensemble} with temperature {options.temperature}, soft-target "
        f"weight {options.soft_weight}, {options.augment_copies} augmented copies of the train split"
        + (f" and {options.synonym_copies} with thesaurus synonyms" if options.synonym_copies else "")
        + " labelled by the teacher"
        + (
            f", and each student layer's [CLS] state taught the teacher's at the same relative depth "
            f"(intermediate-layer distillation, weight {options.layer_weight})"
            if options.layer_weight
            else ""
        )
    )


def model_card(
    options: TrainOptions,
    report: TrainReport,
    source: str,
    test: ClassificationMetrics | None,
    hardware: str,
) -> str:
    """A short Markdown model card: data, split, hyper-parameters, dev/test metrics, time, hardware."""
    hp = options.hyper_parameters()
    skip = {"output_dir", "resume", "stop_after_steps", "checkpoint_every", "keep_checkpoint"}
    rows = "\n".join(f"| {k} | {v} |" for k, v in hp.items() if k not in skip)
    if options.init == SCRATCH and options.teacher is not None:
        arch = (
            f"ERNIE student: {options.num_layers} layers, hidden {options.hidden_size}, "
            f"{options.num_heads} heads, FFN {options.intermediate_size}, on the teacher's vocabulary of "
            f"{report.vocab_size} tokens with its embeddings projected to {options.hidden_size} dimensions; "
            + _distilled(options)
        )
    elif options.init == SCRATCH:
        arch = (
            f"ERNIE from scratch: {options.num_layers} layers, hidden {options.hidden_size}, "
            f"{options.num_heads} heads, FFN {options.intermediate_size}, character vocabulary of "
            f"{report.vocab_size} tokens built from the train split"
        )
    else:
        arch = f"fine-tuned from `{options.init}` (vocabulary of {report.vocab_size} tokens)"
        layers = options.kept_layers()
        if layers is not None:
            arch += f"; only its encoder layers {options.keep_layers} kept ({len(layers)} layers)"
        if options.teacher is not None:
            shape = (
                "a student initialised from the init's layers"
                if layers is not None
                else "self-distillation: the student has the teachers' shape"
            )
            arch += f"; {_distilled(options)} ({shape})"
    lines = [
        f"# {options.model_name()}",
        "",
        "Binary sentiment classifier for Chinese reviews (labels: "
        + ", ".join(f"{i} = {n}" for i, n in enumerate(DEFAULT_LABELS))
        + f"), `ErnieForSequenceClassification`, max_seq_len {options.max_seq_len} tokens.",
        "",
        f"- Model: {arch}.",
        f"- Data: {source}; de-duplicated, texts with both labels dropped"
        + (
            f"; train reviews whose label a cross-validated probe on the pretrained encoder gave a "
            f"probability below {options.clean_below} dropped before training (`{CLEANING_FILE}`)."
            if options.clean_below
            else "."
        ),
        f"- Split (seed {options.data_split_seed}): train {report.train_size}, dev {report.dev_size}, "
        f"test {report.test_size} (`{HELDOUT_FILE}` holds the test split; it was never used for training "
        "or model selection).",
        f"- Training: {report.steps} optimizer steps"
        + (" (ended early with `--finish`)" if options.finish else "")
        + (
            f", R-Drop (two dropout passes per batch, symmetric KL weight {options.rdrop})"
            if options.rdrop
            else ""
        )
        + (
            f", the weights of the dev evaluations at steps {', '.join(map(str, report.averaged_steps))} "
            "averaged (chosen on dev)"
            if report.averaged_steps
            else ""
        )
        + f", best dev epoch {report.best_epoch} kept, "
        f"{report.seconds / 60:.1f} min on {hardware}" + (", AMP" if report.amp_used else "") + ".",
        "",
        "## Metrics",
        "",
        "| split | accuracy | macro-F1 | ECE |",
        "|---|---|---|---|",
        f"| dev (best epoch) | {report.dev_accuracy:.4f} | "
        f"{next((h.dev_macro_f1 for h in report.history if h.epoch == report.best_epoch), 0.0):.4f} | |",
    ]
    if test is not None:
        lines.append(f"| test (held out) | {test.accuracy:.4f} | {test.macro_f1:.4f} | {test.ece:.4f} |")
    lines += [
        "",
        "Training history:",
        "",
        "```",
        summary_table(report.history, report.best_epoch),
        "```",
        "",
        "## Hyper-parameters",
        "",
        "| option | value |",
        "|---|---|",
        rows,
        "",
        "Limitations: trained only on the data above; accuracy on other review domains (food delivery, "
        "hotels, e-commerce) is lower than on its own held-out split. Re-evaluate with "
        "`sentiment-worker evaluate`.",
        "",
    ]
    return "\n".join(lines)


def adapted_model_card(report: dict[str, Any], base_name: str, hardware: str, figures: str) -> str:
    """The model card of an `adapt` run: what it was adapted from and on, the gate's verdict, the figures
    (base vs adapted on both held-out sets, with intervals) and the recipe's options."""
    sizes, training = report["sizes"], report["training"]
    options = training.get("options", {})
    verdict = (
        "**Promotable**: the corpus held-out kept, calibration kept, the gain on the team's held-out reviews "
        "outside its 95 % interval."
        if report["promotable"] and not report["forced"]
        else (
            "**Not promotable** by the gate, written anyway with `--force`: " + "; ".join(report["reasons"])
            if report["forced"]
            else "**Not promotable**: " + "; ".join(report["reasons"]) + ". `promote` refuses it."
        )
    )
    rows = "\n".join(f"| {k} | {v} |" for k, v in options.items() if k not in ("output_dir", "resume"))
    return "\n".join(
        [
            f"# {base_name}, adapted",
            "",
            f"`sentiment-worker adapt` of `{training['base']}` on a team's labelled reviews: "
            f"{sizes['user_train']} trained on, {sizes['user_dev']} for early stopping and calibration, "
            f"{sizes['user_heldout']} held out (never trained on); {sizes['rehearsal']} corpus reviews "
            f"rehearsed alongside with a distillation term from the base; {training['steps']} steps, best "
            f"step {training['best_step']} kept, temperature {report['temperature']:.3f}; "
            f"{training['seconds'] / 60:.1f} min on {hardware}.",
            "",
            verdict,
            "",
            "```",
            figures,
            "```",
            "",
            f"Corpus: {training['corpus']}. Intervals: paired bootstrap, "
            f"{report['bootstrap']['resamples']} resamples (seed {report['bootstrap']['seed']}); "
            "`report.json` holds every figure, `predictions.jsonl` every held-out probability.",
            "",
            "| option | value |",
            "|---|---|",
            rows,
            "",
        ]
    )
