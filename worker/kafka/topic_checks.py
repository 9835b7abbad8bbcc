"""What must hold of the worker's three topics before it consumes, checked in one place: `run` refuses or
warns with these findings at start-up, and `topics check` / `doctor` report the same findings (and `topics
create --fix` applies their `alter`) without starting a worker.

The checks, each on the facts the broker gives (`TopicFacts`: partition count and topic configs):

    exists            the input, output and dead-letter topics exist (refuse)
    fetch room        a record batch the input topic accepts fits a fetch response (refuse)
    dead-letter room  the dead-letter topic takes the dead letter of the largest input (warn|refuse|off, as
                      SENTIMENT_DLQ_SIZE_CHECK says; else it goes as a stand-in without key and value)
    partitions        a 1-partition input topic lets one replica work; more replicas than partitions idle
    cleanup           a compacted output or dead-letter topic drops records (and refuses keyless ones)
    retention         a dead-letter topic that deletes dead letters within a day
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from worker.config import KafkaSettings
from worker.kafka.records import dead_letter_overhead_bytes

Severity = Literal["ok", "warn", "refuse"]

FETCH_RESPONSE_OVERHEAD_BYTES = 512  # librdkafka's allowance for a fetch response's framing
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
_DAY_MS = 24 * 3600 * 1000
WEEK_MS = 7 * _DAY_MS


@dataclass(frozen=True)
class TopicFacts:
    """A topic as the broker describes it: `partitions` (None: it does not exist) and its configs
    (max.message.bytes, cleanup.policy, retention.ms; those the broker did not say are absent)."""

    partitions: int | None
    configs: Mapping[str, str] = field(default_factory=dict)

    def max_message_bytes(self) -> int:
        return int(self.configs.get("max.message.bytes", KAFKA_DEFAULT_MAX_MESSAGE_BYTES))


@dataclass(frozen=True)
class TopicFinding:
    """One check of one topic: `severity` ok, warn (run starts, says so) or refuse (run exits 2); `fix` in
    words; `alter`: the topic configs `topics create --fix` sets on `topic` to settle it (empty: none)."""

    check: str
    topic: str
    severity: Severity
    detail: str
    fix: str | None = None
    alter: Mapping[str, str] = field(default_factory=dict)

    def line(self) -> str:
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{self.check} ({self.topic}): {self.detail}{fix}"


def fix_command(kafka: KafkaSettings) -> str:
    """The command that applies the findings' `alter` (no Kafka CLI needed)."""
    return f"`sentiment-worker topics create --fix --bootstrap-servers {kafka.bootstrap_servers}`"


def topic_findings(
    kafka: KafkaSettings,
    facts: Mapping[str, TopicFacts],
    *,
    replicas: int | None = None,
) -> list[TopicFinding]:
    """Every start-up check on the input, output and dead-letter topics (`facts` by name), in order.
    `replicas`: how many workers will share the group (None: unknown, only a 1-partition input is named)."""
    findings: list[TopicFinding] = []
    names = list(dict.fromkeys([kafka.input_topic, kafka.output_topic, kafka.dlq_topic]))
    missing = [name for name in names if facts.get(name, TopicFacts(None)).partitions is None]
    create = f"`sentiment-worker topics create --bootstrap-servers {kafka.bootstrap_servers}`"
    for name in names:
        if name in missing:
            findings.append(TopicFinding("exists", name, "refuse", "missing", f"create it: {create}"))
        else:
            count = facts[name].partitions
            findings.append(
                TopicFinding("exists", name, "ok", f"{count} partition{'' if count == 1 else 's'}")
            )
    if kafka.input_topic in missing:
        return findings
    source = facts[kafka.input_topic]
    findings.append(_fetch_room(kafka, source.max_message_bytes()))
    if kafka.dlq_topic not in missing:
        findings.append(_dead_letter_room(kafka, source.max_message_bytes(), facts[kafka.dlq_topic]))
    findings.append(_partitions(kafka, source.partitions or 0, replicas))
    for name in (kafka.output_topic, kafka.dlq_topic):
        if name not in missing:
            findings.append(_cleanup(kafka, name, facts[name]))
    if kafka.dlq_topic not in missing:
        findings.append(_retention(kafka, facts[kafka.dlq_topic]))
    return findings


def _fetch_room(kafka: KafkaSettings, input_limit: int) -> TopicFinding:
    receive = kafka.consumer_fetch_limits()["receive.message.max.bytes"]
    receive = int(kafka.kafka_extra.get("receive.message.max.bytes", receive))
    needed = input_limit + FETCH_RESPONSE_OVERHEAD_BYTES
    if receive >= needed:
        return TopicFinding("fetch room", kafka.input_topic, "ok", f"fetch responses of {receive} bytes fit")
    return TopicFinding(
        "fetch room",
        kafka.input_topic,
        "refuse",
        f"input topic {kafka.input_topic!r} accepts record batches of up to {input_limit} bytes "
        f"(max.message.bytes) but the consumer receives fetch responses of at most {receive} bytes "
        f"(SENTIMENT_RECEIVE_MESSAGE_MAX_BYTES): such a batch could never be read and would stall the "
        "partitions of its broker",
        f"set SENTIMENT_RECEIVE_MESSAGE_MAX_BYTES to at least {needed}, or lower the topic's "
        "max.message.bytes",
    )


def _dead_letter_room(kafka: KafkaSettings, input_limit: int, dlq: TopicFacts) -> TopicFinding:
    dlq_limit = dlq.max_message_bytes()
    needed = input_limit + dead_letter_overhead_bytes(kafka.input_topic, kafka.worker_id)
    name = kafka.dlq_topic
    if dlq_limit >= needed:
        return TopicFinding("dead-letter room", name, "ok", f"{dlq_limit} bytes hold the largest input's")
    severities: dict[str, Severity] = {"refuse": "refuse", "warn": "warn", "off": "ok"}
    severity = severities[kafka.dlq_size_check]
    detail = (
        f"dead-letter topic {name!r} accepts records of up to {dlq_limit} bytes (max.message.bytes) but "
        f"input topic {kafka.input_topic!r} accepts {input_limit}: the dead letter of an input larger than "
        f"about {dlq_limit - (needed - input_limit)} bytes goes as a stand-in without key and value (its "
        "source topic, partition and offset in headers)"
    )
    other = "off to silence this" if severity == "warn" else "warn to start anyway"
    fix = f"{fix_command(kafka)} sets max.message.bytes={needed} on {name!r}; or SENTIMENT_DLQ_SIZE_CHECK="
    fix += other
    return TopicFinding("dead-letter room", name, severity, detail, fix, {"max.message.bytes": str(needed)})


def _partitions(kafka: KafkaSettings, partitions: int, replicas: int | None) -> TopicFinding:
    name = kafka.input_topic
    if replicas is not None and replicas > partitions:
        detail = (
            f"{partitions} partition(s) for {replicas} replicas of group {kafka.group_id!r}: "
            f"{replicas - partitions} replica(s) will idle (a partition is read by one member)"
        )
    elif partitions == 1:
        detail = (
            f"1 partition: only one replica of group {kafka.group_id!r} can work at a time (the others idle)"
        )
    else:
        return TopicFinding("partitions", name, "ok", f"{partitions} partitions: up to {partitions} replicas")
    fix = (
        f"{fix_command(kafka)[:-1]} --partitions N` adds partitions (records of a key go to another "
        "partition from then on)"
    )
    return TopicFinding("partitions", name, "warn", detail, fix)


def _cleanup(kafka: KafkaSettings, name: str, facts: TopicFacts) -> TopicFinding:
    policy = facts.configs.get("cleanup.policy", "delete")
    if "compact" not in policy:
        return TopicFinding("cleanup", name, "ok", f"cleanup.policy={policy}")
    return TopicFinding(
        "cleanup",
        name,
        "warn",
        f"cleanup.policy={policy}: compaction keeps only the last record of a key, and the broker refuses "
        "records without a key (a result or dead letter of a keyless review would stop the worker)",
        f"{fix_command(kafka)} sets cleanup.policy=delete",
        {"cleanup.policy": "delete"},
    )


def _retention(kafka: KafkaSettings, facts: TopicFacts) -> TopicFinding:
    name = kafka.dlq_topic
    retention = int(facts.configs.get("retention.ms", WEEK_MS))
    if retention < 0 or retention >= _DAY_MS:
        shown = "forever" if retention < 0 else f"{retention / _DAY_MS:g} day(s)"
        return TopicFinding("retention", name, "ok", f"dead letters kept {shown}")
    return TopicFinding(
        "retention",
        name,
        "warn",
        f"retention.ms={retention}: dead letters are deleted after {retention / 3_600_000:g} h, "
        "likely before anyone looks at them",
        f"{fix_command(kafka)} sets retention.ms={WEEK_MS} (7 days)",
        {"retention.ms": str(WEEK_MS)},
    )


_CONFIG_KEYS = ("max.message.bytes", "cleanup.policy", "retention.ms")


def read_topic_facts(
    common_conf: dict[str, Any], names: Sequence[str], *, timeout_s: float = 10.0
) -> dict[str, TopicFacts]:
    """The facts `topic_findings` needs, read with the admin API: partition counts from cluster metadata
    (not per topic name, which could auto-create a topic), configs with describe_configs. KafkaException
    when no broker answers in `timeout_s`."""
    admin = AdminClient(dict(common_conf))
    metadata = admin.list_topics(timeout=timeout_s)
    facts: dict[str, TopicFacts] = {}
    present = []
    for name in dict.fromkeys(names):
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            facts[name] = TopicFacts(None)
        else:
            facts[name] = TopicFacts(len(topic.partitions))
            present.append(name)
    if not present:
        return facts
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in present]
    futures = admin.describe_configs(resources, request_timeout=timeout_s)
    for resource, future in futures.items():
        try:
            entries = future.result(timeout=timeout_s + 5)
        except (KafkaException, concurrent.futures.TimeoutError):
            continue  # the checks then assume the broker's defaults
        configs = {key: entries[key].value for key in _CONFIG_KEYS if key in entries}
        facts[resource.name] = TopicFacts(facts[resource.name].partitions, configs)
    return facts
