"""Offline labelling of review files (the `predict` command): no Kafka, the worker's pipelined path.

The rows come from `review_files.ReviewFile` (TXT, CSV, JSONL; the text and id columns named), bad rows by
the rules the worker decodes with. This thread reads the next chunk of rows while the Labeller (the worker's
engine) labels the current one (token-budget, length-grouped batches on the model lanes); at most two chunks
are in flight, so memory stays bounded whatever the input's size. One output row per input row, in input
order, each with its id (the row's, else its line number) and line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any, TextIO

from schemas.review_input import Review
from worker.files.review_files import BadRow, FileReview, Row, text_lines
from worker.inference.classifier import InferenceFailure, Output
from worker.inference.label_fields import label_fields
from worker.labelling.in_order import InOrder
from worker.labelling.labeller import Labeller

_CHUNK_ROWS = 512
_QUEUED_CHUNKS = 2


def predict_rows(
    labeller: Labeller, rows: Iterable[Row], *, on_chunk: Callable[[int], None] | None = None
) -> Iterator[dict[str, Any]]:
    """One output dict per row, in input order: `id`, `line`, and the `text` with its label, or an `error`
    kind with its `reason` (a bad row's, or the model's). `labeller` is started for the rows unless it
    already runs (`predict` starts it with the settings' batch options).

    `on_chunk(n)` is called after the outputs of each chunk of `n` rows are yielded (progress)."""
    source = iter(rows)
    chunks = iter(lambda: list(islice(source, _CHUNK_ROWS)), [])
    with labeller.session(warm_up=False):
        in_order: InOrder[list[Row]] = InOrder(labeller, capacity=_QUEUED_CHUNKS)
        reviews = (
            (chunk, [_review(row) for row in chunk if isinstance(row, FileReview)]) for chunk in chunks
        )
        for chunk, predictions in in_order.pipeline(reviews):
            yield from _outputs(chunk, predictions.outputs, labeller.labels)
            if on_chunk is not None:
                on_chunk(len(chunk))


def predict_lines(
    labeller: Labeller, lines: Iterable[str], *, max_text_chars: int = 10_000, **options: Any
) -> Iterator[dict[str, Any]]:
    """`predict_rows` of text lines, one review per line (as a TXT file)."""
    return predict_rows(labeller, text_lines(lines, max_text_chars), **options)


def _review(row: FileReview) -> Review:
    """The row as the Labeller takes it: its id (else its line number) and text."""
    return Review(row.id if row.id is not None else str(row.line), row.text, {})


def _outputs(chunk: list[Row], outputs: list[Output], labels: list[str]) -> Iterator[dict[str, Any]]:
    predictions = iter(outputs)
    for row in chunk:
        where = {"id": row.id if row.id is not None else str(row.line), "line": row.line}
        if isinstance(row, BadRow):
            yield {**where, "error": row.kind, "reason": row.reason}
            continue
        output = next(predictions)
        if isinstance(output, InferenceFailure):
            yield {**where, "text": row.text, "error": output.kind.value, "reason": output.reason}
            continue
        yield {**where, "text": row.text, **label_fields(output, labels)}


class ProgressBar:
    """`[#########-----------]  45%  9,216 lines  1,234 lines/s` on `stream`, redrawn at most every
    `every_s` seconds and once more at `finish()`."""

    def __init__(
        self,
        total: int,
        stream: TextIO,
        *,
        width: int = 30,
        every_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._total = max(1, total)
        self._stream = stream
        self._width = width
        self._every_s = every_s
        self._clock = clock
        self._started = clock()
        self._drawn_at = float("-inf")
        self.lines = 0

    def update(self, done: int, lines: int) -> None:
        """`done` of `total` units (bytes) so far, `lines` more lines finished."""
        self.lines += lines
        now = self._clock()
        if now - self._drawn_at >= self._every_s:
            self._draw(done, now)

    def finish(self, done: int) -> None:
        self._draw(done, self._clock())
        self._stream.write("\n")
        self._stream.flush()

    def _draw(self, done: int, now: float) -> None:
        self._drawn_at = now
        share = min(1.0, done / self._total)
        filled = round(share * self._width)
        rate = self.lines / (now - self._started) if now > self._started else 0.0
        bar = "#" * filled + "-" * (self._width - filled)
        self._stream.write(f"\r[{bar}] {share:4.0%}  {self.lines:,} lines  {rate:,.0f} lines/s")
        self._stream.flush()
