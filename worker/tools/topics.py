"""Creating, listing, altering and deleting topics with the admin API (the `topics create|list|delete`
commands and `topics create --fix`), and who consumes a topic right now (delete refuses those)."""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)

from worker.config import KafkaSettings
from worker.errors import OperationError
from worker.kafka.topic_checks import TopicFinding, read_topic_facts, topic_findings

# The output and dead-letter topics' max.message.bytes: a dead letter is its input plus headers.
OUTPUT_TOPIC_MAX_MESSAGE_BYTES = 2 * 1024 * 1024

# What to tell the operator for the admin errors one actually meets.
_ADVICE: dict[int, str] = {
    KafkaError.INVALID_REPLICATION_FACTOR: (
        "the replication factor is larger than the number of brokers; pass a smaller --replication-factor"
    ),
    KafkaError.INVALID_PARTITIONS: "the partition count must be at least 1",
    KafkaError.TOPIC_EXCEPTION: (
        "topic names may only contain ASCII letters, digits, '.', '_' and '-' (at most 249 characters)"
    ),
    KafkaError.TOPIC_AUTHORIZATION_FAILED: (
        "the client is not allowed to create topics; ask for a CREATE ACL or have an administrator create it"
    ),
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: (
        "the client is not allowed to create topics; ask for a CREATE ACL or have an administrator create it"
    ),
    KafkaError.POLICY_VIOLATION: "the broker's create-topic policy rejected the request; check its rules",
    KafkaError.REQUEST_TIMED_OUT: "the broker did not answer in time; check that it is up and reachable",
    KafkaError._TIMED_OUT: "no broker answered in time; check bootstrap.servers and that the broker is up",
    KafkaError._TRANSPORT: "cannot reach the broker; check bootstrap.servers and security settings",
}

_DELETE_ADVICE: dict[int, str] = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "the client is not allowed to delete it; ask for a DELETE ACL",
    KafkaError.TOPIC_DELETION_DISABLED: "the broker has delete.topic.enable=false",
    KafkaError.REQUEST_TIMED_OUT: _ADVICE[KafkaError.REQUEST_TIMED_OUT],
    KafkaError._TIMED_OUT: _ADVICE[KafkaError._TIMED_OUT],
    KafkaError._TRANSPORT: _ADVICE[KafkaError._TRANSPORT],
}


class TopicAdminError(OperationError):
    """A topic could not be created or inspected; the message says what to do about it."""


def _admin(common_conf: dict[str, Any]) -> AdminClient:
    return AdminClient(dict(common_conf))


def describe_topics(
    common_conf: dict[str, Any], names: Sequence[str], *, timeout_s: float = 10.0
) -> dict[str, int | None]:
    """Partition count of each topic in `names`; None when the topic does not exist.

    Reads cluster metadata for all topics (not per topic name, which could auto-create a topic on brokers
    with auto.create.topics.enable=true). Raises TopicAdminError when no broker answers in `timeout_s`.
    """
    return _describe(_admin(common_conf), names, timeout_s)


def _describe(admin: AdminClient, names: Sequence[str], timeout_s: float) -> dict[str, int | None]:
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise TopicAdminError(
            f"cannot read cluster metadata within {timeout_s:g} s ({exc.args[0]}); "
            "check bootstrap.servers and that the broker is up"
        ) from exc
    counts: dict[str, int | None] = {}
    for name in names:
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            counts[name] = None
        else:
            counts[name] = len(topic.partitions)
    return counts


def create_topics(
    common_conf: dict[str, Any],
    names: Sequence[str],
    *,
    partitions: int,
    replication_factor: int = 1,
    timeout_s: float = 30,
    config: dict[str, str] | None = None,
) -> dict[str, str]:
    """Create each topic in `names` with `partitions` partitions (and topic `config`, if given); return
    name → "created" or "exists".

    An already existing topic is not an error; when its partition count differs from `partitions` the
    status says so, e.g. "exists (3 partitions)". Any other failure (or no answer within `timeout_s`
    seconds) raises TopicAdminError naming the topic and what to do.
    """
    if partitions < 1:
        raise TopicAdminError(f"partitions must be at least 1, got {partitions}")
    if replication_factor < 1:
        raise TopicAdminError(f"replication factor must be at least 1, got {replication_factor}")
    unique = list(dict.fromkeys(names))
    if not unique:
        return {}
    admin = _admin(common_conf)
    new_topics = [
        NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=config or {})
        for name in unique
    ]
    # operation_timeout: how long the controller may take to create them before answering.
    futures = admin.create_topics(new_topics, operation_timeout=timeout_s, request_timeout=timeout_s)
    statuses: dict[str, str] = {}
    existing: list[str] = []
    for name in unique:
        try:
            futures[name].result(timeout=timeout_s + 5)
            statuses[name] = "created"
        except concurrent.futures.TimeoutError as exc:
            raise TopicAdminError(
                f"creating topic {name!r}: no answer within {timeout_s:g} s; "
                "check bootstrap.servers and that the broker is up"
            ) from exc
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                statuses[name] = "exists"
                existing.append(name)
                continue
            advice = _ADVICE.get(err.code(), "see the broker log for details")
            raise TopicAdminError(f"creating topic {name!r} failed: {err.str()} — {advice}") from exc
    if existing:
        counts = _describe(admin, existing, timeout_s)
        for name in existing:
            count = counts.get(name)
            if count is not None and count != partitions:
                statuses[name] = f"exists ({count} partitions)"
    return statuses


def list_topic_names(common_conf: dict[str, Any], *, timeout_s: float = 10.0) -> dict[str, int]:
    """Every topic of the cluster, sorted by name, with its partition count (internal ones included, as
    `kafka-topics --list` shows them). Raises TopicAdminError when no broker answers in `timeout_s`."""
    try:
        metadata = _admin(common_conf).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise TopicAdminError(
            f"cannot read cluster metadata within {timeout_s:g} s ({exc.args[0]}); "
            "check bootstrap.servers and that the broker is up"
        ) from exc
    return {
        name: len(topic.partitions) for name, topic in sorted(metadata.topics.items()) if topic.error is None
    }


def matching_topics(names: Sequence[str], patterns: Sequence[str]) -> list[str]:
    """The names that fully match one of the regular expressions in `patterns` (kafka-topics' --topic)."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise TopicAdminError(f"--topic {pattern!r} is not a regular expression: {exc}") from None
    return [name for name in names if any(regex.fullmatch(name) for regex in compiled)]


@dataclass(frozen=True)
class TopicConsumer:
    """An active member of a consumer group that is assigned partitions of a topic."""

    group: str
    client_id: str
    host: str


def consumers_of(
    common_conf: dict[str, Any], topics: Sequence[str], *, timeout_s: float = 10.0
) -> dict[str, list[TopicConsumer]]:
    """The members of every consumer group that are assigned partitions of `topics` right now (what
    `kafka-consumer-groups --describe --all-groups` shows), by topic; a topic nobody reads is absent."""
    wanted = set(topics)
    admin = _admin(common_conf)
    listing = _wait(admin.list_consumer_groups(request_timeout=timeout_s), timeout_s, "listing groups")
    groups = [g.group_id for g in listing.valid]
    if not groups or not wanted:
        return {}
    found: dict[str, list[TopicConsumer]] = {}
    for group, future in admin.describe_consumer_groups(groups, request_timeout=timeout_s).items():
        description = _wait(future, timeout_s, f"describing consumer group {group!r}")
        for member in description.members or []:
            assignment = getattr(member, "assignment", None)
            assigned = {tp.topic for tp in getattr(assignment, "topic_partitions", None) or []}
            for topic in sorted(assigned & wanted):
                consumer = TopicConsumer(group, member.client_id, member.host)
                if consumer not in found.setdefault(topic, []):
                    found[topic].append(consumer)
    return found


def delete_topics(
    common_conf: dict[str, Any], names: Sequence[str], *, timeout_s: float = 30.0
) -> dict[str, str]:
    """Deletes each topic in `names`; returns name → "deleted". The broker removes the data afterwards
    (asynchronously). Raises TopicAdminError naming the topic and what to do."""
    unique = list(dict.fromkeys(names))
    if not unique:
        return {}
    admin = _admin(common_conf)
    futures = admin.delete_topics(unique, operation_timeout=timeout_s, request_timeout=timeout_s)
    statuses: dict[str, str] = {}
    for name in unique:
        try:
            _wait(futures[name], timeout_s + 5, f"deleting topic {name!r}", _DELETE_ADVICE)
        except TopicAdminError as exc:
            cause = exc.__cause__
            error = cause.args[0] if isinstance(cause, KafkaException) and cause.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                statuses[name] = "does not exist"
                continue
            raise
        statuses[name] = "deleted"
    return statuses


def _wait(
    future: concurrent.futures.Future[Any], timeout_s: float, what: str, advice: dict[int, str] | None = None
) -> Any:
    """The future's result; a timeout or a Kafka error as a TopicAdminError saying `what` failed and why."""
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError as exc:
        raise TopicAdminError(
            f"{what}: no answer within {timeout_s:g} s; check bootstrap.servers and that the broker is up"
        ) from exc
    except KafkaException as exc:
        err = exc.args[0]
        if not isinstance(err, KafkaError):
            raise TopicAdminError(f"{what} failed: {err}") from exc
        hint = (advice if advice is not None else _ADVICE).get(err.code(), "see the broker log for details")
        raise TopicAdminError(f"{what} failed: {err.str()} — {hint}") from exc


def alter_topic_configs(
    common_conf: dict[str, Any], changes: Mapping[str, Mapping[str, str]], *, timeout_s: float = 30.0
) -> dict[str, str]:
    """Sets the given configs on each topic (`changes`: topic → {config: value}) with the admin API's
    incremental_alter_configs (only those keys change; the topic's other configs stay). Returns topic →
    what was set, e.g. "set max.message.bytes=1053364". Raises TopicAdminError naming the topic."""
    admin = _admin(common_conf)
    resources = [
        ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
                for key, value in configs.items()
            ],
        )
        for topic, configs in changes.items()
        if configs
    ]
    if not resources:
        return {}
    futures = admin.incremental_alter_configs(resources, request_timeout=timeout_s)
    done: dict[str, str] = {}
    for resource, future in futures.items():
        _wait(future, timeout_s + 5, f"altering the configs of topic {resource.name!r}")
        settings = ", ".join(f"{k}={v}" for k, v in changes[resource.name].items())
        done[resource.name] = f"set {settings}"
    return done


def add_partitions(
    common_conf: dict[str, Any], totals: Mapping[str, int], *, timeout_s: float = 30.0
) -> dict[str, str]:
    """Raises each topic's partition count to `totals[topic]` (create_partitions; never fewer)."""
    if not totals:
        return {}
    admin = _admin(common_conf)
    futures = admin.create_partitions(
        [NewPartitions(topic, count) for topic, count in totals.items()],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    done: dict[str, str] = {}
    for topic, future in futures.items():
        _wait(future, timeout_s + 5, f"adding partitions to topic {topic!r}")
        done[topic] = f"now {totals[topic]} partitions"
    return done


def check_worker_topics(
    common_conf: dict[str, Any], kafka: KafkaSettings, *, replicas: int | None = None, timeout_s: float = 10.0
) -> list[TopicFinding]:
    """Every start-up check `run` makes on the worker's three topics (`worker.kafka.topic_checks`), on the
    topics as the broker describes them. Raises TopicAdminError when no broker answers in `timeout_s`."""
    names = [kafka.input_topic, kafka.output_topic, kafka.dlq_topic]
    try:
        facts = read_topic_facts(common_conf, names, timeout_s=timeout_s)
    except KafkaException as exc:
        raise TopicAdminError(
            f"cannot read cluster metadata from {kafka.bootstrap_servers} within {timeout_s:g} s "
            f"({exc.args[0]}); check bootstrap.servers and that the broker is up"
        ) from exc
    return topic_findings(kafka, facts, replicas=replicas)
