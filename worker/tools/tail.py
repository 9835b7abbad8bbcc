"""Reading a topic back for people (the `tail` command): records, flat display rows, a fixed-width table.

Tailing never joins a consumer group and never commits: it assigns the partitions itself, so it cannot
trigger a rebalance in (or move the offsets of) a running worker, even when given the worker's group id.
"""

from __future__ import annotations

import json
import time
import unicodedata
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from pydantic import ValidationError

from schemas.dead_letter import HEADER_ERROR_KIND, parse_dead_letter_headers
from schemas.sentiment_result import SentimentResult
from worker.errors import OperationError

_POLL_S = 0.5
_CONSUME_BATCH = 500


class TailError(OperationError):
    """The topic cannot be read; the message says why and what to check."""


@dataclass(frozen=True)
class TailedRecord:
    """One record read from a topic. `timestamp_ms` is None when the record carries no timestamp."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp_ms: int | None = None


def _consumer_conf(common_conf: dict[str, Any], group_id: str | None, from_beginning: bool) -> dict[str, Any]:
    conf = dict(common_conf)
    conf.update(
        {
            # A group id is required by the client; a throwaway one leaves nothing behind (nothing commits).
            "group.id": group_id or f"sentiment-tail-{uuid.uuid4().hex[:12]}",
            # A tail is read-only: never commit, never store offsets.
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Only records of committed transactions (and no aborted ones) are shown.
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest" if from_beginning else "latest",
            # Never create the topic by asking for it.
            "allow.auto.create.topics": False,
        }
    )
    return conf


def _assignment(
    consumer: Consumer, topic: str, group_id: str | None, from_beginning: bool, timeout_s: float
) -> list[TopicPartition]:
    """Every partition of `topic` with its start offset: the group's committed one when a group is given."""
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        raise TailError(
            f"cannot read metadata of topic {topic!r} within {timeout_s:g} s ({exc.args[0]}); "
            "check bootstrap.servers and that the broker is up"
        ) from exc
    described = metadata.topics.get(topic)
    if described is None or described.error is not None or not described.partitions:
        reason = described.error.str() if described is not None and described.error is not None else "unknown"
        raise TailError(f"topic {topic!r} does not exist ({reason}); create it or check the name")
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    partitions = [TopicPartition(topic, p, start) for p in sorted(described.partitions)]
    if group_id is None:
        return partitions
    committed = consumer.committed(
        [TopicPartition(topic, p.partition) for p in partitions], timeout=timeout_s
    )
    # A negative committed offset means "none": keep the from_beginning start for that partition.
    return [c if c.offset >= 0 else p for p, c in zip(partitions, committed, strict=True)]


def tail_records(
    common_conf: dict[str, Any],
    topic: str,
    *,
    from_beginning: bool = True,
    max_messages: int | None = None,
    idle_exit_s: float | None = 5.0,
    group_id: str | None = None,
    metadata_timeout_s: float = 10.0,
) -> Iterator[TailedRecord]:
    """Yield records of every partition of `topic` (order is kept within a partition) without committing.

    Starts at the beginning (`from_beginning`) or at the end of each partition; with `group_id`, at that
    group's committed offsets where it has some (read only: the group is not joined). Stops after
    `max_messages` records, or when no record arrived for `idle_exit_s` seconds (None = never).
    Only records of committed transactions are read. Raises TailError when the topic does not exist or a
    non-retriable error is reported. Closing the generator closes the consumer.
    """
    if max_messages is not None and max_messages <= 0:
        return
    consumer = Consumer(_consumer_conf(common_conf, group_id, from_beginning))
    try:
        # assign(), not subscribe(): no group membership, so no rebalance and no effect on other members.
        consumer.assign(_assignment(consumer, topic, group_id, from_beginning, metadata_timeout_s))
        count = 0
        last_record_at = time.monotonic()
        while True:
            timeout = _POLL_S
            if idle_exit_s is not None:
                idle_left = idle_exit_s - (time.monotonic() - last_record_at)
                if idle_left <= 0:
                    return
                timeout = min(timeout, idle_left)
            wanted = _CONSUME_BATCH if max_messages is None else min(_CONSUME_BATCH, max_messages - count)
            messages = consumer.consume(num_messages=wanted, timeout=timeout)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF or error.retriable():
                        continue
                    raise TailError(f"reading {topic!r} failed: {error.str()}")
                last_record_at = time.monotonic()
                yield _tailed(message)
                count += 1
                if max_messages is not None and count >= max_messages:
                    return
    finally:
        consumer.close()


def _tailed(message: Any) -> TailedRecord:
    timestamp_type, timestamp = message.timestamp()
    headers = [(name, value) for name, value in (message.headers() or []) if value is not None]
    return TailedRecord(
        topic=message.topic(),
        partition=message.partition(),
        offset=message.offset(),
        key=message.key(),
        value=message.value(),
        headers=headers,
        timestamp_ms=timestamp if timestamp_type != TIMESTAMP_NOT_AVAILABLE and timestamp >= 0 else None,
    )


# --- display rows -------------------------------------------------------------------------------------


def _json_object(value: bytes | None) -> dict[str, Any] | None:
    if not value:
        return None
    try:
        document = json.loads(value)
    except ValueError:  # includes UnicodeDecodeError
        return None
    return document if isinstance(document, dict) else None


def _str_or_none(value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (str, int)):
        return str(value)
    return None


def result_row(
    rec: TailedRecord, fields: dict[str, Any] | None = None, *, text_field: str = "text", id_field: str = "id"
) -> dict[str, Any]:
    """A flat dict for display: kind, id, label, confidence, error, partition, offset, text, reason, key,
    source, metadata (missing fields are None).

    `id` is always the id the worker gives the review, as its result carries it: the input's `id` (a string,
    or an integer as its decimal string), else the input's `topic/partition/offset`; never the message key
    (that is `key`, decoded leniently). `source` is the input's `topic/partition/offset` when the record
    names it (results, dead letters). kind is "result" (a SentimentResult: its `metadata`; a result carries
    no review text, `text` is set only if its metadata holds one), "dead_letter" (has the worker's DLQ
    headers; `error` is the error kind, `reason` its reason, no `label`; id/text read from the original
    value when it is JSON), "review" (a JSON object that is not a result, e.g. the input topic) or "raw"
    (anything else; text = the value decoded leniently). `fields`: the value's record when it is in a
    registry format (`worker.tools.registry_values.ValueReader`), read instead of the value as JSON. A
    review's text and id are read from `text_field` and `id_field` (the worker's), its other fields are its
    `metadata`: a registry value whose fields the worker would not find still shows what it holds.
    """
    row: dict[str, Any] = {
        "kind": "raw",
        "id": None,
        "label": None,
        "confidence": None,
        "error": None,
        "partition": rec.partition,
        "offset": rec.offset,
        "text": None,
        "reason": None,
        "key": rec.key.decode("utf-8", "replace") if rec.key is not None else None,
        "source": None,
        "metadata": None,
    }
    if any(name == HEADER_ERROR_KIND for name, _ in rec.headers):
        row["kind"] = "dead_letter"
        try:
            info = parse_dead_letter_headers(rec.headers)
            row["error"], row["reason"] = info.kind.value, info.reason
            row["source"] = f"{info.source_topic}/{info.source_partition}/{info.source_offset}"
        except ValidationError:
            kind = dict(rec.headers).get(HEADER_ERROR_KIND, b"")
            row["error"], row["reason"] = kind.decode("utf-8", "replace"), "(malformed dead-letter headers)"
        _fill_from_original(row, rec, row["source"], fields, (text_field, id_field))
        return row
    if rec.value:
        try:
            result = (
                SentimentResult.model_validate_json(rec.value) if fields is None else _registry_result(fields)
            )
        except (ValidationError, ValueError):
            pass
        else:
            text = result.metadata.get("text")
            src = result.source
            row.update(
                kind="result",
                id=result.id,
                label=result.label,
                confidence=result.confidence,
                text=text if isinstance(text, str) else None,
                source=f"{src.topic}/{src.partition}/{src.offset}",
                metadata=dict(result.metadata),
            )
            return row
    _fill_from_original(row, rec, f"{rec.topic}/{rec.partition}/{rec.offset}", fields, (text_field, id_field))
    return row


def _registry_result(fields: dict[str, Any]) -> SentimentResult:
    """A result read from Avro or Protobuf (metadata as the text of a JSON object) or JSON Schema."""
    metadata = fields.get("metadata")
    if isinstance(metadata, str):
        fields = {**fields, "metadata": json.loads(metadata)}
    return SentimentResult.model_validate(fields)


def _fill_from_original(
    row: dict[str, Any],
    rec: TailedRecord,
    default_id: str | None,
    fields: dict[str, Any] | None = None,
    names: tuple[str, str] = ("text", "id"),
) -> None:
    """id/text of a review value (JSON object, a registry format's record, or raw bytes) into `row`; marks
    such reviews as "review". `default_id`: the id the worker gives a review without a usable `id` (its
    input position)."""
    document = fields if fields is not None else _json_object(rec.value)
    if document is not None:
        if row["kind"] == "raw":
            row["kind"] = "review"
        text_field, id_field = names
        row["id"] = _str_or_none(document.get(id_field))
        text = document.get(text_field)
        row["text"] = text if isinstance(text, str) else None
        rest = {name: value for name, value in document.items() if name not in (text_field, id_field)}
        if rest or fields is not None:
            row["metadata"] = rest
    elif rec.value is not None:
        row["text"] = rec.value.decode("utf-8", "replace")
    if row["id"] is None:
        row["id"] = default_id


# --- fixed-width table ---------------------------------------------------------------------------------


def char_width(char: str) -> int:
    """Terminal columns of one character: 2 for East Asian wide/fullwidth, 0 for combining marks, else 1."""
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def display_width(text: str) -> int:
    """Terminal columns `text` occupies (see char_width)."""
    return sum(char_width(c) for c in text)


def fit(text: str, width: int) -> str:
    """`text` truncated (with "…") and space-padded to exactly `width` terminal columns.

    Control characters (line breaks, tabs) become spaces so one row stays one line.
    """
    if width <= 0:
        return ""
    clean = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    if display_width(clean) <= width:
        return clean + " " * (width - display_width(clean))
    out: list[str] = []
    used = 0
    for char in clean:
        w = char_width(char)
        if used + w > width - 1:  # keep one column for the ellipsis
            break
        out.append(char)
        used += w
    return "".join(out) + "…" + " " * (width - 1 - used)


_SEP = "  "
# (header, width in terminal columns); a last detail column takes the remaining width.
_FIXED_COLUMNS: tuple[tuple[str, int], ...] = (("P:OFFSET", 10), ("ID", 16), ("LABEL", 23), ("CONF", 5))
_MIN_DETAIL = 10
# The detail column's header for each kind of row (a table of several kinds names them all).
_DETAIL_HEADERS = {
    "result": "INPUT, METADATA (a result has no text)",
    "dead_letter": "REASON | TEXT",
    "review": "TEXT",
    "raw": "TEXT",
}


def _metadata_text(metadata: dict[str, Any]) -> str:
    return " ".join(
        f"{key}={value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
        for key, value in metadata.items()
    )


def _cells(row: dict[str, Any]) -> list[str]:
    partition, offset = row.get("partition"), row.get("offset")
    position = f"{partition}:{offset}" if partition is not None else ""
    confidence = row.get("confidence")
    conf = f"{confidence:.3f}" if isinstance(confidence, (int, float)) else ""
    kind = row.get("kind")
    label = row.get("label") or ""
    if kind == "dead_letter":
        label = f"DLQ {row.get('error') or ''}".strip()
        detail = str(row.get("reason") or "")
        if row.get("text"):
            detail = f"{detail} | {row['text']}"
    elif kind == "result" and not row.get("text"):
        metadata = row.get("metadata") or {}
        detail = " ".join(part for part in (row.get("source") or "", _metadata_text(metadata)) if part)
    else:
        label = label or ("-" if kind == "review" else "")
        detail = str(row.get("text") or "")
    return [position, str(row.get("id") or ""), label, conf, detail]


def _detail_header(rows: Sequence[dict[str, Any]]) -> str:
    """What the detail column holds: one kind's header, or all three for a table of several kinds."""
    holds = {
        _DETAIL_HEADERS["result"]
        if row.get("kind") == "result" and not row.get("text")
        else _DETAIL_HEADERS.get(str(row.get("kind")), "TEXT")
        for row in rows
    }
    return holds.pop() if len(holds) == 1 else "TEXT / REASON / INPUT"


def format_table(rows: Sequence[dict[str, Any]], width: int = 100) -> str:
    """Rows of `result_row` as a fixed-width table `width` terminal columns wide (CJK counts double).

    Columns: partition:offset of the record, ID (the review's id: the input's `id`, else the input's
    topic/partition/offset, as results carry it; never the message key), label (for dead letters
    "DLQ <kind>"), confidence, and a detail column: for a result (which carries no text) the input's
    topic/partition/offset and the metadata passed through; for a dead letter its reason and the original
    text; for a review its text. The header names what the detail column holds. Trailing spaces stripped.
    """
    fixed = [w for _, w in _FIXED_COLUMNS]
    detail_width = max(_MIN_DETAIL, width - sum(fixed) - len(_SEP) * len(fixed))
    widths = [*fixed, detail_width]
    header = [name for name, _ in _FIXED_COLUMNS] + [_detail_header(rows)]
    lines = [_SEP.join(fit(cell, w) for cell, w in zip(header, widths, strict=True)).rstrip()]
    lines.append(_SEP.join("-" * w for w in widths))
    for row in rows:
        lines.append(_SEP.join(fit(cell, w) for cell, w in zip(_cells(row), widths, strict=True)).rstrip())
    return "\n".join(lines)
