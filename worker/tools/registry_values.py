"""Message values in the Schema Registry wire format for the tools: `produce --format avro --schema FILE`
writes them (the schema registered under `<topic>-value`), `tail` reads them back (any format, by the id in
each value's header)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import json_format
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass

from schemas.proto_text import parse_proto
from schemas.review_decode import DecodeFailure
from worker.config import REGISTRY_FORMATS, RegistrySettings
from worker.errors import ConfigurationError, OperationError
from worker.kafka.registry_client import RegistryClient
from worker.kafka.registry_decode import RegistryUnavailable, SchemaReaders, registry_trouble
from worker.kafka.registry_limits import MAX_VALUE_DEPTH, plain_json
from worker.kafka.wire_format import schema_id_of, wire_header

SCHEMA_SUFFIXES = {".avsc": "avro", ".json": "json_schema", ".proto": "protobuf"}
"""The schema file's name → the value format `produce --schema` infers when --format does not say."""


def value_format(declared: str | None, schema: Path | None) -> str | None:
    """The registry format `produce` writes: `declared` (--format) when it is one, else inferred from the
    schema file's suffix; None for plain JSON / text values."""
    if declared in REGISTRY_FORMATS:
        if schema is None:
            raise ConfigurationError(
                f"--format {declared} needs --schema FILE (the schema each value is written with)"
            )
        return declared
    if schema is None:
        return None
    inferred = SCHEMA_SUFFIXES.get(schema.suffix.lower())
    if inferred is None:
        raise ConfigurationError(
            f"--schema {schema}: say which format it is (--format avro, json_schema or protobuf; a .avsc "
            "file is Avro, a .json file JSON Schema, a .proto file Protobuf)"
        )
    return inferred


class SchemaValues:
    """A message dict → its value in a registry format, its keys mapped to the schema's fields by name: a
    key the schema has no field for is dropped (counted in `dropped`, which `produce` reports). `fields`:
    the schema's top-level field names, in schema order (None: the schema does not list them)."""

    def __init__(
        self,
        serialize: Callable[[dict[str, Any]], bytes],
        fields: tuple[str, ...] | None,
        schema_file: Path,
    ) -> None:
        self._serialize = serialize
        self.fields = fields
        self.schema_file = schema_file
        self.dropped: dict[str, int] = {}

    def __call__(self, document: dict[str, Any]) -> bytes:
        if self.fields is not None:
            kept = {}
            for name, value in document.items():
                if name in self.fields:
                    kept[name] = value
                else:
                    self.dropped[name] = self.dropped.get(name, 0) + 1
            document = kept
        try:
            return self._serialize(document)
        except ValueError as exc:
            listed = ", ".join(self.fields) if self.fields is not None else "not listed"
            raise ValueError(
                f"{exc} (the schema's fields: {listed}; --text-field and --id-field name the fields the "
                "text and id go to, --map COLUMN=FIELD gives a column a field's name)"
            ) from None

    def dropped_note(self) -> str | None:
        """`note: columns 店铺, 评分 are not fields of review.avsc: not sent` (None: nothing dropped)."""
        if not self.dropped:
            return None
        names = ", ".join(self.dropped)
        return (
            f"note: {names} {'is not a field' if len(self.dropped) == 1 else 'are not fields'} of "
            f"{self.schema_file.name}: not sent (--map COLUMN=FIELD sends a column as a schema field)"
        )


def schema_fields(fmt: str, schema_str: str, file: Any = None) -> tuple[str, ...] | None:
    """The top-level field names of an Avro record, a JSON Schema object's properties, or (given its
    parsed `file`) a .proto file's first message; None when the schema does not list them."""
    if fmt == "protobuf":
        if file is None or not file.message_type:
            return None
        return tuple(f.name for f in file.message_type[0].field)
    document = json.loads(schema_str)
    if fmt == "avro" and isinstance(document, dict) and isinstance(document.get("fields"), list):
        return tuple(f["name"] for f in document["fields"] if isinstance(f, dict) and "name" in f)
    if fmt == "json_schema" and isinstance(document, dict) and isinstance(document.get("properties"), dict):
        return tuple(document["properties"])
    return None


def value_encoder(registry: RegistrySettings, fmt: str, schema_file: Path, topic: str) -> SchemaValues:
    """A message dict → its value in `fmt` with the schema in `schema_file`, registered under `<topic>-value`
    on first use, its keys mapped to the schema's fields by name (`SchemaValues`). A message that does not
    fit the schema raises ValueError saying why."""
    try:
        schema_str = schema_file.read_text(encoding="utf-8")
        if fmt != "protobuf":
            json.loads(schema_str)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(
            f"--schema {schema_file}: cannot read it as a {fmt} schema ({exc})"
        ) from None
    conf = registry.schema_registry_conf()
    client = SchemaRegistryClient(conf)
    serializer: Callable[[Any, SerializationContext], bytes | None]
    fields = schema_fields(fmt, schema_str) if fmt != "protobuf" else None
    if fmt == "avro":
        serializer = AvroSerializer(client, schema_str)
    elif fmt == "json_schema":
        serializer = JSONSerializer(schema_str, client)
    else:
        serializer, fields = _protobuf_serializer(client, schema_str, schema_file, topic)
    context = SerializationContext(topic, MessageField.VALUE)

    def encode(document: dict[str, Any]) -> bytes:
        try:
            value = serializer(document, context)
        except SchemaRegistryError as exc:  # e.g. 409: the schema is incompatible with the subject's
            raise OperationError(
                f"the Schema Registry at {conf['url']} refuses the schema under {topic}-value: {exc}"
            ) from None
        except Exception as exc:  # noqa: BLE001 - the registry away, or a row that does not fit the schema
            trouble = registry_trouble(exc, conf["url"])
            if trouble is not None:
                raise OperationError(str(trouble)) from None
            raise ValueError(str(exc) or type(exc).__name__) from None
        assert value is not None
        return value

    return SchemaValues(encode, fields, schema_file)


_Serializer = Callable[[Any, SerializationContext], bytes]


def _protobuf_serializer(
    client: SchemaRegistryClient, schema_str: str, schema_file: Path, topic: str
) -> tuple[_Serializer, tuple[str, ...] | None]:
    """Values of the file's first message (and its field names), the `.proto` text registered as it is
    (registries keep the text; confluent-kafka's own Protobuf serializer needs a compiled class and registers
    a descriptor)."""
    try:
        file = parse_proto(schema_str, schema_file.name)
    except ValueError as exc:
        raise ConfigurationError(f"--schema {schema_file}: {exc}") from None
    if not file.message_type:
        raise ConfigurationError(f"--schema {schema_file}: it defines no message")
    pool = DescriptorPool()
    pool.Add(file)
    first = file.message_type[0].name
    message_class = GetMessageClass(
        pool.FindMessageTypeByName(f"{file.package}.{first}" if file.package else first)
    )
    header: bytes | None = None

    def serialize(document: Any, context: SerializationContext) -> bytes:
        nonlocal header
        message = json_format.ParseDict(
            document, message_class()
        )  # ParseError (a ValueError) if it does not fit
        if header is None:  # registered on first use, as the other serializers do
            schema_id = client.register_schema(f"{topic}-value", Schema(schema_str, "PROTOBUF"))
            header = wire_header(schema_id) + b"\x00"  # message indexes [0]: the first message
        return header + message.SerializeToString()

    return serialize, schema_fields("protobuf", schema_str, file)


class ValueReader:
    """`tail`: a value in any registry format → its fields, by the schema id in its header (the schema's
    type says the format); None for a value not in the wire format (plain JSON, text) or one that does not
    decode (shown as the raw value)."""

    def __init__(self, registry: RegistrySettings) -> None:
        client = RegistryClient.from_conf(registry.schema_registry_conf())
        self._readers = SchemaReaders(client, max_depth=MAX_VALUE_DEPTH)

    def fields(self, value: bytes | None) -> dict[str, Any] | None:
        schema_id = schema_id_of(value) if value else None
        if schema_id is None or value is None:
            return None
        try:
            known = self._readers.reader(schema_id)
        except RegistryUnavailable as exc:
            raise OperationError(str(exc)) from None
        if isinstance(known, DecodeFailure):
            return None  # an unknown id or a schema that cannot be read: shown as the raw value
        try:
            document = plain_json(known[1].read(value), MAX_VALUE_DEPTH)
        except Exception:  # noqa: BLE001 - a value that does not decode is shown as the raw value
            return None
        return document if isinstance(document, dict) else None
