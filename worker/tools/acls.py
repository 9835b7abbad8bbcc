"""The ACLs a worker's principal needs, least privilege, per delivery mode (the `topics acls` command).

- input topic: READ (consume; implies DESCRIBE: metadata, offsets, lag);
- consumer group: READ (join the group, commit offsets, also inside transactions);
- output and dead-letter topics: WRITE (publish; implies DESCRIBE, and since KIP-679 it also lets the
  idempotent producer get its id: no IDEMPOTENT_WRITE on the cluster) and DESCRIBE_CONFIGS (read
  max.message.bytes at start-up);
- exactly_once only: WRITE and DESCRIBE on the transactional ids `sentiment-worker.<group>.` (prefixed; the
  worker id follows);
- live models: READ on the group's control topic (follow the desired state; read with assign(), no group
  joined, nothing committed), WRITE on its status topic (report what the replica serves), and WRITE on the
  shadow and sample topics when they are set. A worker never writes the control topic.

Nothing else: no CREATE (an administrator creates the topics), no cluster operation, no wildcard.

An operator who steers the models (`models status|shadow|promote`) gets `operator_acls`: READ and WRITE on
the control topic, READ on the status topic, nothing of the worker's topics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from worker.config import KafkaSettings, LiveModelsSettings
from worker.errors import OperationError

Resource = Literal["topic", "group", "transactional-id"]
Operation = Literal["Read", "Write", "Describe", "DescribeConfigs"]

_RESOURCE_TYPES: dict[Resource, ResourceType] = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional-id": ResourceType.TRANSACTIONAL_ID,
}
_OPERATIONS: dict[Operation, AclOperation] = {
    "Read": AclOperation.READ,
    "Write": AclOperation.WRITE,
    "Describe": AclOperation.DESCRIBE,
    "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS,
}


class AclError(OperationError):
    """ACLs could not be created; the message says which and why."""


@dataclass(frozen=True)
class AclRule:
    """One ALLOW rule for the worker's principal, from any host."""

    resource: Resource
    name: str
    operation: Operation
    why: str
    prefixed: bool = False

    def binding(self, principal: str) -> AclBinding:
        pattern = ResourcePatternType.PREFIXED if self.prefixed else ResourcePatternType.LITERAL
        return AclBinding(
            _RESOURCE_TYPES[self.resource],
            self.name,
            pattern,
            principal,
            "*",
            _OPERATIONS[self.operation],
            AclPermissionType.ALLOW,
        )

    def kafka_acls_line(self, principal: str, bootstrap: str) -> str:
        """The rule as a `kafka-acls.sh --add` command (run with an administrator's --command-config)."""
        pattern = " --resource-pattern-type prefixed" if self.prefixed else ""
        return (
            f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config admin.properties --add "
            f"--allow-principal {principal} --operation {self.operation} "
            f"--{self.resource} {self.name}{pattern}"
        )


def transactional_id_prefix(kafka: KafkaSettings) -> str:
    """What every replica's transactional id starts with (the worker id follows)."""
    return f"sentiment-worker.{kafka.group_id}."


def worker_acls(kafka: KafkaSettings, delivery: str, live: LiveModelsSettings) -> list[AclRule]:
    """The ACLs a worker with these topics and group needs in ``delivery`` mode, the live models' topics
    (`live`) included."""
    mode = delivery
    rules = [
        AclRule("topic", kafka.input_topic, "Read", "consume the input topic"),
        AclRule(
            "topic",
            kafka.input_topic,
            "DescribeConfigs",
            "read max.message.bytes at start-up (the dead-letter topic must hold its largest record)",
        ),
        AclRule("group", kafka.group_id, "Read", "join the consumer group and commit its offsets"),
    ]
    for topic in (kafka.output_topic, kafka.dlq_topic):
        rules.append(AclRule("topic", topic, "Write", "publish results / dead letters"))
        rules.append(AclRule("topic", topic, "DescribeConfigs", "read max.message.bytes at start-up"))
    group = kafka.group_id
    rules.append(AclRule("topic", live.control_topic_of(group), "Read", "follow the models to serve"))
    rules.append(AclRule("topic", live.status_topic_of(group), "Write", "report the models it serves"))
    shadow_outputs = ((live.shadow_topic, "shadow results"), (live.shadow_sample_topic, "disagreements"))
    for output, why in shadow_outputs:
        if output:
            rules.append(AclRule("topic", output, "Write", f"publish {why}"))
    if mode == "exactly_once":
        prefix = transactional_id_prefix(kafka)
        for operation in ("Write", "Describe"):
            rules.append(AclRule("transactional-id", prefix, operation, "transactions", prefixed=True))  # type: ignore[arg-type]
    return rules


def operator_acls(kafka: KafkaSettings, live: LiveModelsSettings) -> list[AclRule]:
    """The ACLs of an operator who runs `models status|shadow|promote` for the group of `kafka`."""
    control, status = live.control_topic_of(kafka.group_id), live.status_topic_of(kafka.group_id)
    return [
        AclRule("topic", control, "Read", "read the desired state (models status, shadow, promote)"),
        AclRule("topic", control, "Write", "write the desired state (models shadow, promote)"),
        AclRule("topic", status, "Read", "read what each replica serves (models status, promote --live)"),
    ]


def apply_acls(
    common_conf: dict[str, Any], principal: str, rules: Sequence[AclRule], *, timeout_s: float = 30.0
) -> int:
    """Creates the rules' ALLOW bindings for ``principal`` with the admin client (an existing binding is
    kept); returns how many. Raises AclError naming the first binding the broker refused."""
    try:
        admin = AdminClient(dict(common_conf))
    except KafkaException as exc:
        raise AclError(f"the Kafka client settings were rejected: {exc.args[0]}") from exc
    bindings = [rule.binding(principal) for rule in rules]
    futures = admin.create_acls(bindings, request_timeout=timeout_s)
    for rule, binding in zip(rules, bindings, strict=True):
        try:
            futures[binding].result(timeout=timeout_s + 5)
        except KafkaException as exc:
            raise AclError(
                f"creating ACL {rule.operation} on {rule.resource} {rule.name!r} for {principal} failed: "
                f"{exc.args[0]} (this needs an administrator's credentials: ALTER on the cluster)"
            ) from exc
    return len(bindings)
