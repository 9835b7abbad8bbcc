"""Offline labelling of text lines (the `predict` command): no Kafka, the worker's pipelined path.

This thread reads and decodes the next chunk of lines while the engine (the worker's) labels the current one
(token-budget, length-grouped batches on the model lanes); at most two chunks are in flight, so memory stays
bounded whatever the input's size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from schemas.dead_letter import DeadLetterKind
from worker.inference.engine import Engine, EngineOptions
from worker.inference.in_order import InOrder
from worker.inference.label_fields import label_fields
from worker.inference.labelling import Classifier, InferenceFailure, Output
from worker.stream.decode import DecodedReview, DecodeFailure, decode_review

_CHUNK_LINES = 512
_QUEUED_CHUNKS = 2


@dataclass(frozen=True)
class _Chunk:
    lines: list[tuple[int, str]]
    decoded: list[DecodedReview | DecodeFailure]

    @property
    def texts(self) -> list[str]:
        return [d.text for d in self.decoded if isinstance(d, DecodedReview)]


def predict_lines(
    classifier: Classifier,
    lines: Iterable[str],
    *,
    max_batch_size: int = 32,
    max_batch_tokens: int = 4096,
    max_text_chars: int = 10_000,
    on_chunk: Callable[[int], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """One output dict per input line, in input order: a label, or an `error` kind with its reason.

    `on_chunk(n)` is called after the rows of each chunk of `n` lines are yielded (progress)."""
    numbered = enumerate(lines, start=1)
    chunks = iter(lambda: list(islice(numbered, _CHUNK_LINES)), [])
    engine = Engine(classifier, EngineOptions(max_batch_size, max_batch_tokens), name="predict")
    with engine.start(warm_up=False):
        in_order: InOrder[_Chunk] = InOrder(engine, capacity=_QUEUED_CHUNKS)
        prepared = (_prepare(chunk, max_text_chars) for chunk in chunks)
        for chunk, labelled in in_order.pipeline((chunk, chunk.texts) for chunk in prepared):
            yield from _rows(chunk, labelled.outputs, classifier.labels)
            if on_chunk is not None:
                on_chunk(len(chunk.lines))


def _prepare(lines: list[tuple[int, str]], max_text_chars: int) -> _Chunk:
    decoded: list[DecodedReview | DecodeFailure] = []
    for number, line in lines:
        text = line.rstrip("\r\n")
        review = decode_review(
            text.encode("utf-8", "surrogateescape"),
            input_format="text",
            max_value_bytes=4 * max_text_chars + 4,
            max_text_chars=max_text_chars,
            max_json_depth=1,
            default_id=str(number),
        )
        if isinstance(review, DecodeFailure):
            review = line_failure(number, text, review, max_text_chars)
        decoded.append(review)
    return _Chunk(lines, decoded)


def line_failure(number: int, text: str, failure: DecodeFailure, max_text_chars: int) -> DecodeFailure:
    """`failure` (decode's verdict, worded for a Kafka value) said of line `number` of a text file: what is
    wrong with that line and what to do, with no word of values or JSON. `text`: the line without its line
    break, undecodable bytes as surrogate escapes. An empty line is `empty_text`, like a blank one."""
    where = f"line {number}"
    one_per_line = "write one review per line (or remove the line)"
    kind = failure.kind
    if kind in (DeadLetterKind.EMPTY_VALUE, DeadLetterKind.EMPTY_TEXT):
        what = "is empty" if not text else "holds only whitespace"
        return DecodeFailure(DeadLetterKind.EMPTY_TEXT, f"{where} {what}: {one_per_line}")
    if kind is DeadLetterKind.INVALID_UTF8:
        bad = next((i for i, char in enumerate(text) if "\udc80" <= char <= "\udcff"), None)
        if bad is not None:
            column = len(text[:bad].encode("utf-8", "surrogateescape")) + 1
            byte = ord(text[bad]) - 0xDC00
            return DecodeFailure(
                kind,
                f"{where}: byte {column} (0x{byte:02x}) is not valid UTF-8: "
                "convert the input to UTF-8 (e.g. `iconv -t UTF-8`)",
            )
    if kind in (DeadLetterKind.TEXT_TOO_LONG, DeadLetterKind.VALUE_TOO_LARGE):
        return DecodeFailure(
            DeadLetterKind.TEXT_TOO_LONG,
            f"{where} has {len(text):,} characters, more than the limit of {max_text_chars:,}: shorten it, "
            "or split it into several reviews",
        )
    return DecodeFailure(kind, f"{where}: {failure.reason}")


def _rows(chunk: _Chunk, outputs: list[Output], labels: list[str]) -> Iterator[dict[str, Any]]:
    predictions = iter(outputs)
    for (number, _line), review in zip(chunk.lines, chunk.decoded, strict=True):
        if not isinstance(review, DecodedReview):
            yield {"line": number, "error": review.kind.value, "reason": review.reason}
            continue
        output = next(predictions)
        if isinstance(output, InferenceFailure):
            yield {"line": number, "text": review.text, "error": output.kind.value, "reason": output.reason}
            continue
        yield {"line": number, "text": review.text, **label_fields(output, labels)}


class FileLines:
    """The lines of a file (UTF-8, undecodable bytes kept as surrogate escapes), counting bytes read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.total_bytes = path.stat().st_size
        self.bytes_read = 0

    def __iter__(self) -> Iterator[str]:
        with self.path.open("rb") as raw:
            yield from self._read(raw)

    def _read(self, raw: BinaryIO) -> Iterator[str]:
        for line in raw:
            self.bytes_read += len(line)
            yield line.decode("utf-8", "surrogateescape")


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
