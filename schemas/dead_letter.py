"""The dead-letter contract: what the worker writes to the DLQ topic and how to read it back.

A dead letter keeps the original record's key and value bytes untouched (except one standing in for a record
too large for its topic: no key, no value, kind value_too_large; and one for an offset of a record batch the
consumer could not read: no key, no value, kind undecodable_batch); everything the worker adds is in record
headers named `sentiment.*` (UTF-8 values, integers as decimal strings). Other headers on the record
(for example headers copied from the original record) are ignored by the parser.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Annotated, Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

DLQ_VERSION: Final = 1

HEADER_PREFIX: Final = "sentiment."
HEADER_ERROR_KIND: Final = "sentiment.error.kind"
HEADER_ERROR_REASON: Final = "sentiment.error.reason"
HEADER_SOURCE_TOPIC: Final = "sentiment.source.topic"
HEADER_SOURCE_PARTITION: Final = "sentiment.source.partition"
HEADER_SOURCE_OFFSET: Final = "sentiment.source.offset"
HEADER_SOURCE_TIMESTAMP_MS: Final = "sentiment.source.timestamp_ms"
HEADER_WORKER_ID: Final = "sentiment.worker.id"
HEADER_DLQ_VERSION: Final = "sentiment.dlq.version"

# Header values are bounded so one pathological error cannot bloat the DLQ record.
MAX_REASON_CHARS: Final = 1000


class DeadLetterKind(str, Enum):
    """Why a record was dead-lettered (the `sentiment.error.kind` header value)."""

    EMPTY_VALUE = "empty_value"
    """The value is null (a tombstone) or zero bytes."""
    INVALID_UTF8 = "invalid_utf8"
    """The value is not valid UTF-8."""
    INVALID_JSON = "invalid_json"
    """The value is not valid JSON, or is nested deeper than the configured limit."""
    NOT_AN_OBJECT = "not_an_object"
    """The value is JSON but not an object."""
    MISSING_TEXT = "missing_text"
    """The JSON object has no `text` field."""
    WRONG_TYPE = "wrong_type"
    """`text` is not a string, or `id` is neither a string nor an integer."""
    EMPTY_TEXT = "empty_text"
    """`text` is empty or has no visible character (only whitespace, control or format characters)."""
    TEXT_TOO_LONG = "text_too_long"
    """`text` has more characters than the configured maximum."""
    VALUE_TOO_LARGE = "value_too_large"
    """The record value has more bytes than the configured maximum."""
    NOT_WIRE_FORMAT = "not_wire_format"
    """input_format avro, json_schema or protobuf: the value does not start with the Schema Registry wire
    format's header (magic byte 0, then a 4-byte schema id)."""
    UNKNOWN_SCHEMA = "unknown_schema"
    """The value's header names a schema id the Schema Registry does not hold."""
    INVALID_PAYLOAD = "invalid_payload"
    """The value's bytes after the header do not decode with the schema the header names, decode to
    something other than a record/object/message, or break the value limits (nested too deep, NaN or an
    infinity, too costly to validate)."""
    INVALID_SCHEMA = "invalid_schema"
    """The schema the value's header names cannot be read: not a valid Avro / JSON Schema / `.proto`
    schema, past the schema limits (size, nesting, a `$ref` loop), or with references."""
    DECODE_FAILED = "decode_failed"
    """Decoding the value failed in a way the worker does not recognise (the reason names the error): the
    value is set aside so that it cannot stop its partition."""
    INFERENCE_FAILED = "inference_failed"
    """The model failed on this review even when it was retried alone."""
    TOO_LONG_FOR_MEMORY = "too_long_for_memory"
    """The review alone does not fit the inference memory budget."""
    UNDECODABLE_BATCH = "undecodable_batch"
    """The consumer could not decompress or parse the record batch holding this offset (e.g. it would
    decompress past the consumer's receive limit, or uses a codec the client lacks): no key and no value are
    kept, only the source topic, partition and offset. Every offset of the batch gets one, as far as the
    client could find the batch's end."""


_DecimalInt = Annotated[
    int,
    WithJsonSchema({"type": "string", "pattern": "^-?[0-9]+$"}),
]


def _header(name: str, title: str, description: str, **default: Any) -> Any:
    """A field read from and written to the header `name`."""
    return Field(
        validation_alias=name, serialization_alias=name, title=title, description=description, **default
    )


class DeadLetterInfo(BaseModel):
    """The worker's headers on one dead letter, decoded (v1).

    Field aliases are the header names, so the exported JSON Schema validates the header map
    `{name: value.decode("utf-8")}` of a DLQ record directly; construct it by field name in Python.
    """

    SCHEMA_NAME: ClassVar[str] = "dead-letter-headers"
    SCHEMA_VERSION: ClassVar[int] = DLQ_VERSION

    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        populate_by_name=True,
        title="DeadLetterHeaders",
        json_schema_extra={
            "description": (
                "Headers the sentiment worker adds to each record on the dead-letter topic, as a map of "
                "header name to UTF-8 decoded value (integers as decimal strings). The record key and "
                "value are the original record's bytes, untouched. Other headers may be present."
            ),
        },
    )

    kind: DeadLetterKind = _header(
        HEADER_ERROR_KIND, "Error kind", "Machine-readable error kind; see the enum values."
    )
    reason: str = _header(
        HEADER_ERROR_REASON, "Error reason", "Human-readable reason telling the producer what to fix."
    )
    source_topic: str = _header(HEADER_SOURCE_TOPIC, "Source topic", "Topic of the original record.")
    source_partition: _DecimalInt = _header(
        HEADER_SOURCE_PARTITION, "Source partition", "Partition of the original record (decimal)."
    )
    source_offset: _DecimalInt = _header(
        HEADER_SOURCE_OFFSET, "Source offset", "Offset of the original record (decimal)."
    )
    source_timestamp_ms: _DecimalInt | None = _header(
        HEADER_SOURCE_TIMESTAMP_MS,
        "Source timestamp (ms)",
        "Timestamp of the original record, epoch ms (decimal); absent when it had none.",
        default=None,
    )
    worker_id: str = _header(HEADER_WORKER_ID, "Worker id", "Id of the worker that dead-lettered it.")
    dlq_version: _DecimalInt = _header(
        HEADER_DLQ_VERSION, "DLQ header version", "Version of this header contract (decimal)."
    )


def build_dead_letter_headers(
    kind: DeadLetterKind,
    reason: str,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    worker_id: str,
) -> list[tuple[str, bytes]]:
    """Headers for a dead letter of the record at `topic`/`partition`/`offset`.

    `timestamp_ms` is the original record's timestamp in epoch milliseconds; the header is omitted when it
    is None or negative (librdkafka reports -1 for "no timestamp"). `reason` is truncated to
    MAX_REASON_CHARS characters. Values are UTF-8 bytes.
    """
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[: MAX_REASON_CHARS - 1] + "…"
    headers = [
        (HEADER_ERROR_KIND, DeadLetterKind(kind).value.encode()),
        (HEADER_ERROR_REASON, reason.encode("utf-8", "replace")),
        (HEADER_SOURCE_TOPIC, topic.encode("utf-8", "replace")),
        (HEADER_SOURCE_PARTITION, str(partition).encode()),
        (HEADER_SOURCE_OFFSET, str(offset).encode()),
    ]
    if timestamp_ms is not None and timestamp_ms >= 0:
        headers.append((HEADER_SOURCE_TIMESTAMP_MS, str(timestamp_ms).encode()))
    headers.append((HEADER_WORKER_ID, worker_id.encode("utf-8", "replace")))
    headers.append((HEADER_DLQ_VERSION, str(DLQ_VERSION).encode()))
    return headers


def parse_dead_letter_headers(headers: Iterable[tuple[str, bytes | str | None]] | None) -> DeadLetterInfo:
    """Read the worker's headers back from a DLQ record (`Message.headers()`; None means no headers).

    Headers outside the `sentiment.` prefix are ignored; for a repeated header the last value wins.
    Raises pydantic.ValidationError (a ValueError) when a required header is missing or malformed.
    """
    values: dict[str, str] = {}
    for name, raw in headers or ():
        if not name.startswith(HEADER_PREFIX) or raw is None:
            continue
        values[name] = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    return DeadLetterInfo.model_validate(values)
