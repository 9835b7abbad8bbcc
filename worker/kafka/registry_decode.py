"""Record values in the Schema Registry wire format (Avro, JSON Schema, Protobuf) → a review, or the reason it
goes to the dead-letter topic; or `RegistryUnavailable` when the registry cannot answer (not bad input: the
caller keeps the window and decodes it again later).

Total: whatever a value holds, decoding it ends in a review or a dead letter, never an exception for the
window (a poison value cannot stop its partition). Each schema id is asked once (`registry_client`, a deadline
per answer) and read once into a reader of its format within the limits (`avro_values`, `json_schema_values`,
`protobuf_values`, `registry_limits`), kept for the next values of that id; a schema that cannot be read is
kept as the dead letter its values get (`invalid_schema`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Final, Protocol

import jsonschema
from confluent_kafka.schema_registry.common._httpx_compat import (
    httpx,
)  # the HTTP client confluent-kafka's registry client uses (httpx2 or httpx)
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf.message import DecodeError

from schemas.dead_letter import DeadLetterKind
from schemas.review_decode import DecodeFailure, checked_review, review_id_of
from schemas.review_input import Review
from worker.config import REGISTRY_FORMATS, LimitsSettings, RegistrySettings
from worker.kafka.avro_values import AvroValues
from worker.kafka.json_schema_values import JsonSchemaValues, schema_error_reason
from worker.kafka.protobuf_values import ProtobufValues
from worker.kafka.registry_client import (
    OversizedSchema,
    RegisteredSchema,
    RegistryClient,
    RegistryUnavailable,
    RegistryWaitStopped,
    UnknownSchemaId,
)
from worker.kafka.registry_limits import (
    MAX_VALUE_DEPTH,
    SchemaRefused,
    ValueRefused,
    plain_json,
    reason_of,
    value_depth,
)
from worker.kafka.wire_format import not_wire_format_reason, schema_id_of

__all__ = [
    "FORMAT_OF_SCHEMA_TYPE",
    "SCHEMA_TYPES",
    "RegistryDecoder",
    "RegistryUnavailable",
    "RegistryWaitStopped",
    "SchemaReaders",
    "registry_decoder",
    "registry_trouble",
    "review_of_record",
]

log = logging.getLogger(__name__)

SCHEMA_TYPES = {"avro": "AVRO", "json_schema": "JSON", "protobuf": "PROTOBUF"}
"""A registry format → the `schemaType` its schemas have in the registry (Avro's may be left out)."""
FORMAT_OF_SCHEMA_TYPE = {schema_type: fmt for fmt, schema_type in SCHEMA_TYPES.items()}

_PAYLOAD_ERRORS = (
    EOFError,
    ValueError,  # includes json.JSONDecodeError, UnicodeDecodeError and ValueRefused
    IndexError,
    OverflowError,
    ArithmeticError,  # decimal conversions
    DecodeError,
    jsonschema.ValidationError,
)
"""What the readers raise for a payload that does not fit its schema (fastavro reading past the end, a
Protobuf parse error, a JSON document the schema refuses): `invalid_payload`. Any other exception is
`decode_failed`."""
_READERS_KEPT: Final = 1024  # schema ids whose reader (or refusal) is kept
_UNAVAILABLE = frozenset({401, 403, 408, 429})  # and 5xx: answers about the registry, not about a value


def registry_trouble(exc: BaseException, url: str) -> RegistryUnavailable | None:
    """An exception of confluent-kafka's registry client (start-up, `doctor`, `produce`) as the registry
    being unavailable (unreachable, timed out, overloaded, failing, refusing our credentials), or None when
    it is an answer about what was asked (an unknown subject, a schema refused as incompatible)."""
    if isinstance(exc, httpx.TransportError):
        return RegistryUnavailable(
            f"Schema Registry at {url} cannot be reached ({type(exc).__name__}: {exc}): start it or fix "
            "SENTIMENT_SCHEMA_REGISTRY_URL; the worker retries"
        )
    if isinstance(exc, SchemaRegistryError) and (
        exc.http_status_code in _UNAVAILABLE or exc.http_status_code >= 500 or exc.http_status_code < 0
    ):
        status = exc.http_status_code
        fix = (
            "check SENTIMENT_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO"
            if status in (401, 403)
            else "the worker retries"
        )
        return RegistryUnavailable(f"Schema Registry at {url} answered {status} ({exc.error_message}): {fix}")
    return None


class _Reader(Protocol):
    def read(self, value: bytes) -> Any: ...


_READER_TYPES: dict[str, Callable[..., _Reader]] = {
    "avro": AvroValues,
    "json_schema": JsonSchemaValues,
    "protobuf": ProtobufValues,
}


class SchemaReaders:
    """Per schema id, what reads its values: `(format, reader)`, or the `DecodeFailure` all its values get
    (an unknown id for `UNKNOWN_ID_TTL_S`, a schema that cannot be read for good). Built on first use from
    the registry's answer, kept for the next values (at most 1,024 ids; the oldest goes first)."""

    def __init__(self, client: RegistryClient, *, max_depth: int) -> None:
        self.client = client
        self.max_depth = max_depth
        self._readers: dict[int, tuple[str, _Reader] | DecodeFailure] = {}

    def reader(self, schema_id: int) -> tuple[str, _Reader] | DecodeFailure:
        """Raises `RegistryUnavailable` when the registry cannot answer for a schema not kept yet."""
        known = self._readers.get(schema_id)
        if known is not None:
            return known
        try:
            registered = self.client.schema(schema_id)
        except UnknownSchemaId:  # the client remembers it for a while; not kept here
            return DecodeFailure(
                DeadLetterKind.UNKNOWN_SCHEMA,
                f"value names schema id {schema_id}, which the Schema Registry at {self.client.url} does not "
                "hold: produce with a serializer registered in this registry",
            )
        except OversizedSchema as exc:
            known = _invalid_schema(schema_id, str(exc))
        else:
            known = self._built(registered)
        if len(self._readers) >= _READERS_KEPT:
            del self._readers[next(iter(self._readers))]
        self._readers[schema_id] = known
        return known

    def _built(self, registered: RegisteredSchema) -> tuple[str, _Reader] | DecodeFailure:
        fmt = FORMAT_OF_SCHEMA_TYPE.get(registered.schema_type)
        if fmt is None:
            return DecodeFailure(
                DeadLetterKind.INVALID_SCHEMA,
                f"value names schema id {registered.schema_id}, of type {registered.schema_type[:40]!r}, "
                "which is none of AVRO, JSON, PROTOBUF: produce avro, json_schema or protobuf",
            )
        if registered.references:
            return _invalid_schema(
                registered.schema_id,
                f"it references {registered.references} other schema(s); schemas with references are not "
                "read: register it self-contained",
            )
        try:
            return fmt, _READER_TYPES[fmt](registered.schema_str, max_depth=self.max_depth)
        except SchemaRefused as exc:
            return _invalid_schema(registered.schema_id, str(exc))
        except Exception as exc:  # noqa: BLE001 - anything reading a schema fails on is the schema's
            return _invalid_schema(registered.schema_id, f"reading it failed ({reason_of(exc)})")


def _invalid_schema(schema_id: int, why: str) -> DecodeFailure:
    return DecodeFailure(
        DeadLetterKind.INVALID_SCHEMA,
        f"value names schema id {schema_id}, which cannot be read: {why}; register a schema within the "
        "limits (docs/schema-registry.md) and produce with it",
    )


class RegistryDecoder:
    """Decodes values in one registry format with one client (its schema readers kept across windows)."""

    def __init__(
        self,
        client: RegistryClient,
        input_format: str,
        *,
        text_field: str = "text",
        id_field: str = "id",
        max_value_bytes: int,
        max_text_chars: int,
        max_json_depth: int = 32,
    ) -> None:
        if input_format not in SCHEMA_TYPES:
            raise ValueError(
                f"not a registry format: {input_format!r}; expected avro, json_schema or protobuf"
            )
        self._readers = SchemaReaders(client, max_depth=value_depth(max_json_depth))
        self._format = input_format
        self._url = client.url
        self._text_field = text_field
        self._id_field = id_field
        self._max_value_bytes = max_value_bytes
        self._max_text_chars = max_text_chars
        self._failures_logged: set[str] = set()

    def decode(self, value: bytes | None, default_id: str) -> Review | DecodeFailure:
        """One value: a review, or a dead letter's kind and reason; never raises for the value. Raises
        `RegistryUnavailable` when the registry cannot answer for a schema not read yet."""
        if value is None or not value:
            what = "null (a tombstone)" if value is None else "empty (0 bytes)"
            return DecodeFailure(DeadLetterKind.EMPTY_VALUE, f"value is {what}: send a {self._format} record")
        if len(value) > self._max_value_bytes:
            return DecodeFailure(
                DeadLetterKind.VALUE_TOO_LARGE,
                f"value is {len(value)} bytes, more than the limit of {self._max_value_bytes} bytes: "
                "send shorter reviews (split long ones)",
            )
        schema_id = schema_id_of(value)
        if schema_id is None:
            return DecodeFailure(DeadLetterKind.NOT_WIRE_FORMAT, not_wire_format_reason(value, self._format))
        known = self._readers.reader(schema_id)
        if isinstance(known, DecodeFailure):
            return known
        fmt, reader = known
        if fmt != self._format:
            return DecodeFailure(
                DeadLetterKind.INVALID_PAYLOAD,
                f"value names schema id {schema_id}, which is {fmt}, and this worker reads "
                f"{self._format}: produce {self._format}, or set SENTIMENT_INPUT_FORMAT={fmt}",
            )
        try:
            return review_of_record(
                reader.read(value),
                input_format=self._format,
                schema_id=schema_id,
                default_id=default_id,
                text_field=self._text_field,
                id_field=self._id_field,
                max_text_chars=self._max_text_chars,
                max_depth=self._readers.max_depth,
            )
        except RegistryUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - totality: a value's failure is its own dead letter
            return self._failure(exc, schema_id)

    def _failure(self, exc: Exception, schema_id: int) -> DecodeFailure:
        if isinstance(exc, ValueRefused):
            return DecodeFailure(
                DeadLetterKind.INVALID_PAYLOAD, f"value decodes with schema id {schema_id}, but {exc}"
            )
        if isinstance(exc, _PAYLOAD_ERRORS):
            detail = schema_error_reason(exc)
            return DecodeFailure(
                DeadLetterKind.INVALID_PAYLOAD,
                f"value does not decode as {self._format} with schema id {schema_id} ({detail}): produce "
                "it with that schema's serializer",
            )
        kind = type(exc).__name__
        if kind not in self._failures_logged:  # once per kind of error: a flood must not flood the log
            self._failures_logged.add(kind)
            log.warning("decoding a %s value failed unexpectedly; dead-lettered", self._format, exc_info=exc)
        return DecodeFailure(
            DeadLetterKind.DECODE_FAILED,
            f"decoding the value as {self._format} with schema id {schema_id} failed ({reason_of(exc)}); "
            "it is set aside so its partition goes on: report it with the value",
        )


def review_of_record(
    document: Any,
    *,
    input_format: str,
    schema_id: int,
    default_id: str,
    text_field: str,
    id_field: str,
    max_text_chars: int,
    max_depth: int = MAX_VALUE_DEPTH,
) -> Review | DecodeFailure:
    """A decoded record (`document`, written with schema `schema_id`) as a review: the text from
    `text_field`, the id from `id_field` (a string or an integer; absent or null: `default_id`), the other
    fields as plain JSON metadata (`plain_json`: raises `ValueRefused` past `max_depth` levels, the record
    counting as 1, or for NaN or an infinity); or the dead letter's kind and reason."""
    if not isinstance(document, dict):
        return DecodeFailure(
            DeadLetterKind.INVALID_PAYLOAD,
            f"value decodes with schema id {schema_id} to a {type(document).__name__}, not a record: "
            f"the schema must be a record with a {json.dumps(text_field)} string field",
        )
    document = dict(document)
    if text_field not in document:
        return DecodeFailure(
            DeadLetterKind.MISSING_TEXT,
            f"{input_format} record (schema id {schema_id}) has no {json.dumps(text_field)} field: "
            "add it to the schema, or set SENTIMENT_TEXT_FIELD to the field holding the text",
        )
    text = document.pop(text_field)
    if not isinstance(text, str):
        return DecodeFailure(
            DeadLetterKind.WRONG_TYPE,
            f"{json.dumps(text_field)} is {'null' if text is None else type(text).__name__} in "
            f"schema id {schema_id}'s record, expected a string",
        )
    raw_id = document.pop(id_field, None)
    review_id = review_id_of(raw_id, default_id, id_field, lambda value: f"a {type(value).__name__}")
    if isinstance(review_id, DecodeFailure):
        return review_id
    return checked_review(text, max_text_chars, review_id, plain_json(document, max_depth))


def registry_decoder(
    registry: RegistrySettings, limits: LimitsSettings, stop: threading.Event | None = None
) -> RegistryDecoder | None:
    """The decoder of a registry input format, with its own client (its waits given up when `stop` is
    set); None for json and text."""
    if registry.input_format not in REGISTRY_FORMATS:
        return None
    return RegistryDecoder(
        RegistryClient.from_conf(registry.schema_registry_conf(), stop=stop),
        registry.input_format,
        text_field=registry.text_field,
        id_field=registry.id_field,
        max_value_bytes=limits.max_value_bytes,
        max_text_chars=limits.max_text_chars,
        max_json_depth=limits.max_json_depth,
    )
