"""The labelled rows `adapt` learns from, read like `produce` and `predict` read a file
(`review_files.ReviewFile`: encoding, columns, the one odd-row rule) and labelled by a `LabelRule`.

The odd-row rule, as `produce` applies it: the whole file is read first and every bad row is named with its
line; nothing is used unless every row is good, or the caller asked to skip the bad ones. A row is bad by
the reader's rules (empty text, too long, wrong number of CSV fields, not UTF-8) or because its label cell
is missing or not a label (a word or rating `LabelRule` does not know). A rating between the thresholds is
not bad: it is dropped on purpose and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.files.review_files import BadRow, FeedFileError, ReviewFile
from worker.training.adapt_labels import LabelRule
from worker.training.corpus import NEGATIVE, LabeledText, dedupe

LABEL_PROBLEM = "invalid_label"
"""The kind of a row whose label cell is missing or not a label."""


@dataclass(frozen=True)
class LabelledRows:
    """A file read for `adapt`: the unique labelled reviews, and how many rows went where."""

    examples: list[LabeledText]
    read: int
    middle_dropped: int
    repeats: int
    conflicts: int
    bad: list[BadRow] = field(default_factory=list)

    def describe(self, name: str, rule: LabelRule) -> str:
        """One line: rows read, the labels found, what was dropped and why."""
        negatives = sum(1 for ex in self.examples if ex.label_id == NEGATIVE)
        middle = f", {self.middle_dropped} middle ratings dropped" if rule.rating else ""
        bad = f", {len(self.bad)} bad rows skipped" if self.bad else ""
        return (
            f"{name}: {self.read} rows; {rule.describe()}; {negatives} negative + "
            f"{len(self.examples) - negatives} positive unique reviews{middle}, {self.repeats} repeats and "
            f"{self.conflicts} texts with both labels dropped{bad}"
        )

    def refusal(self, name: str, listed: int = 20) -> str:
        """Why nothing was used: each bad row on its own line (the first `listed`)."""
        rows = "\n".join(f"  {row}" for row in self.bad[:listed])
        more = f"\n  ... and {len(self.bad) - listed} more" if len(self.bad) > listed else ""
        good = self.read - len(self.bad)
        return (
            f"{len(self.bad)} of {self.read} rows cannot be used, so nothing was trained; fix them, or pass "
            f"--skip-bad to learn from the {good} good rows:\n{rows}{more}"
        )


def read_labelled(file: ReviewFile, rule: LabelRule, *, skip_bad: bool = False) -> LabelledRows:
    """Every row of `file` labelled by `rule`. FeedFileError when the file cannot be read, has no label
    column, or holds bad rows and `skip_bad` is false (each bad row named)."""
    if file.format == "txt":
        raise FeedFileError(file.name, None, "a TXT file has no label column: use a CSV or JSONL file")
    pairs: list[tuple[str, int]] = []
    bad: list[BadRow] = []
    read = middle = 0
    for row in file:
        read += 1
        if isinstance(row, BadRow):
            bad.append(row)
            continue
        if rule.field not in row.metadata:
            if file.format == "csv":
                raise FeedFileError(
                    file.name, 1, f"the header row has no `{rule.field}` column: name the column that holds "
                    "the label with --label-field, or the rating with --rating-field",
                )  # fmt: skip
            bad.append(BadRow(row.line, LABEL_PROBLEM, f'no "{rule.field}" field', row.id))
            continue
        try:
            label = rule.label_of(row.metadata[rule.field])
        except ValueError as exc:
            bad.append(BadRow(row.line, LABEL_PROBLEM, str(exc), row.id))
            continue
        if label is None:
            middle += 1
            continue
        pairs.append((row.text.strip(), label))
    examples, repeats, conflicts = dedupe(pairs)
    rows = LabelledRows(examples, read, middle, repeats, conflicts, bad)
    if bad and not skip_bad:
        raise FeedFileError(file.name, None, rows.refusal(file.name))
    if not examples:
        raise FeedFileError(file.name, None, "no labelled reviews left to learn from")
    return rows
