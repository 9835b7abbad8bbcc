"""The result contract in the Schema Registry's three formats: the Avro schema (schemas/avro), the JSON
Schema (schemas/json, exported from `SentimentResult`) and the Protobuf file (schemas/protobuf). A unit test
keeps the three in step with the pydantic model: same fields, same names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from google.protobuf import descriptor_pb2

from schemas.proto_text import parse_proto

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


def protobuf_result_file() -> descriptor_pb2.FileDescriptorProto:
    """The descriptor of schemas/protobuf/sentiment_result.v1.proto (read by `schemas.proto_text`)."""
    return parse_proto(PROTOBUF_RESULT_FILE.read_text(encoding="utf-8"), PROTOBUF_RESULT_FILE.name)
