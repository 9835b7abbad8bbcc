"""The registry formats' limits, pure logic: schemas parsed within bounds, values refused before anything
walks them recursively (a 5,000-level value never meets the recursion limit or a C stack), one number rule
with the JSON door, and every failure of one value its own dead letter. Against the broker and the
registry: tests/integration/test_registry_poison.py."""

from __future__ import annotations

import io
import json
import math
import struct
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import jsonschema
import pytest

from schemas.dead_letter import DeadLetterKind
from schemas.proto_text import MAX_NESTING, parse_proto
from schemas.review_decode import DecodeFailure, decode_review, json_depth
from tests.wire_values import NODE_AVRO, varint, zigzag
from worker.kafka.avro_values import MAX_DECIMAL_BYTES, AvroValues
from worker.kafka.json_schema_values import JsonSchemaValues
from worker.kafka.protobuf_values import ProtobufValues
from worker.kafka.registry_decode import review_of_record
from worker.kafka.registry_limits import (
    MAX_SCHEMA_DEPTH,
    SchemaRefused,
    ValueRefused,
    plain_json,
    value_depth,
)
from worker.kafka.wire_format import wire_header

SCORED = {
    "type": "record",
    "name": "Scored",
    "fields": [{"name": "text", "type": "string"}, {"name": "score", "type": "double"}],
}


def _nodes(depth: int) -> bytes:
    """A Node chain `depth` records deep, written by hand (fastavro's writer recurses in C)."""
    return wire_header(1) + b"\x02x\x02" * (depth - 1) + b"\x02x\x00"


def _avro(schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return wire_header(1) + out.getvalue()


# --- plain JSON values: the one depth and number rule -------------------------------------------------


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_nan_and_the_infinities_are_refused_as_the_json_door_refuses_them(number: float) -> None:
    with pytest.raises(ValueRefused, match="is not a JSON value: NaN and infinities are refused") as refused:
        plain_json({"text": "x", "m": {"score": [1.5, number]}}, 8)
    name = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[str(number)]
    door = decode_review(
        f'{{"text": "x", "score": {name}}}'.encode(),
        input_format="json",
        max_value_bytes=1000,
        max_text_chars=100,
        max_json_depth=8,
        default_id="d",
    )
    assert isinstance(door, DecodeFailure) and door.kind is DeadLetterKind.INVALID_JSON
    assert str(refused.value) in door.reason  # one rule, one sentence, at both doors


def test_plain_json_counts_levels_like_the_json_door_and_never_recurses() -> None:
    assert plain_json({"a": [{"b": [1]}]}, 4) == {"a": [{"b": [1]}]}
    with pytest.raises(ValueRefused, match="nested more than 3 levels"):
        plain_json({"a": [{"b": [1]}]}, 3)
    deep: Any = "bottom"
    for _ in range(sys.getrecursionlimit() * 5):
        deep = {"c": deep}
    with pytest.raises(ValueRefused, match="nested more than 64 levels"):
        plain_json(deep, 64)


def test_the_registry_depth_is_the_json_doors_capped_at_64() -> None:
    assert value_depth(32) == 32 and value_depth(10_000) == 64


def test_json_depth_reads_the_bytes_without_parsing_and_skips_strings() -> None:
    assert json_depth(b'{"a": [1, {"b": "]]]}}}[[["}], "c": {}}') == 3
    assert json_depth(b'{"e": "\\"[[[["}') == 1
    assert json_depth(b"[" * 100_000) == 100_000  # measured, not walked
    assert json_depth(b"42") == 0


# --- Avro --------------------------------------------------------------------------------------------


def _avro_values(schema: Any, max_depth: int = 32) -> AvroValues:
    return AvroValues(json.dumps(schema), max_depth=max_depth)


@pytest.mark.parametrize("depth", [1_000, 5_000, 100_000])
def test_a_recursive_avro_record_deeper_than_the_limit_is_refused_before_fastavro_reads_it(
    depth: int,
) -> None:
    """Before: 1,000 levels raised RecursionError in json_safe (the worker exited), 5,000 ran fastavro's C
    reader off its stack (SIGSEGV)."""
    with pytest.raises(ValueRefused, match="nested more than 32 levels"):
        _avro_values(NODE_AVRO).read(_nodes(depth))


def test_a_recursive_avro_record_within_the_limit_reads() -> None:
    record = _avro_values(NODE_AVRO).read(_nodes(32))
    assert plain_json(record, 32)["text"] == "x"


def test_an_avro_array_of_two_to_the_60_nulls_is_refused_from_its_ten_bytes() -> None:
    """Before: fastavro loops 2^60 times (a 10-byte value held the partition forever)."""
    schema = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "a", "type": {"type": "array", "items": "null"}}],
    }
    with pytest.raises(ValueRefused, match="more items than its 10 bytes"):
        _avro_values(schema).read(wire_header(1) + zigzag(2**60) + b"\x00")
    assert _avro_values(schema).read(wire_header(1) + zigzag(3) + b"\x00") == {"a": [None, None, None]}


def test_an_avro_decimal_longer_than_128_bytes_is_refused_before_it_is_converted() -> None:
    """Before: a 1 MB decimal took 197 s to convert, on the poll thread."""
    decimal = {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}
    schema = {"type": "record", "name": "R", "fields": [{"name": "d", "type": decimal}]}
    payload = zigzag(MAX_DECIMAL_BYTES + 1) + b"\x7f" * (MAX_DECIMAL_BYTES + 1)
    with pytest.raises(ValueRefused, match="decimal of 129 bytes"):
        _avro_values(schema).read(wire_header(1) + payload)
    assert str(_avro_values(schema).read(_avro(schema, {"d": Decimal("12.34")}))["d"]) == "12.34"


def test_an_avro_schema_past_the_limits_or_invalid_is_refused() -> None:
    with pytest.raises(SchemaRefused, match="not a valid Avro schema"):
        AvroValues('{"type": "recordz"}', max_depth=32)
    with pytest.raises(SchemaRefused, match="not a valid Avro schema"):
        AvroValues("{}", max_depth=32)
    deep: Any = "string"
    for i in range(MAX_SCHEMA_DEPTH):
        deep = {"type": "record", "name": f"R{i}", "fields": [{"name": "c", "type": deep}]}
    with pytest.raises(SchemaRefused, match="nested more than 64 levels"):
        _avro_values(deep)


def test_a_long_chain_of_named_avro_types_is_walked_like_recursion() -> None:
    """Types referring to earlier ones by name nest deeper than the schema's own JSON."""
    fields = [
        {"name": "t0", "type": {"type": "record", "name": "T0", "fields": [{"name": "s", "type": "string"}]}}
    ]
    for i in range(1, 40):
        inner = {"name": "inner", "type": f"T{i - 1}"}
        fields.append({"name": f"t{i}", "type": {"type": "record", "name": f"T{i}", "fields": [inner]}})
    schema = {
        "type": "record",
        "name": "Top",
        "fields": [{"name": "last", "type": fields[-1]["type"]}, *fields[:-1]],
    }
    reader = _avro_values({**schema, "fields": schema["fields"][1:] + schema["fields"][:1]}, max_depth=16)
    assert reader._walk  # noqa: SLF001 - the schema's graph is 41 levels deep
    payload = wire_header(1) + b"\x02s" * 40 + b"\x02s"
    with pytest.raises(ValueRefused, match="nested more than 16 levels"):
        reader.read(payload)


def test_the_usual_avro_record_is_read_without_a_walk() -> None:
    schema = json.loads(Path("deploy/samples/review.avsc").read_text(encoding="utf-8"))
    reader = _avro_values(schema)
    assert not reader._walk  # noqa: SLF001 - the good path costs what it cost
    record = {"id": "1", "text": "好", "domain": None, "expected": "positive"}
    assert reader.read(_avro(schema, record)) == record


def test_an_avro_nan_double_is_an_invalid_payload_dead_letter_not_the_windows_failure() -> None:
    """Before: ValueError "Out of range float values are not JSON compliant" in the result encoder: the
    worker exited, and did so again on every restart."""
    reader = _avro_values(SCORED)
    with pytest.raises(ValueRefused, match="NaN is not a JSON value"):
        review_of_record(
            reader.read(_avro(SCORED, {"text": "好", "score": math.nan})),
            input_format="avro",
            schema_id=1,
            default_id="d",
            text_field="text",
            id_field="id",
            max_text_chars=100,
        )


# --- JSON Schema ---------------------------------------------------------------------------------------

REF_ROOT = {"type": "object", "properties": {"text": {"type": "string"}, "c": {"$ref": "#"}}}


def _json_value(document: Any) -> bytes:
    return wire_header(2) + json.dumps(document).encode()


def test_a_json_schema_value_5000_levels_deep_is_refused_from_its_bytes() -> None:
    """Before: RecursionError in json.loads, outside the payload errors: the worker exited."""
    reader = JsonSchemaValues(json.dumps({"type": "object"}), max_depth=32)
    with pytest.raises(ValueRefused, match="nested more than 32 levels"):
        reader.read(wire_header(2) + b'{"text": "x", "m": ' + b"[" * 5000 + b"]" * 5000 + b"}")


def test_a_value_450_deep_under_a_ref_to_the_root_is_refused_before_validation() -> None:
    """Before: jsonschema recursed 4 frames a level and raised RecursionError (the worker exited)."""
    value: Any = {"text": "x"}
    for _ in range(449):
        value = {"text": "x", "c": value}
    reader = JsonSchemaValues(json.dumps(REF_ROOT), max_depth=64)
    with pytest.raises(ValueRefused, match="nested more than 64 levels"):
        reader.read(_json_value(value))
    shallow: Any = {"text": "x"}
    for _ in range(40):
        shallow = {"text": "x", "c": shallow}
    assert reader.read(_json_value(shallow))["text"] == "x"


def test_a_ref_chain_times_the_depth_is_bounded_so_validation_never_nears_the_recursion_limit() -> None:
    chained: dict[str, Any] = {"$defs": {}, "$ref": "#/$defs/d0"}
    for i in range(6):
        chained["$defs"][f"d{i}"] = {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}]}
    chained["$defs"]["d6"] = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "c": {"$ref": "#"}},
    }
    reader = JsonSchemaValues(json.dumps(chained), max_depth=64)
    value: Any = {"text": "x"}
    for _ in range(20):
        value = {"text": "x", "c": value}
    with pytest.raises(ValueRefused, match="chains are 14 long"):
        reader.read(_json_value(value))
    assert reader.read(_json_value({"text": "x", "c": {"text": "y"}}))["c"]["text"] == "y"


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        (
            {
                "$ref": "#/$defs/a",
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
            },
            "loops",
        ),
        ({"$ref": "https://example.com/other.json"}, "points outside the schema"),
        ({"$ref": "#/$defs/missing"}, "does not resolve"),
        ({"type": "objekt"}, "not a valid JSON Schema"),
    ],
)
def test_a_json_schema_that_cannot_be_used_is_refused(schema: Any, reason: str) -> None:
    with pytest.raises(SchemaRefused, match=reason):
        JsonSchemaValues(json.dumps(schema), max_depth=32)


def test_a_300_level_json_schema_the_registry_accepted_is_refused_before_it_is_checked() -> None:
    """Before: check_schema recursed 5 frames a level: RecursionError, the worker exited."""
    schema: Any = {"type": "string"}
    for _ in range(300):
        schema = {"type": "object", "properties": {"c": schema}}
    with pytest.raises(SchemaRefused, match="nested more than 64 levels"):
        JsonSchemaValues(json.dumps(schema), max_depth=32)


def test_a_json_schema_payload_holding_nan_is_refused_by_the_json_doors_rule() -> None:
    reader = JsonSchemaValues(json.dumps({"type": "object"}), max_depth=32)
    with pytest.raises(ValueRefused, match="NaN is not a JSON value"):
        reader.read(wire_header(2) + b'{"text": "x", "score": NaN}')


def test_unique_items_of_many_objects_is_checked_by_hashing() -> None:
    """jsonschema compares every pair of objects: 20,000 of them would take minutes."""
    schema = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
    reader = JsonSchemaValues(json.dumps(schema), max_depth=32)
    many = [{"n": i} for i in range(20_000)]
    assert len(reader.read(_json_value({"text": "x", "a": many}))["a"]) == 20_000
    with pytest.raises(jsonschema.ValidationError, match="non-unique"):
        reader.read(_json_value({"text": "x", "a": [*many, {"n": 7.0}]}))
    assert reader.read(_json_value({"text": "x", "a": [1, True]}))  # true is not 1


def test_validation_steps_are_bounded_by_the_payloads_size() -> None:
    """A nested anyOf over a recursive $ref: the work doubles with each level of the value."""
    branch = {"type": "object", "properties": {"c": {"$ref": "#"}}}
    schema = {"anyOf": [{**branch, "required": ["never"]}, {**branch, "required": ["never2"]}, branch]}
    reader = JsonSchemaValues(json.dumps(schema), max_depth=64)
    value: Any = {}
    for _ in range(30):
        value = {"c": value}
    with pytest.raises(ValueRefused, match="keyword steps"):
        reader.read(_json_value(value))


# --- Protobuf ----------------------------------------------------------------------------------------


def test_a_proto_of_500_nested_messages_is_refused_at_the_nesting_limit() -> None:
    """Before: proto_text recursed per level: RecursionError, the worker exited."""
    text = 'syntax = "proto3";\n' + "".join(f"message M{i} {{\n" for i in range(500)) + "}\n" * 500
    with pytest.raises(ValueError, match=f"more than {MAX_NESTING} levels"):
        parse_proto(text)
    with pytest.raises(SchemaRefused, match=f"more than {MAX_NESTING} levels"):
        ProtobufValues(text, max_depth=32)


def test_a_recursive_protobuf_message_deeper_than_the_limit_is_refused() -> None:
    reader = ProtobufValues(
        'syntax = "proto3"; message Node { string text = 1; Node child = 2; }', max_depth=16
    )
    payload = b""
    for _ in range(40):
        payload = b"\x0a\x01x\x12" + varint(len(payload)) + payload
    with pytest.raises(ValueRefused, match="nested more than 16 messages"):
        reader.read(wire_header(3) + b"\x00" + payload)


@pytest.mark.parametrize("number", [math.nan, math.inf])
def test_a_protobuf_nan_double_is_refused_not_written_as_a_string(number: float) -> None:
    """json_format writes NaN as "NaN": a value would have changed silently."""
    reader = ProtobufValues(
        'syntax = "proto3"; message S { string text = 1; double score = 2; }', max_depth=16
    )
    payload = b"\x0a\x01x\x11" + struct.pack("<d", number)
    with pytest.raises(ValueRefused, match="is not a JSON value"):
        reader.read(wire_header(3) + b"\x00" + payload)
    assert reader.read(wire_header(3) + b"\x00" + b"\x0a\x01x\x11" + struct.pack("<d", 0.5))["score"] == 0.5


def test_refs_to_the_schemas_own_ids_and_anchors_resolve() -> None:
    schema = {
        "$id": "https://example.com/schemas/review.schema.json",
        "type": "object",
        "properties": {
            "text": {"$ref": "review.schema.json#/$defs/text"},
            "shop": {"$ref": "https://example.com/schemas/shop.json"},
            "tag": {"$ref": "#tag"},
        },
        "$defs": {
            "text": {"type": "string"},
            "shop": {"$id": "shop.json", "type": "string"},
            "tag": {"$anchor": "tag", "type": "string"},
        },
    }
    reader = JsonSchemaValues(json.dumps(schema), max_depth=8)
    assert reader.read(_json_value({"text": "x", "shop": "s", "tag": "t"}))["shop"] == "s"
    with pytest.raises(jsonschema.ValidationError):
        reader.read(_json_value({"text": "x", "shop": 5}))
