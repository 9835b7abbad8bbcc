"""What a model learns from besides the gold labels, computed before training: the teachers' soft targets
(over the train split and its altered copies), the teacher's layer targets (intermediate-layer
distillation), and the train reviews kept by label cleaning."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.classifier import DEFAULT_LABELS
from worker.training.checkpoints import unwrap
from worker.training.cleaning import FOLDS, clean, encoder_features, kept_by_earlier_cleaning
from worker.training.corpus import LabeledText, Split
from worker.training.data import encode
from worker.training.distill import (
    augment_texts,
    load_soft_targets,
    save_soft_targets,
    soft_targets_key,
    soften,
    teacher_probabilities,
    teacher_tokenizer,
)
from worker.training.layer_distill import principal_targets, teacher_cls_states
from worker.training.options import CLEANING_FILE, TrainingError, TrainOptions
from worker.training.thesaurus import ThesaurusError, synonym_texts


def soft_targets(
    options: TrainOptions,
    tokenizer: Any,
    parts: Split,
    train_ids: list[list[int]],
    train_labels: np.ndarray,
    cache: Path,
    write_cache: bool,
    progress: Callable[[str], None],
) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """The train sequences plus augmented ones (label -1: no gold label), and the teachers' softened
    probabilities for all of them: one teacher's, or the mean of several (an ensemble). A teacher whose
    vocabulary differs from the student's (a pruned one, say) reads the same texts with its own tokenizer.
    The probabilities are kept in `cache` (written when `write_cache`: rank 0), so a resumed or finished
    run reads them back instead of running the teachers again."""
    teachers = options.teacher_dirs()
    train_texts = [ex.text for ex in parts.train]
    try:
        swapped = synonym_texts(train_texts, options.synonym_copies, options.seed)
    except ThesaurusError as exc:
        raise TrainingError(f"--synonym-copies: {exc}") from None
    texts = augment_texts(train_texts, options.augment_copies, options.seed) + swapped
    augmented = [LabeledText(t, -1) for t in texts]
    extra = encode(tokenizer, augmented, options.max_seq_len, options.truncation)
    synonyms = f" ({len(swapped)} with thesaurus synonyms)" if options.synonym_copies else ""
    ids = train_ids + extra
    labels = np.concatenate([train_labels, np.full(len(extra), -1, dtype=np.int64)])
    progress(
        f"distillation: {len(train_ids)} train + {len(extra)} augmented reviews{synonyms} labelled by "
        f"{', '.join(map(str, teachers))} (T={options.temperature}, soft weight {options.soft_weight})"
    )
    key = soft_targets_key(teachers, ids)
    kept = load_soft_targets(cache, key) if options.resume or options.finish else None
    if kept is not None:
        progress(f"distillation: the teachers' probabilities read back from {cache} (resumed run)")
        return ids, labels, soften(kept, options.temperature)
    each: list[np.ndarray] = []
    for teacher in teachers:
        own = teacher_tokenizer(teacher)
        teacher_ids = ids
        if dict(own.vocab.token_to_idx) != dict(tokenizer.vocab.token_to_idx):
            examples = [*parts.train, *augmented]
            teacher_ids = encode(own, examples, options.max_seq_len, options.truncation)
        probs = teacher_probabilities(
            teacher, teacher_ids, max_seq_len=options.max_seq_len, progress=progress
        )
        agree = _agreement(probs, train_labels)
        progress(f"teacher {teacher} agrees with {agree:.1%} of the train labels")
        each.append(probs)
    probs = np.mean(each, axis=0).astype(np.float32)
    if len(each) > 1:
        agree = _agreement(probs, train_labels)
        progress(f"the {len(each)} teachers' mean agrees with {agree:.1%} of the train labels")
    if write_cache:
        save_soft_targets(cache, key, probs)
    return ids, labels, soften(probs, options.temperature)


def layer_targets(
    options: TrainOptions, model: Any, tokenizer: Any, ids: list[list[int]], progress: Callable[[str], None]
) -> np.ndarray:
    """The unit-length targets [n, student layers, student width] of intermediate-layer distillation: the
    first teacher's [CLS] states on every transfer sequence, on their top principal directions."""
    teacher = options.teacher_dirs()[0]
    if dict(teacher_tokenizer(teacher).vocab.token_to_idx) != dict(tokenizer.vocab.token_to_idx):
        raise TrainingError(
            f"--layer-weight: the student reads text with another vocabulary than {teacher}; use a student "
            "on the teacher's tokenizer (--init scratch) or drop --layer-weight"
        )
    config = unwrap(model).config
    states = teacher_cls_states(teacher, ids, int(config.num_hidden_layers), progress=progress)
    return principal_targets(states, int(config.hidden_size))


def _agreement(probs: np.ndarray, labels: np.ndarray) -> float:
    """Share of the gold `labels` that the first len(labels) rows of `probs` pick."""
    return float((probs[: len(labels)].argmax(axis=1) == labels).mean()) if len(labels) else 0.0


def cleaned_train_indices(
    model: Any,
    pad_id: int,
    parts: Split,
    train_ids: list[list[int]],
    train_labels: np.ndarray,
    options: TrainOptions,
    out: Path,
    rank: int,
    progress: Callable[[str], None],
) -> list[int]:
    """The train indices kept by label cleaning (`cleaning.py`); the dropped reviews, with their index in
    the train split, their label and its cross-validated probability, go to `label_cleaning.json` in the
    output directory (written by rank 0; every rank computes the same, deterministic result). A resumed
    run reads the dropped indices back from that file instead of embedding the train split again."""
    if options.resume or options.finish:
        kept = kept_by_earlier_cleaning(out / CLEANING_FILE, options.clean_below, len(train_ids))
        if kept is not None:
            progress(
                f"label cleaning: {len(train_ids) - len(kept)} dropped train reviews read back from "
                f"{out / CLEANING_FILE} (resumed run)"
            )
            return kept
    features = encoder_features(model, train_ids, pad_id, progress=progress)
    result = clean(features, train_labels, len(DEFAULT_LABELS), options.clean_below, options.data_split_seed)
    progress(
        f"label cleaning: dropped {len(result.dropped)} of {len(train_ids)} train reviews whose label a "
        f"{FOLDS}-fold probe gave p < {options.clean_below} (the probe's own accuracy "
        f"{result.probe_accuracy:.1%})"
    )
    if rank == 0:  # the one writer builds the report
        dropped = [
            {
                "train_index": i,
                "text": parts.train[i].text,
                "label": DEFAULT_LABELS[int(train_labels[i])],
                "probability": round(result.own_label_probability[i], 4),
            }
            for i in sorted(result.dropped, key=lambda i: result.own_label_probability[i])
        ]
        report = {**result.summary(), "train_size": len(train_ids), "dropped_reviews": dropped}
        (out / CLEANING_FILE).write_text(json.dumps(report, ensure_ascii=False, indent=1), encoding="utf-8")
    return result.kept
