"""Producing review files to a topic, for demos and load tests (the `produce` command).

Whole files or nothing: `check_file` reads the whole file first (`review_files.ReviewFile`, the rules the
worker decodes with) and every bad row is named with its line before anything is sent; the caller sends
nothing, or (asked to skip bad rows) only the good ones. Each good row becomes the message the worker
reads: `{"id": ..., "text": ..., other columns}` under the worker's field names (`MessageFields`), its id as
the record key. `produce_reviews` then sends in file order and says which line to resume from when some
records were not acknowledged.
"""

from __future__ import annotations

import json
import math
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from worker.files.review_files import BadRow, FeedFileError, FileReview, ReviewFile

PROGRESS_INTERVAL_S = 2.0


@dataclass(frozen=True, slots=True)
class FeedRecord:
    """One record to produce: key and value bytes, and the 1-based file line it came from."""

    key: bytes | None
    value: bytes
    line: int


@dataclass(frozen=True, slots=True)
class MessageFields:
    """The JSON field names the worker reads the text and the id from (its `text_field`, `id_field`)."""

    text: str = "text"
    id: str = "id"


@dataclass(frozen=True)
class FileCheck:
    """A whole file, checked: data rows read (from the first line asked for), good ones, the bad ones."""

    read: int
    good: int
    bad: list[BadRow] = field(default_factory=list)

    def refusal(self, name: str, listed: int = 20) -> str:
        """Why nothing was sent, each bad row on its own line (the first `listed`)."""
        rows = "\n".join(f"  {row}" for row in self.bad[:listed])
        more = f"\n  ... and {len(self.bad) - listed} more" if len(self.bad) > listed else ""
        return (
            f"{len(self.bad)} of {self.read} rows cannot be labelled, so nothing was sent; fix them, or pass "
            f"--skip-bad to send the {self.good} good rows:\n{rows}{more}"
        )


def _dumps(document: dict[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


ValueEncoder = Callable[[dict[str, Any]], bytes]
"""A message as a dict → its value bytes in a registry format (see `worker.tools.registry_values`)."""


def _record(
    file: ReviewFile,
    row: FileReview,
    fields: MessageFields,
    raw_text: bool,
    encode: ValueEncoder | None = None,
) -> FeedRecord:
    """The record of a good row: the line's bytes when they already are the message, else the message
    (`encode`d when given: a registry format)."""
    key = row.id.encode("utf-8") if row.id is not None else None
    if encode is None and file.format == "txt":
        return FeedRecord(key, row.raw if raw_text else _dumps({fields.text: row.text}), row.line)
    if (
        encode is None
        and file.format == "jsonl"
        and (file.text_field, file.id_field) == (fields.text, fields.id)
    ):
        return FeedRecord(key, row.raw, row.line)  # byte for byte, as written
    for name in (fields.text, fields.id):
        if name in row.metadata:
            raise FeedFileError(
                file.name,
                row.line,
                f"the field `{name}` would be sent beside the review's own `{name}` (the worker reads text "
                f"and id from `{fields.text}` and `{fields.id}`): rename or drop that column or field",
            )
    document: dict[str, Any] = {fields.id: row.id} if row.id is not None else {}
    document[fields.text] = row.text
    document.update(row.metadata)
    if encode is None:
        return FeedRecord(key, _dumps(document), row.line)
    try:
        return FeedRecord(key, encode(document), row.line)
    except ValueError as exc:
        raise FeedFileError(file.name, row.line, f"the row does not fit the schema: {exc}") from None


def check_file(
    file: ReviewFile,
    fields: MessageFields = MessageFields(),
    *,
    from_line: int = 1,
    encode: ValueEncoder | None = None,
) -> FileCheck:
    """Reads the whole file (rows before `from_line` are not counted) and builds every message, sending
    nothing: the counts and every bad row. FeedFileError when the file cannot be read at all, or a row does
    not fit the schema of `encode`."""
    read = good = 0
    bad: list[BadRow] = []
    for row in file:
        if row.line < from_line:
            continue
        read += 1
        if isinstance(row, BadRow):
            bad.append(row)
        else:
            _record(file, row, fields, raw_text=False, encode=encode)
            good += 1
    return FileCheck(read, good, bad)


def feed_records(
    file: ReviewFile,
    fields: MessageFields = MessageFields(),
    *,
    raw_text: bool = False,
    from_line: int = 1,
    on_bad: Callable[[BadRow], None] | None = None,
    encode: ValueEncoder | None = None,
) -> Iterator[FeedRecord]:
    """The records of the file's good rows from line `from_line` on, lazily, in file order; each bad row
    goes to `on_bad` (check the file first: `check_file`). `raw_text`: a TXT line's bytes as the value
    (for workers with `input_format=text`)."""
    for row in file:
        if row.line < from_line:
            continue
        if isinstance(row, BadRow):
            if on_bad is not None:
                on_bad(row)
            continue
        yield _record(file, row, fields, raw_text, encode)


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
    """Outcome of a produce run: records queued, acknowledged by the broker, failed; wall seconds. When some
    failed, `resume_line` is the first line not acknowledged (everything before it is on the topic) and
    `delivered_after_resume` how many records after it were acknowledged all the same (a resume sends them
    again)."""

    sent: int
    acknowledged: int
    failed: int
    seconds: float
    first_error: str | None = None
    resume_line: int | None = None
    delivered_after_resume: int = 0

    @property
    def rate_per_s(self) -> float:
        """Acknowledged records per second of wall time."""
        return self.acknowledged / self.seconds if self.seconds > 0 else 0.0


class DeliveryTally:
    """Delivery outcomes, written by callbacks (on the calling thread, inside poll/flush)."""

    def __init__(self) -> None:
        self.acknowledged = 0
        self.failed = 0
        self.first_error: str | None = None
        self.last_client_error: str | None = None
        self.outstanding: set[int] = set()  # lines sent, not yet reported (bounded by librdkafka's queue)
        self.acknowledged_lines = array("q")
        self.first_failed_line: int | None = None

    def on_delivery(self, line: int, err: KafkaError | None, _msg: Message) -> None:
        self.outstanding.discard(line)
        if err is None:
            self.acknowledged += 1
            self.acknowledged_lines.append(line)
            return
        self.failed += 1
        if self.first_failed_line is None or line < self.first_failed_line:
            self.first_failed_line = line
        if self.first_error is None:
            self.first_error = err.str()

    def resume_line(self) -> int | None:
        """The first line not acknowledged: failed, or never reported."""
        unreported = min(self.outstanding, default=None)
        candidates = [line for line in (self.first_failed_line, unreported) if line is not None]
        return min(candidates, default=None)

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
    the final flush are counted as failed, and the report says which line to resume from. An error from
    `records` propagates after flushing what was already sent.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    tally = DeliveryTally()
    producer = _idempotent_producer(common_conf, tally)
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
            _send(producer, topic, record, tally)
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
    return _report(tally, sent, failed, seconds)


def _idempotent_producer(common_conf: dict[str, Any], tally: DeliveryTally) -> Producer:
    conf = dict(common_conf)
    conf.update(
        {
            # No duplicates from retries and per-partition order kept (implies acks=all).
            "enable.idempotence": True,
            "linger.ms": 10,
            "error_cb": tally.on_error,
        }
    )
    return Producer(conf)


def _send(producer: Producer, topic: str, record: FeedRecord, tally: DeliveryTally) -> None:
    while True:
        try:
            producer.produce(
                topic, value=record.value, key=record.key, on_delivery=partial(tally.on_delivery, record.line)
            )
            tally.outstanding.add(record.line)
            return
        except BufferError:
            # librdkafka's local queue is full: serve delivery reports to make room, then retry.
            producer.poll(0.1)


def _report(tally: DeliveryTally, sent: int, failed: int, seconds: float) -> ProduceReport:
    resume = tally.resume_line() if failed else None
    return ProduceReport(
        sent=sent,
        acknowledged=tally.acknowledged,
        failed=failed,
        seconds=seconds,
        first_error=tally.first_error,
        resume_line=resume,
        delivered_after_resume=sum(1 for line in tally.acknowledged_lines if line > resume) if resume else 0,
    )


def _flush_or_purge(producer: Producer, tally: DeliveryTally, timeout_s: float) -> None:
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
