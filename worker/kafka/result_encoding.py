"""A result's value bytes in the output format: UTF-8 JSON, or the Schema Registry wire format (Avro, JSON
Schema, Protobuf) with the result schema registered at start-up.

Registration happens once (`registered_result_encoder`); encoding a result asks the registry nothing.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fastavro
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass

from schemas.registry_schemas import (
    PROTOBUF_RESULT_FILE,
    RESULT_RECORD_NAME,
    avro_result_schema,
    json_result_schema,
    protobuf_result_file,
)
from schemas.sentiment_result import SentimentResult
from worker.config import RegistrySettings
from worker.errors import ConfigurationError
from worker.kafka.registry_decode import registry_trouble
from worker.kafka.wire_format import wire_header

ResultEncoder = Callable[[SentimentResult], bytes]
"""A result → the value bytes of its record on the results topic (a registry format; JSON results are
written directly by `worker.kafka.records.ResultWriter`)."""


def result_subject(strategy: str, output_topic: str) -> str:
    """The subject the result schema goes under: topic `<topic>-value`, record the record's full name,
    topic_record `<topic>-<full name>` (Confluent's TopicNameStrategy, RecordNameStrategy,
    TopicRecordNameStrategy)."""
    if strategy == "topic":
        return f"{output_topic}-value"
    if strategy == "record":
        return RESULT_RECORD_NAME
    if strategy == "topic_record":
        return f"{output_topic}-{RESULT_RECORD_NAME}"
    raise ValueError(f"unknown subject strategy {strategy!r}; expected topic, record or topic_record")


def result_schema(output_format: str) -> Schema:
    """The result schema as the registry takes it, for a registry output format."""
    if output_format == "avro":
        return Schema(json.dumps(avro_result_schema()), "AVRO")
    if output_format == "json_schema":
        # The file's `$id` is a relative name (the file's own), which a registry cannot resolve: left out.
        schema = {key: value for key, value in json_result_schema().items() if key != "$id"}
        return Schema(json.dumps(schema), "JSON")
    if output_format == "protobuf":
        return Schema(PROTOBUF_RESULT_FILE.read_text(encoding="utf-8"), "PROTOBUF")
    raise ValueError(f"not a registry format: {output_format!r}; expected avro, json_schema or protobuf")


def _plain(result: SentimentResult) -> dict[str, Any]:
    """The result as plain values, its metadata as the text of a JSON object (Avro and Protobuf)."""
    record = result.model_dump()
    record["metadata"] = json.dumps(record["metadata"], ensure_ascii=False, separators=(",", ":"))
    return record


def avro_encoder(schema_id: int) -> ResultEncoder:
    parsed = fastavro.parse_schema(avro_result_schema())
    header = wire_header(schema_id)

    def encode(result: SentimentResult) -> bytes:
        out = io.BytesIO()
        out.write(header)
        fastavro.schemaless_writer(out, parsed, _plain(result))
        return out.getvalue()

    return encode


def json_schema_encoder(schema_id: int) -> ResultEncoder:
    header = wire_header(schema_id)
    return lambda result: header + result.model_dump_json().encode("utf-8")


def protobuf_result_class() -> Any:
    """The generated class of the result message (from the descriptor in schemas.registry_schemas)."""
    pool = DescriptorPool()
    pool.Add(protobuf_result_file())
    return GetMessageClass(pool.FindMessageTypeByName(RESULT_RECORD_NAME))


def protobuf_encoder(schema_id: int) -> ResultEncoder:
    message_class = protobuf_result_class()
    header = wire_header(schema_id) + b"\x00"  # message indexes [0] (the first message), as a 0 count

    def encode(result: SentimentResult) -> bytes:
        record = _plain(result)
        if record["source"]["timestamp_ms"] is None:
            del record["source"]["timestamp_ms"]
        # Keyword construction takes the nested dicts and the map as they are: 2 us, ParseDict 30 us.
        return header + message_class(**record).SerializeToString()

    return encode


@dataclass(frozen=True)
class RegisteredResult:
    """Where the result schema went: its subject and id, and the compatibility level the subject has."""

    subject: str
    schema_id: int
    compatibility: str


def register_result_schema(
    client: SchemaRegistryClient, registry: RegistrySettings, output_topic: str
) -> RegisteredResult:
    """Registers the result schema of `registry.output_format` for `output_topic` (a no-op when that version
    is there) and sets the subject's compatibility level. A version the level refuses raises
    SchemaRegistryError (409): the schema changed incompatibly; the registry's message says how."""
    subject = result_subject(registry.schema_subject_strategy, output_topic)
    schema_id = client.register_schema(subject, result_schema(registry.output_format))
    client.set_compatibility(subject_name=subject, level=registry.schema_compatibility)
    return RegisteredResult(subject, schema_id, registry.schema_compatibility)


_ENCODERS: dict[str, Callable[[int], ResultEncoder]] = {
    "avro": avro_encoder,
    "json_schema": json_schema_encoder,
    "protobuf": protobuf_encoder,
}


def registered_result_encoder(
    registry: RegistrySettings, output_topic: str
) -> tuple[ResultEncoder | None, RegisteredResult | None]:
    """The encoder of `registry.output_format`, its schema registered first for a registry format (None for
    JSON) under `output_topic`'s subject. Raises `RegistryUnavailable` when the registry cannot answer (the
    caller waits and tries again)."""
    if registry.output_format == "json":
        return None, None
    conf = registry.schema_registry_conf()
    try:
        registered = register_result_schema(SchemaRegistryClient(conf), registry, output_topic)
    except Exception as exc:
        trouble = registry_trouble(exc, conf["url"])
        if trouble is not None:
            raise trouble from exc
        if isinstance(exc, SchemaRegistryError):  # 409: incompatible with the subject's level; 422: invalid
            subject = result_subject(registry.schema_subject_strategy, output_topic)
            raise ConfigurationError(
                f"the Schema Registry at {conf['url']} refuses the {registry.output_format} result schema "
                f"under subject {subject!r} ({exc.http_status_code}: {exc.error_message}): register results "
                "under another subject (SENTIMENT_SCHEMA_SUBJECT_STRATEGY, SENTIMENT_OUTPUT_TOPIC) or relax "
                "the subject's compatibility level"
            ) from None
        raise
    return _ENCODERS[registry.output_format](registered.schema_id), registered
