"""The result contract in the Schema Registry's three formats: the Avro schema (schemas/avro), the JSON
Schema (schemas/json, exported from `SentimentResult`) and the Protobuf file (schemas/protobuf). A unit test
keeps the three in step with the pydantic model: same fields, same names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from google.protobuf import descriptor_pb2

_DIR: Final = Path(__file__).resolve().parent
AVRO_RESULT_FILE: Final = _DIR / "avro" / "sentiment-result.v1.avsc"
JSON_RESULT_FILE: Final = _DIR / "json" / "sentiment-result.v1.schema.json"
PROTOBUF_RESULT_FILE: Final = _DIR / "protobuf" / "sentiment_result.v1.proto"

RESULT_RECORD_NAME: Final = "sentiment.SentimentResult"
"""The result's full record / message name in every format (what the record subject strategies use)."""


def avro_result_schema() -> dict[str, Any]:
    """The Avro schema of a result, as parsed JSON."""
    schema: dict[str, Any] = json.loads(AVRO_RESULT_FILE.read_text(encoding="utf-8"))
    return schema


def json_result_schema() -> dict[str, Any]:
    """The JSON Schema of a result (the exported file)."""
    schema: dict[str, Any] = json.loads(JSON_RESULT_FILE.read_text(encoding="utf-8"))
    return schema


_F = descriptor_pb2.FieldDescriptorProto


def _field(
    name: str, number: int, kind: int, *, type_name: str = "", repeated: bool = False
) -> descriptor_pb2.FieldDescriptorProto:
    label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    field = _F(name=name, number=number, type=kind, label=label, json_name=name)  # type: ignore[arg-type]
    if type_name:
        field.type_name = type_name
    return field


def protobuf_result_file() -> descriptor_pb2.FileDescriptorProto:
    """The descriptor of schemas/protobuf/sentiment_result.v1.proto, built field by field (no protoc here)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="sentiment_result.v1.proto", package="sentiment", syntax="proto3"
    )
    result = file.message_type.add(name="SentimentResult")
    model = result.nested_type.add(name="ModelRef")
    model.field.extend([_field("name", 1, _F.TYPE_STRING), _field("version", 2, _F.TYPE_STRING)])
    source = result.nested_type.add(name="SourceRef")
    timestamp = _field("timestamp_ms", 4, _F.TYPE_INT64)
    timestamp.proto3_optional = True
    timestamp.oneof_index = 0
    source.field.extend(
        [
            _field("topic", 1, _F.TYPE_STRING),
            _field("partition", 2, _F.TYPE_INT32),
            _field("offset", 3, _F.TYPE_INT64),
            timestamp,
        ]
    )
    source.oneof_decl.add(name="_timestamp_ms")
    entry = result.nested_type.add(name="ProbabilitiesEntry")
    entry.field.extend([_field("key", 1, _F.TYPE_STRING), _field("value", 2, _F.TYPE_DOUBLE)])
    entry.options.map_entry = True
    result.field.extend(
        [
            _field("schema_name", 1, _F.TYPE_STRING),
            _field("schema_version", 2, _F.TYPE_INT32),
            _field("id", 3, _F.TYPE_STRING),
            _field("label", 4, _F.TYPE_STRING),
            _field("label_id", 5, _F.TYPE_INT32),
            _field("confidence", 6, _F.TYPE_DOUBLE),
            _field(
                "probabilities",
                7,
                _F.TYPE_MESSAGE,
                type_name=".sentiment.SentimentResult.ProbabilitiesEntry",
                repeated=True,
            ),
            _field("model", 8, _F.TYPE_MESSAGE, type_name=".sentiment.SentimentResult.ModelRef"),
            _field("source", 9, _F.TYPE_MESSAGE, type_name=".sentiment.SentimentResult.SourceRef"),
            _field("processing_time_ms", 10, _F.TYPE_DOUBLE),
            _field("processed_at_ms", 11, _F.TYPE_INT64),
            _field("metadata", 12, _F.TYPE_STRING),
        ]
    )
    return file
