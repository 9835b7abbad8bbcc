"""Record values in the Schema Registry wire format (Avro, JSON Schema, Protobuf) → a review, or the reason it
goes to the dead-letter topic; or `RegistryUnavailable` when the registry cannot answer (not bad input: the
caller keeps the window and decodes it again later).

Decoding is confluent-kafka's `schema_registry` serdes with the schema the value's header names (the
writer's schema; the client caches it after the first fetch, so only a new schema id asks the registry).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import jsonschema
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.common._httpx_compat import (
    httpx,
)  # the HTTP client it uses (httpx2 or httpx)
from confluent_kafka.schema_registry.common.protobuf import _init_pool
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.serialization import SerializationError
from google.protobuf import descriptor_pb2, json_format
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtobufMessage
from google.protobuf.message_factory import GetMessageClass

from schemas.dead_letter import DeadLetterKind
from schemas.proto_text import parse_proto
from schemas.review_input import Review
from worker.config import REGISTRY_FORMATS, WorkerSettings
from worker.errors import OperationError
from worker.kafka.decode import DecodeFailure, checked_review, review_id_of
from worker.kafka.wire_format import HEADER_BYTES, json_safe, not_wire_format_reason, schema_id_of

_NOT_FOUND = 404
_SCHEMA_NOT_FOUND_CODE = 40403
SCHEMA_TYPES = {"avro": "AVRO", "json_schema": "JSON", "protobuf": "PROTOBUF"}
"""A registry format → the `schemaType` its schemas have in the registry (Avro's may be left out)."""
FORMAT_OF_SCHEMA_TYPE = {schema_type: fmt for fmt, schema_type in SCHEMA_TYPES.items()}

_PAYLOAD_ERRORS = (
    SerializationError,
    EOFError,
    ValueError,  # includes json.JSONDecodeError and UnicodeDecodeError
    IndexError,
    OverflowError,
    DecodeError,
    jsonschema.ValidationError,
)
"""What the serdes raise for a payload that does not decode with its schema (fastavro reading past the end,
a Protobuf parse error, a JSON document the schema refuses)."""
_UNAVAILABLE = frozenset({401, 403, 408, 429})  # and 5xx: answers about the registry, not about a value


class RegistryUnavailable(OperationError):
    """The Schema Registry did not answer (unreachable, timed out, 5xx, refused our credentials): the value
    is not at fault. `str()` says what happened and what to check."""


def registry_trouble(exc: BaseException, url: str) -> RegistryUnavailable | None:
    """`exc` as the registry being unavailable (unreachable, timed out, overloaded, failing, refusing our
    credentials), or None when it is an answer about what was asked (an unknown schema id, a payload that
    does not decode, a schema refused as incompatible)."""
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


def is_unknown_schema(exc: BaseException) -> bool:
    """True when the registry said it holds no schema of that id (404)."""
    return isinstance(exc, SchemaRegistryError) and (
        exc.http_status_code == _NOT_FOUND or exc.error_code == _SCHEMA_NOT_FOUND_CODE
    )


class _ProtobufReader:
    """Protobuf values as dicts with the writer's message type, built from the registered schema (the
    serdes' `ProtobufDeserializer` needs a compiled message class; a topic's producer owns that, not us)."""

    def __init__(self, client: SchemaRegistryClient) -> None:
        self._client = client
        self._classes: dict[tuple[int, tuple[int, ...]], type[ProtobufMessage]] = {}

    def __call__(self, value: bytes) -> dict[str, Any]:
        schema_id = schema_id_of(value)
        assert schema_id is not None  # checked by the caller
        indexes, payload_at = _message_indexes(value, HEADER_BYTES)
        message_class = self._classes.get((schema_id, indexes))
        if message_class is None:
            message_class = self._message_class(schema_id, indexes)
            self._classes[(schema_id, indexes)] = message_class
        message = message_class()
        message.ParseFromString(value[payload_at:])
        # Fields at their default ("" text, 0 id) are kept: an empty text is empty_text, not missing_text.
        document = json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
        return dict(document)

    def _message_class(self, schema_id: int, indexes: tuple[int, ...]) -> type[ProtobufMessage]:
        schema: Schema = self._client.get_schema(schema_id, fmt="serialized")
        file_proto = _file_descriptor(schema.schema_str or "")
        pool = DescriptorPool()
        _init_pool(pool)
        pool.Add(file_proto)
        # The indexes walk the declarations: the n-th top-level message, then its m-th nested one, ...
        message = file_proto.message_type[indexes[0]]
        name = f"{file_proto.package}.{message.name}" if file_proto.package else message.name
        for index in indexes[1:]:
            message = message.nested_type[index]
            name = f"{name}.{message.name}"
        return GetMessageClass(pool.FindMessageTypeByName(name))  # type: ignore[no-any-return]


def _file_descriptor(schema_str: str) -> descriptor_pb2.FileDescriptorProto:
    """A registered Protobuf schema: the serialized descriptor in base64 (what `format=serialized` asks
    for), or `.proto` text (what registries keep, and some return whatever the format asked)."""
    try:
        return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema_str, validate=True))
    except (ValueError, DecodeError):  # binascii.Error is a ValueError
        return parse_proto(schema_str)


def _message_indexes(value: bytes, at: int) -> tuple[tuple[int, ...], int]:
    """Protobuf wire format: after the 5-byte header, a zig-zag varint count of message indexes and the
    indexes themselves (a count of 0 means the first message, [0]). Returns the indexes and where the
    payload starts."""
    count, at = _zigzag_varint(value, at)
    if count == 0:
        return (0,), at
    indexes = []
    for _ in range(count):
        index, at = _zigzag_varint(value, at)
        indexes.append(index)
    return tuple(indexes), at


def _zigzag_varint(value: bytes, at: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if at >= len(value):
            raise ValueError("value ends inside the message index list")
        byte = value[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at
        shift += 7


def _no_subject(ctx: object, record_name: object) -> None:
    """The deserializers' subject: none (the header's schema id is all they need)."""
    return None


class RegistryDecoder:
    """Decodes values in one registry format with one client (its schema cache shared by every window)."""

    def __init__(
        self,
        client: SchemaRegistryClient,
        input_format: str,
        *,
        url: str,
        text_field: str = "text",
        id_field: str = "id",
        max_value_bytes: int,
        max_text_chars: int,
    ) -> None:
        self._client = client
        self._format = input_format
        self._url = url
        self._text_field = text_field
        self._id_field = id_field
        self._max_value_bytes = max_value_bytes
        self._max_text_chars = max_text_chars
        self._read: Callable[[bytes], Any]
        # Called without a SerializationContext: the schema is the writer's (the header's id), so no
        # subject is looked up and no data-contract rules run.
        conf = {"subject.name.strategy": _no_subject}
        if input_format == "avro":
            self._read = AvroDeserializer(client, conf=conf)
        elif input_format == "json_schema":
            self._read = JSONDeserializer(None, schema_registry_client=client, conf=conf)
        elif input_format == "protobuf":
            self._read = _ProtobufReader(client)
        else:
            raise ValueError(
                f"not a registry format: {input_format!r}; expected avro, json_schema or protobuf"
            )

    def fields(self, value: bytes) -> dict[str, Any] | None:
        """A wire-format value's record as JSON-able fields; None when it does not decode (an unknown
        schema id, a payload that does not fit it). Raises `RegistryUnavailable`."""
        try:
            document = self._read(value)
        except (httpx.TransportError, SchemaRegistryError) as exc:
            trouble = registry_trouble(exc, self._url)
            if trouble is not None:
                raise trouble from exc
            return None
        except _PAYLOAD_ERRORS:
            return None
        return json_safe(document) if isinstance(document, dict) else None

    def decode(self, value: bytes | None, default_id: str) -> Review | DecodeFailure:
        """One value: a review, or a dead letter's kind and reason. Raises `RegistryUnavailable`."""
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
        try:
            # The client caches the schema by id: a dictionary look-up after the first value of an id.
            schema_type = (self._client.get_schema(schema_id).schema_type or "AVRO").upper()
            if schema_type != SCHEMA_TYPES[self._format]:
                written = FORMAT_OF_SCHEMA_TYPE.get(schema_type, schema_type)
                return DecodeFailure(
                    DeadLetterKind.INVALID_PAYLOAD,
                    f"value names schema id {schema_id}, which is {written}, and this worker reads "
                    f"{self._format}: produce {self._format}, or set SENTIMENT_INPUT_FORMAT={written}",
                )
            document = self._read(value)
        except (httpx.TransportError, SchemaRegistryError) as exc:
            trouble = registry_trouble(exc, self._url)
            if trouble is not None:
                raise trouble from exc
            if is_unknown_schema(exc):
                return DecodeFailure(
                    DeadLetterKind.UNKNOWN_SCHEMA,
                    f"value names schema id {schema_id}, which the Schema Registry at {self._url} does not "
                    "hold: produce with a serializer registered in this registry",
                )
            raise
        except _PAYLOAD_ERRORS as exc:  # anything else is a fault of ours: it stops the worker, loudly
            return DecodeFailure(
                DeadLetterKind.INVALID_PAYLOAD,
                f"value does not decode as {self._format} with schema id {schema_id} "
                f"({type(exc).__name__}: {str(exc)[:200]}): produce it with that schema's serializer",
            )
        return review_of_record(
            document,
            input_format=self._format,
            schema_id=schema_id,
            default_id=default_id,
            text_field=self._text_field,
            id_field=self._id_field,
            max_text_chars=self._max_text_chars,
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
) -> Review | DecodeFailure:
    """A decoded record (`document`, written with schema `schema_id`) as a review: the text from
    `text_field`, the id from `id_field` (a string or an integer; absent or null: `default_id`), the other
    fields as JSON-able metadata; or the dead letter's kind and reason."""
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
    return checked_review(text, max_text_chars, review_id, json_safe(document))


def registry_decoder(settings: WorkerSettings) -> RegistryDecoder | None:
    """The decoder of a registry input format, with its own client; None for json and text."""
    if settings.input_format not in REGISTRY_FORMATS:
        return None
    conf = settings.schema_registry_conf()
    return RegistryDecoder(
        SchemaRegistryClient(conf),
        settings.input_format,
        url=conf["url"],
        text_field=settings.text_field,
        id_field=settings.id_field,
        max_value_bytes=settings.max_value_bytes,
        max_text_chars=settings.max_text_chars,
    )
