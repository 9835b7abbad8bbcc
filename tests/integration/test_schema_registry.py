"""The schema registry the launcher starts does what the worker needs, through confluent-kafka's own client:
Avro and JSON Schema in the Confluent wire format, BACKWARD evolution, 409 for a breaking change, and schema
ids that survive a restart. (Protobuf: confluent-kafka-python registers a base64 descriptor, which this
registry refuses; see deploy/registry/README.md.)"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.registry_fixtures import launched_registry

pytestmark = pytest.mark.integration


def review_schemas(namespace: str) -> dict[str, dict[str, Any]]:
    """A review record's versions. Each test uses its own namespace: the registry gives an already known
    schema its old id and adds it as a version only to a subject without versions (deploy/registry/README.md),
    so tests sharing one schema across subjects would see each other's registrations."""
    v1 = {
        "type": "record",
        "name": "Review",
        "namespace": namespace,
        "fields": [{"name": "id", "type": "string"}, {"name": "text", "type": "string"}],
    }
    # v2 adds an optional field with a default: a v2 reader can read v1 data (BACKWARD).
    lang = {"name": "lang", "type": ["null", "string"], "default": None}
    v2 = {**v1, "fields": [*v1["fields"], lang]}
    return {
        "v1": v1,
        "v2": v2,
        # Breaking under BACKWARD: a reader of either cannot read v2 data.
        "required_field_added": {**v2, "fields": [*v2["fields"], {"name": "stars", "type": "int"}]},
        "type_changed": {**v2, "fields": [{"name": "id", "type": "string"}, {"name": "text", "type": "int"}]},
    }


def avro(schema: dict[str, Any]) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


def wire_schema_id(payload: bytes) -> int:
    """The schema id of a Confluent wire-format message: magic byte 0, then the id as a big-endian int32."""
    magic, schema_id = struct.unpack(">bI", payload[:5])
    assert magic == 0
    return int(schema_id)


def test_avro_round_trip_backward_evolution_and_409(
    schema_registry_url: str, unique_name: Callable[[str], str]
) -> None:
    client = SchemaRegistryClient({"url": schema_registry_url})
    topic = unique_name("reviews")
    subject = f"{topic}-value"
    ctx = SerializationContext(topic, MessageField.VALUE)
    review = review_schemas(f"test.{topic.replace('-', '_')}")

    v1_id = client.register_schema(subject, avro(review["v1"]))
    client.set_compatibility(subject_name=subject, level="BACKWARD")
    assert client.get_compatibility(subject) == "BACKWARD"

    # A producer that must not register: it writes with the subject's latest registered version.
    serialize = AvroSerializer(
        client, json.dumps(review["v1"]), conf={"auto.register.schemas": False, "use.latest.version": True}
    )
    record = {"id": "r-1", "text": "质量很好"}
    payload = serialize(record, ctx)
    assert wire_schema_id(payload) == v1_id
    assert AvroDeserializer(client)(payload, ctx) == record

    v2_id = client.register_schema(subject, avro(review["v2"]))
    assert v2_id != v1_id
    assert client.get_versions(subject) == [1, 2]
    # v1 data read with the v2 schema: the new field takes its default.
    assert AvroDeserializer(client, json.dumps(review["v2"]))(payload, ctx) == {**record, "lang": None}

    for breaking in ("required_field_added", "type_changed"):
        with pytest.raises(SchemaRegistryError) as refused:
            client.register_schema(subject, avro(review[breaking]))
        assert refused.value.http_status_code == 409, breaking
    assert client.get_versions(subject) == [1, 2]
    # a new client: this one caches the latest version it looked up for the serializer
    assert SchemaRegistryClient({"url": schema_registry_url}).get_latest_version(subject).schema_id == v2_id


def test_json_schema_round_trip_and_409(schema_registry_url: str, unique_name: Callable[[str], str]) -> None:
    client = SchemaRegistryClient({"url": schema_registry_url})
    topic = unique_name("reviews")
    subject = f"{topic}-value"
    ctx = SerializationContext(topic, MessageField.VALUE)
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": f"Review {topic}",  # this test's own schema (see review_schemas)
        "type": "object",
        "properties": {"id": {"type": "string"}, "stars": {"type": "integer"}},
        "required": ["id"],
    }
    payload = JSONSerializer(json.dumps(schema), client)({"id": "r-2", "stars": 4}, ctx)
    registered = client.get_latest_version(subject)
    assert registered.schema.schema_type == "JSON"
    assert wire_schema_id(payload) == registered.schema_id
    assert JSONDeserializer(json.dumps(schema), schema_registry_client=client)(payload, ctx) == {
        "id": "r-2",
        "stars": 4,
    }

    client.set_compatibility(subject_name=subject, level="BACKWARD")
    properties = schema["properties"]
    breaking = [
        {**schema, "properties": {**properties, "lang": {"type": "string"}}, "required": ["id", "lang"]},
        {**schema, "properties": {**properties, "id": {"type": "integer"}}},
    ]
    for changed in breaking:
        with pytest.raises(SchemaRegistryError) as refused:
            client.register_schema(subject, Schema(json.dumps(changed), "JSON"))
        assert refused.value.http_status_code == 409
    assert client.get_versions(subject) == [1]


def test_schemas_and_ids_survive_a_restart(tmp_path: Path, unique_name: Callable[[str], str]) -> None:
    """`down` then `up` on the same data dir: every subject keeps its versions, ids and compatibility level,
    messages serialized before decode after, and the next new schema gets a new id."""
    data_dir = tmp_path / "registry"
    topic, other = unique_name("reviews"), unique_name("results")
    ctx = SerializationContext(topic, MessageField.VALUE)
    review = review_schemas(f"test.{topic.replace('-', '_')}")
    record = {"id": "r-4", "text": "还行", "lang": "zh"}
    with launched_registry(data_dir) as url:
        client = SchemaRegistryClient({"url": url})
        v1_id = client.register_schema(f"{topic}-value", avro(review["v1"]))
        client.set_compatibility(subject_name=f"{topic}-value", level="BACKWARD")
        v2_id = client.register_schema(f"{topic}-value", avro(review["v2"]))
        # the same schema under a second subject keeps the first one's id
        assert client.register_schema(f"{other}-value", avro(review["v1"])) == v1_id
        client.set_compatibility(subject_name=f"{other}-value", level="FULL")
        payload = AvroSerializer(client, json.dumps(review["v2"]))(record, ctx)
        port = int(url.rsplit(":", 1)[1])
    assert (data_dir / "schemas.json").is_file()
    with launched_registry(data_dir, port=port) as url:
        client = SchemaRegistryClient({"url": url})
        assert sorted(client.get_subjects()) == sorted([f"{topic}-value", f"{other}-value"])
        assert [client.get_version(f"{topic}-value", v).schema_id for v in (1, 2)] == [v1_id, v2_id]
        assert client.get_versions(f"{other}-value") == [1]
        assert client.get_latest_version(f"{other}-value").schema_id == v1_id
        assert client.get_compatibility(f"{topic}-value") == "BACKWARD"
        assert client.get_compatibility(f"{other}-value") == "FULL"
        assert AvroDeserializer(client)(payload, ctx) == record
        with pytest.raises(SchemaRegistryError) as refused:
            client.register_schema(f"{topic}-value", avro(review["type_changed"]))
        assert refused.value.http_status_code == 409
        new_id = client.register_schema(f"{unique_name('other')}-value", Schema('"string"', "AVRO"))
        assert new_id not in (v1_id, v2_id)
