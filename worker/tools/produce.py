"""Producing review files to a topic, for demos and load tests (the `produce` command).

Files are checked while they are read: a line that is not what its format promises raises FeedFileError
naming the file and line, so garbage is never produced by accident.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from confluent_kafka import KafkaError, Message, Producer

from worker.errors import ConfigurationError

FeedFormat = Literal["auto", "jsonl", "csv", "txt"]

_SUFFIX_FORMATS: dict[str, Literal["jsonl", "csv", "txt"]] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".txt": "txt",
}
_BOM = b"\xef\xbb\xbf"
PROGRESS_INTERVAL_S = 2.0


class FeedFileError(ConfigurationError, ValueError):
    """A review file cannot be read or holds a bad line; `line` is 1-based (None: the whole file)."""

    def __init__(self, path: Path, line: int | None, problem: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line


@dataclass(frozen=True, slots=True)
class FeedRecord:
    """One record to produce: key and value bytes, and the 1-based file line it came from."""

    key: bytes | None
    value: bytes
    line: int


def _dumps(document: dict[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _key_of(document: Any) -> bytes | None:
    """The record key: the document's `id` (string, or integer as decimal), UTF-8; None when it has none."""
    if not isinstance(document, dict):
        return None
    ident = document.get("id")
    if isinstance(ident, bool) or not isinstance(ident, (str, int)):
        return None
    return str(ident).encode("utf-8")


def _lines(path: Path) -> Iterator[tuple[int, bytes, str]]:
    """(line number, raw bytes without line ending and BOM, decoded text) for every line of `path`."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise FeedFileError(path, None, f"cannot open: {exc.strerror or exc}") from exc
    with handle:
        for number, raw in enumerate(handle, start=1):
            raw = raw.rstrip(b"\r\n")
            if number == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FeedFileError(
                    path, number, f"not valid UTF-8 at byte {exc.start}; save the file as UTF-8"
                ) from exc
            yield number, raw, text


def _read_jsonl(path: Path) -> Iterator[FeedRecord]:
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    for number, raw, text in _lines(path):
        if not text.strip():
            continue
        try:
            document = decoder.decode(text)
        except ValueError as exc:
            hint = ""
            if number == 1 and text.strip() in ("[", "{"):
                hint = " (the file must hold one JSON document per line: JSON Lines, not pretty-printed JSON)"
            raise FeedFileError(path, number, f"not valid JSON: {exc}{hint}") from exc
        yield FeedRecord(key=_key_of(document), value=raw, line=number)


def _read_txt(path: Path, raw_text: bool) -> Iterator[FeedRecord]:
    for number, raw, text in _lines(path):
        if not text.strip():
            continue
        yield FeedRecord(key=None, value=raw if raw_text else _dumps({"text": text}), line=number)


def _read_csv(path: Path) -> Iterator[FeedRecord]:
    try:
        # utf-8-sig drops a BOM; newline="" lets the csv module handle quoted line breaks.
        handle = path.open("r", encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise FeedFileError(path, None, f"cannot open: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.reader(handle)
        start_line = 1
        try:
            header = next(reader, None)
            if header is None:
                raise FeedFileError(path, 1, "empty file; a header row with a `text` column is required")
            header = [name.strip() for name in header]
            problem = _header_problem(header)
            if problem:
                raise FeedFileError(path, 1, problem)
            text_at = header.index("text")
            start_line = reader.line_num + 1
            for row in reader:
                line = start_line
                start_line = reader.line_num + 1
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise FeedFileError(
                        path,
                        line,
                        f"{len(row)} fields but the header has {len(header)}; quote fields "
                        "that contain commas",
                    )
                text = row[text_at]
                if not text.strip():
                    raise FeedFileError(path, line, "empty `text`")
                document: dict[str, Any] = {}
                for name, cell in zip(header, row, strict=True):
                    if name == "id" and cell == "":
                        continue  # no id: the worker derives one from the record coordinates
                    document[name] = cell
                yield FeedRecord(key=_key_of(document), value=_dumps(document), line=line)
        except UnicodeDecodeError as exc:
            raise FeedFileError(
                path, start_line, f"not valid UTF-8 near line {start_line}; save the file as UTF-8"
            ) from exc
        except csv.Error as exc:
            raise FeedFileError(path, reader.line_num, f"malformed CSV: {exc}") from exc


def _header_problem(header: list[str]) -> str | None:
    if "text" not in header:
        return f"the header row must have a `text` column (found: {', '.join(header) or 'nothing'})"
    if any(not name for name in header):
        return "the header row has an empty column name"
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        return f"duplicate column names in the header: {', '.join(duplicates)}"
    return None


def detect_format(path: Path) -> Literal["jsonl", "csv", "txt"]:
    """The file format from the suffix (.jsonl/.ndjson/.json, .csv, .txt); FeedFileError otherwise."""
    found = _SUFFIX_FORMATS.get(path.suffix.lower())
    if found is None:
        raise FeedFileError(
            path,
            None,
            "cannot tell the format from the file name; use .jsonl, .csv or .txt or give it explicitly",
        )
    return found


def read_reviews(path: Path, fmt: FeedFormat = "auto", *, raw_text: bool = False) -> Iterator[FeedRecord]:
    """Records to produce from a review file, lazily, in file order.

    - jsonl: every non-blank line is sent byte for byte after checking it parses as JSON; key = its `id`.
    - csv: a header row with a `text` column is required; `id` (optional, empty = none) becomes the key;
      every other column is copied as a string field of the JSON value (metadata for the worker).
    - txt: every non-blank line is one review, sent as `{"text": line}`, or as the raw line bytes when
      `raw_text` is true (for workers with `input_format=text`). No key.
    A UTF-8 BOM is ignored. Bad content raises FeedFileError with the file and 1-based line number.
    """
    kind = detect_format(path) if fmt == "auto" else fmt
    if kind == "jsonl":
        return _read_jsonl(path)
    if kind == "csv":
        return _read_csv(path)
    if kind == "txt":
        return _read_txt(path, raw_text)
    raise FeedFileError(path, None, f"unknown format {fmt!r}; use auto, jsonl, csv or txt")


class RateLimiter:
    """Paces events at `rate_per_s` by schedule: event n is due at anchor + n / rate.

    Sleeping never accumulates drift because each due time comes from the anchor, not from the previous
    sleep. When the caller falls behind by more than `max_burst_s` (a stall), the schedule is re-anchored
    so the backlog is not sent as one big burst.
    """

    def __init__(
        self,
        rate_per_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
        max_burst_s: float = 1.0,
    ) -> None:
        if not rate_per_s > 0 or math.isinf(rate_per_s):
            raise ValueError(f"rate must be a positive finite number of records per second, got {rate_per_s}")
        self._interval = 1.0 / rate_per_s
        self._clock = clock
        self._sleep = sleep
        self._max_burst_s = max_burst_s
        self._anchor: float | None = None
        self._count = 0

    def wait(self) -> None:
        """Block until the next event is due (the first one is due immediately)."""
        now = self._clock()
        if self._anchor is None:
            self._anchor = now
        due = self._anchor + self._count * self._interval
        if now - due > self._max_burst_s:
            self._anchor, self._count, due = now, 0, now
        # `sleep` may return early (producer.poll returns after serving a callback): loop until due.
        while now < due:
            self._sleep(due - now)
            now = self._clock()
        self._count += 1


@dataclass(frozen=True)
class ProduceReport:
    """Outcome of a produce run: records queued, acknowledged by the broker, failed; wall seconds."""

    sent: int
    acknowledged: int
    failed: int
    seconds: float
    first_error: str | None = None

    @property
    def rate_per_s(self) -> float:
        """Acknowledged records per second of wall time."""
        return self.acknowledged / self.seconds if self.seconds > 0 else 0.0


class _Tally:
    """Delivery outcomes, written by callbacks (on the calling thread, inside poll/flush)."""

    def __init__(self) -> None:
        self.acknowledged = 0
        self.failed = 0
        self.first_error: str | None = None
        self.last_client_error: str | None = None

    def on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.acknowledged += 1
            return
        self.failed += 1
        if self.first_error is None:
            self.first_error = err.str()

    def on_error(self, err: KafkaError) -> None:
        # Client-level errors (e.g. all brokers down) are retried by librdkafka; only shown in progress.
        self.last_client_error = err.str()


def produce_reviews(
    common_conf: dict[str, Any],
    topic: str,
    records: Iterable[FeedRecord],
    *,
    rate_per_s: float | None = None,
    limit: int | None = None,
    progress: Callable[[str], None] | None = None,
    flush_timeout_s: float = 120.0,
) -> ProduceReport:
    """Produce `records` to `topic` with an idempotent producer, in order, and wait for the acks.

    `rate_per_s` paces sends by schedule (None = as fast as possible); `limit` stops after that many
    records. `progress` gets a status line about every 2 s. When librdkafka's queue is full the call
    serves delivery reports and retries. Records not acknowledged within `flush_timeout_s` seconds of
    the final flush are counted as failed. FeedFileError from `records` propagates after flushing what
    was already sent.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    tally = _Tally()
    conf = dict(common_conf)
    conf.update(
        {
            # No duplicates from retries and per-partition order kept (implies acks=all).
            "enable.idempotence": True,
            "linger.ms": 10,
            "error_cb": tally.on_error,
        }
    )
    producer = Producer(conf)
    limiter = RateLimiter(rate_per_s, sleep=producer.poll) if rate_per_s is not None else None
    started = time.monotonic()
    next_progress = started + PROGRESS_INTERVAL_S
    sent = 0

    def status(now: float) -> str:
        elapsed = max(now - started, 1e-9)
        line = (
            f"sent {sent}, acknowledged {tally.acknowledged}, failed {tally.failed} "
            f"in {elapsed:.1f} s ({tally.acknowledged / elapsed:.0f}/s)"
        )
        if tally.last_client_error and tally.acknowledged == 0:
            line += f"; client error: {tally.last_client_error}"
        return line

    try:
        for record in records if limit != 0 else ():
            if limiter is not None:
                limiter.wait()
            while True:
                try:
                    producer.produce(topic, value=record.value, key=record.key, on_delivery=tally.on_delivery)
                    break
                except BufferError:
                    # librdkafka's local queue is full: serve delivery reports to make room, then retry.
                    producer.poll(0.1)
            sent += 1
            producer.poll(0)
            now = time.monotonic()
            if progress is not None and now >= next_progress:
                progress(status(now))
                next_progress = now + PROGRESS_INTERVAL_S
            if limit is not None and sent >= limit:
                break  # before reading another line, which might be a bad one
    finally:
        _flush_or_purge(producer, tally, flush_timeout_s)
    seconds = time.monotonic() - started
    # Anything neither acknowledged nor reported failed (a purge that did not report back) is lost too.
    failed = sent - tally.acknowledged
    if progress is not None and seconds >= PROGRESS_INTERVAL_S:
        progress(status(time.monotonic()))
    return ProduceReport(
        sent=sent,
        acknowledged=tally.acknowledged,
        failed=failed,
        seconds=seconds,
        first_error=tally.first_error,
    )


def _flush_or_purge(producer: Producer, tally: _Tally, timeout_s: float) -> None:
    """Wait up to `timeout_s` for every delivery report; then give up on the rest, reported as failed."""
    remaining = producer.flush(timeout_s)
    if not remaining:
        return
    if tally.first_error is None:
        tally.first_error = f"{remaining} records not acknowledged within {timeout_s:g} s" + (
            f" (last client error: {tally.last_client_error})" if tally.last_client_error else ""
        )
    # Purged records get failed delivery reports, so the producer can be closed without waiting on them.
    producer.purge(in_queue=True, in_flight=True)
    producer.flush(5.0)
