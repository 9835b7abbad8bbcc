"""Protobuf values of one writer's schema, read within the limits, as dicts with the writer's message type.

The registered schema (a serialized descriptor in base64, or `.proto` text read by `schemas.proto_text`,
which refuses more than 32 levels of nested declarations) becomes message classes (confluent-kafka's
`ProtobufDeserializer` needs a compiled class; a topic's producer owns that, not us). upb parses a value in C
with its own depth limit (100); `json_format.MessageToDict` then recurses in Python, 3 frames per level, and
writes NaN as the string "NaN". So a message type that can nest deeper than the limit (recursive, or a long
chain of types) or that holds `float`/`double` fields has each parsed value walked first, with a stack:
refused past `max_depth` levels or holding NaN or an infinity (the one number rule, `non_finite_reason`).
"""

from __future__ import annotations

import base64
import math
from typing import Any, Final

from google.protobuf import descriptor_pb2, json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtobufMessage
from google.protobuf.message_factory import GetMessageClass

from schemas.proto_text import parse_proto
from schemas.review_decode import non_finite_reason
from worker.kafka.registry_limits import MAX_SCHEMA_CHARS, SchemaRefused, ValueRefused, reason_of
from worker.kafka.wire_format import HEADER_BYTES

_FLOATS: Final = frozenset({FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE})
_MESSAGE: Final = FieldDescriptor.TYPE_MESSAGE
_MAX_INDEXES: Final = 32  # message indexes in a value's header (nesting of the message it names)


class ProtobufValues:
    """Reads the values of one Protobuf schema (`schema_str`, as the registry holds it). Raises
    `SchemaRefused` when the schema cannot be read."""

    def __init__(self, schema_str: str, *, max_depth: int) -> None:
        if len(schema_str) > MAX_SCHEMA_CHARS:
            raise SchemaRefused(
                f"the Protobuf schema is {len(schema_str):,} characters, more than {MAX_SCHEMA_CHARS:,}: "
                "split it"
            )
        try:
            self._file = _file_descriptor(schema_str)
            self._pool = DescriptorPool()
            self._pool.Add(self._file)
        except Exception as exc:  # noqa: BLE001 - whatever the parser or the pool says, the schema is at fault
            raise SchemaRefused(f"not a Protobuf schema the worker reads ({reason_of(exc)})") from None
        self._max_depth = max_depth
        self._classes: dict[tuple[int, ...], tuple[type[ProtobufMessage], bool]] = {}

    def read(self, value: bytes) -> dict[str, Any]:
        """The value (header and message indexes included) as a dict. Raises `ValueRefused`, DecodeError,
        ValueError or IndexError for bytes that do not fit the schema."""
        indexes, payload_at = _message_indexes(value, HEADER_BYTES)
        known = self._classes.get(indexes)
        if known is None:
            message_class = self._message_class(indexes)
            known = (message_class, _needs_walk(message_class.DESCRIPTOR, self._max_depth))
            self._classes[indexes] = known
        message_class, walk = known
        message = message_class()
        message.ParseFromString(value[payload_at:])
        if walk:
            _check(message, self._max_depth)
        # Fields at their default ("" text, 0 id) are kept: an empty text is empty_text, not missing_text.
        document = json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
        return dict(document)

    def _message_class(self, indexes: tuple[int, ...]) -> type[ProtobufMessage]:
        # The indexes walk the declarations: the n-th top-level message, then its m-th nested one, ...
        message = self._file.message_type[indexes[0]]
        name = f"{self._file.package}.{message.name}" if self._file.package else message.name
        for index in indexes[1:]:
            message = message.nested_type[index]
            name = f"{name}.{message.name}"
        return GetMessageClass(self._pool.FindMessageTypeByName(name))  # type: ignore[no-any-return]


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
    if not 0 < count <= _MAX_INDEXES:
        raise ValueError(f"{count} message indexes in the header, expected 1 to {_MAX_INDEXES}")
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
        if shift > 63:
            raise ValueError("a message index longer than 10 bytes")


def _message_fields(message: Descriptor) -> list[Descriptor]:
    """The message types a message's fields hold (a map's values, not its entries)."""
    held = []
    for field in message.fields:
        if field.type != _MESSAGE:
            continue
        if field.message_type.GetOptions().map_entry:
            value = field.message_type.fields_by_name["value"]
            if value.type == _MESSAGE:
                held.append(value.message_type)
        else:
            held.append(field.message_type)
    return held


def _needs_walk(root: Descriptor, max_depth: int) -> bool:
    """True when a value of `root` may nest more than `max_depth` messages (recursion, a long chain of
    types) or holds a float or double field anywhere (an iterative pass over the type graph)."""
    depth: dict[str, int] = {}
    on_path: set[str] = set()
    stack: list[tuple[Descriptor, bool]] = [(root, False)]
    while stack:
        message, done = stack.pop()
        name = message.full_name
        held = _message_fields(message)
        if done:
            on_path.discard(name)
            depth[name] = 1 + max((depth[m.full_name] for m in held), default=0)
            continue
        if name in depth:
            continue
        if any(field.type in _FLOATS for field in message.fields) or any(
            f.message_type.GetOptions().map_entry and f.message_type.fields_by_name["value"].type in _FLOATS
            for f in message.fields
            if f.type == _MESSAGE
        ):
            return True
        on_path.add(name)
        stack.append((message, True))
        for child in held:
            if child.full_name in on_path:
                return True
            if child.full_name not in depth:
                stack.append((child, False))
    return depth[root.full_name] > max_depth


def _check(root: ProtobufMessage, max_depth: int) -> None:
    """Refuses a parsed message nested more than `max_depth` messages deep or holding NaN or an infinity
    in a float or double field (a stack, not recursion)."""
    stack: list[tuple[ProtobufMessage, int]] = [(root, 1)]
    while stack:
        message, depth = stack.pop()
        if depth > max_depth:
            raise ValueRefused(
                f"the value is nested more than {max_depth} messages deep (SENTIMENT_MAX_JSON_DEPTH, at most "
                "64 for registry formats): send flatter messages"
            )
        for field, value in message.ListFields():
            if field.type == _MESSAGE:
                if field.message_type.GetOptions().map_entry:
                    entry_value = field.message_type.fields_by_name["value"]
                    values = list(value.values())
                    if entry_value.type == _MESSAGE:
                        stack.extend((item, depth + 1) for item in values)
                    elif entry_value.type in _FLOATS:
                        _check_numbers(values)
                elif field.is_repeated:
                    stack.extend((item, depth + 1) for item in value)
                else:
                    stack.append((value, depth + 1))
            elif field.type in _FLOATS:
                _check_numbers(value if field.is_repeated else [value])


def _check_numbers(values: Any) -> None:
    for number in values:
        if not math.isfinite(number):
            name = "NaN" if math.isnan(number) else "Infinity" if number > 0 else "-Infinity"
            raise ValueRefused(non_finite_reason(name))
