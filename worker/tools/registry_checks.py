"""`doctor`'s Schema Registry checks: the registry answers, the result subject takes this version's result
schema (and has its compatibility level), the input subject's schema has the text field."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from worker.config import REGISTRY_FORMATS, KafkaSettings, RegistrySettings
from worker.kafka.registry_decode import registry_trouble
from worker.kafka.result_encoding import result_schema, result_subject
from worker.tools.checks import Check

REGISTRY_FIX = "start it (`make registry-up`) or set SENTIMENT_SCHEMA_REGISTRY_URL to one that runs"


def check_registry(registry: RegistrySettings, kafka: KafkaSettings) -> list[Check]:
    """The registry's checks, in order; never raises. The URL shown is the one without user info (the
    settings keep none in it); basic auth is named by its user only."""
    conf = registry.schema_registry_conf()
    url = conf["url"]
    try:
        client = SchemaRegistryClient(conf)
        subjects = client.get_subjects()
    except Exception as exc:  # noqa: BLE001 - a check reports, never crashes the report
        trouble = registry_trouble(exc, url)
        return [
            Check("schema registry", "FAIL", str(trouble or f"{type(exc).__name__}: {exc}"), REGISTRY_FIX)
        ]
    auth = conf.get("basic.auth.user.info")
    as_user = f" (basic auth as {auth.partition(':')[0]!r})" if auth else ""
    checks = [Check("schema registry", "OK", f"{url} answered{as_user}; {len(subjects)} subjects")]
    if registry.output_format in REGISTRY_FORMATS:
        checks.append(_check_result_subject(client, registry, kafka.output_topic, set(subjects)))
    if registry.input_format in REGISTRY_FORMATS:
        checks.append(_check_input_subject(client, registry, kafka.input_topic, set(subjects)))
    return checks


def _check_result_subject(
    client: SchemaRegistryClient, registry: RegistrySettings, output_topic: str, subjects: set[str]
) -> Check:
    subject = result_subject(registry.schema_subject_strategy, output_topic)
    name = f"subject {subject}"
    if subject not in subjects:
        return Check(
            name, "OK", f"not registered yet: `run` registers the {registry.output_format} result schema"
        )
    try:
        latest = client.get_latest_version(subject)
        compatible = client.test_compatibility(subject, result_schema(registry.output_format))
        level = _compatibility(client, subject)
    except SchemaRegistryError as exc:
        return Check(name, "FAIL", f"{exc.http_status_code}: {exc.error_message}")
    detail = (
        f"version {latest.version} (schema id {latest.schema_id}), compatibility {level or 'global default'}"
    )
    if not compatible:
        return Check(
            name,
            "FAIL",
            f"{detail}; this version's result schema is incompatible with it",
            "register results under another subject "
            "(SENTIMENT_SCHEMA_SUBJECT_STRATEGY, SENTIMENT_OUTPUT_TOPIC)",
        )
    if level != registry.schema_compatibility:
        return Check(name, "WARN", f"{detail}; `run` sets it to {registry.schema_compatibility}")
    return Check(name, "OK", detail)


def _compatibility(client: SchemaRegistryClient, subject: str) -> str | None:
    try:
        return str(client.get_compatibility(subject))
    except SchemaRegistryError:
        return None  # no level of its own: the global one applies


def _check_input_subject(
    client: SchemaRegistryClient, registry: RegistrySettings, input_topic: str, subjects: set[str]
) -> Check:
    subject = f"{input_topic}-value"
    name = f"subject {subject}"
    if subject not in subjects:
        return Check(
            name,
            "WARN",
            "not registered: values are decoded by the schema id in their header, whatever subject holds it; "
            "producers using the topic name strategy register here",
        )
    try:
        latest = client.get_latest_version(subject)
    except SchemaRegistryError as exc:
        return Check(name, "FAIL", f"{exc.http_status_code}: {exc.error_message}")
    fields = _field_names(latest.schema.schema_type or "AVRO", latest.schema.schema_str or "")
    detail = f"version {latest.version} ({latest.schema.schema_type or 'AVRO'}, schema id {latest.schema_id})"
    if fields is not None and registry.text_field not in fields:
        return Check(
            name,
            "FAIL",
            f"{detail} has no {registry.text_field!r} field (it has {', '.join(sorted(fields))}): "
            "every value would be dead-lettered as missing_text",
            "set SENTIMENT_TEXT_FIELD to the field holding the review text",
        )
    return Check(name, "OK", f"{detail}; text from {registry.text_field!r}")


def _field_names(schema_type: str, schema_str: str) -> set[str] | None:
    """Top-level field names of an Avro record or a JSON Schema object; None when not told (Protobuf)."""
    try:
        schema: Any = json.loads(schema_str)
    except ValueError:
        return None
    if schema_type.upper() == "AVRO" and isinstance(schema, dict):
        return {field["name"] for field in schema.get("fields", [])}
    if schema_type.upper() == "JSON" and isinstance(schema, dict):
        return set(schema.get("properties", {}))
    return None
