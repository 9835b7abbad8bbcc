"""`topics acls`: the least-privilege rules per delivery mode, their kafka-acls.sh form, and the Strimzi
KafkaUser manifests in deploy/k8s/acls/ holding exactly the same rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from worker.config import WorkerSettings
from worker.tools.acls import operator_acls, worker_acls

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
NAMES = {"input_topic": "in", "output_topic": "out", "dlq_topic": "dlq", "group_id": "g"}
SECTIONS = WorkerSettings(**NAMES).sections


def rules_as_tuples(delivery: str) -> set[tuple[str, str, str, bool]]:
    return {
        (r.resource, r.name, r.operation, r.prefixed)
        for r in worker_acls(SECTIONS.kafka, delivery, SECTIONS.live)
    }


def test_at_least_once_needs_read_on_input_and_group_write_on_outputs_and_describe_configs() -> None:
    assert rules_as_tuples("at_least_once") == {
        ("topic", "in", "Read", False),
        ("topic", "in", "DescribeConfigs", False),
        ("group", "g", "Read", False),
        ("topic", "out", "Write", False),
        ("topic", "out", "DescribeConfigs", False),
        ("topic", "dlq", "Write", False),
        ("topic", "dlq", "DescribeConfigs", False),
        ("topic", "g.control", "Read", False),
        ("topic", "g.status", "Write", False),
    }


def test_exactly_once_adds_write_and_describe_on_the_transactional_id_prefix_only() -> None:
    extra = rules_as_tuples("exactly_once") - rules_as_tuples("at_least_once")
    assert extra == {
        ("transactional-id", "sentiment-worker.g.", "Write", True),
        ("transactional-id", "sentiment-worker.g.", "Describe", True),
    }
    # the prefix covers the ids the worker really uses
    settings = WorkerSettings(**NAMES, worker_id="pod-1")
    assert f"sentiment-worker.{settings.group_id}.{settings.worker_id}".startswith("sentiment-worker.g.")


def test_rules_become_kafka_acls_lines_and_admin_bindings() -> None:
    sections = WorkerSettings(**NAMES).sections
    rules = worker_acls(sections.kafka, "exactly_once", sections.live)
    lines = [r.kafka_acls_line("User:worker", "b:9093") for r in rules]
    assert lines[0] == (
        "kafka-acls.sh --bootstrap-server b:9093 --command-config admin.properties --add "
        "--allow-principal User:worker --operation Read --topic in"
    )
    assert lines[-1].endswith("--transactional-id sentiment-worker.g. --resource-pattern-type prefixed")
    binding = rules[-1].binding("User:worker")
    assert (binding.restype, binding.name, binding.resource_pattern_type, binding.operation) == (
        ResourceType.TRANSACTIONAL_ID,
        "sentiment-worker.g.",
        ResourcePatternType.PREFIXED,
        AclOperation.DESCRIBE,
    )
    assert (binding.principal, binding.host) == ("User:worker", "*")


_STRIMZI_TYPES = {"topic": "topic", "group": "group", "transactionalId": "transactional-id"}


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_the_k8s_kafkauser_holds_exactly_the_rules_for_the_configmaps_names(delivery: str) -> None:
    config = yaml.safe_load((DEPLOY / "configmap.yaml").read_text())["data"]
    settings = WorkerSettings(
        input_topic=config["SENTIMENT_INPUT_TOPIC"],
        output_topic=config["SENTIMENT_OUTPUT_TOPIC"],
        dlq_topic=config["SENTIMENT_DLQ_TOPIC"],
        group_id=config["SENTIMENT_GROUP_ID"],
    )
    user: dict[str, Any] = yaml.safe_load(
        (DEPLOY / "acls" / f"kafkauser-{delivery.replace('_', '-')}.yaml").read_text()
    )
    assert user["kind"] == "KafkaUser"
    found = set()
    for acl in user["spec"]["authorization"]["acls"]:
        resource = acl["resource"]
        assert acl["host"] == "*"
        for operation in acl["operations"]:
            found.add(
                (
                    _STRIMZI_TYPES[resource["type"]],
                    resource["name"],
                    operation,
                    resource["patternType"] == "prefix",
                )
            )
    expected = {
        (r.resource, r.name, r.operation, r.prefixed)
        for r in worker_acls(settings.sections.kafka, delivery, settings.sections.live)
    }
    assert found == expected


def test_a_worker_reads_the_control_topic_writes_its_status_and_the_shadow_topics_when_set() -> None:
    settings = WorkerSettings(
        **NAMES, control_topic="ctl", status_topic="st", shadow_topic="sh", shadow_sample_topic="sample"
    )
    rules = worker_acls(settings.sections.kafka, "at_least_once", settings.sections.live)
    live = {(r.name, r.operation) for r in rules if r.name in {"ctl", "st", "sh", "sample"}}
    assert live == {("ctl", "Read"), ("st", "Write"), ("sh", "Write"), ("sample", "Write")}
    assert not any(r.name == "ctl" and r.operation == "Write" for r in rules)  # never the control topic


def test_an_operator_reads_and_writes_the_control_topic_and_reads_the_status_topic_only() -> None:
    rules = operator_acls(SECTIONS.kafka, SECTIONS.live)
    assert {(r.resource, r.name, r.operation, r.prefixed) for r in rules} == {
        ("topic", "g.control", "Read", False),
        ("topic", "g.control", "Write", False),
        ("topic", "g.status", "Read", False),
    }
