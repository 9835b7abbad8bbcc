"""The worker's Kafka clients and what must hold before it consumes anything: clients accepted, output
topics present, transactions initialised (the token budget: `worker.inference.token_budget`; the warm
model: the engine's start). Each failure is a StartupError saying what to change (the CLI exits 2 with it).

`KafkaClients` is how the worker opens them: the real ones by default, fakes in the loop's unit tests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException

from worker.config import DeliverySettings, KafkaSettings, SecuritySettings, librdkafka_common
from worker.inference.token_budget import StartupError
from worker.kafka.authorization import is_authorization_error, refusal
from worker.kafka.consumer import ReviewConsumer
from worker.kafka.deadline_calls import CallAbandoned
from worker.kafka.partitions import PartitionKey
from worker.kafka.producer import PRODUCER_MAX_MESSAGE_BYTES, ResultProducer
from worker.kafka.topic_checks import TopicFacts, TopicFinding, topic_findings

log = logging.getLogger(__name__)

RebalanceCallback = Callable[[list[PartitionKey]], None]


@dataclass(frozen=True)
class Rebalance:
    """The worker's rebalance callbacks (run inside `consume()`, on the poll thread)."""

    on_assign: RebalanceCallback
    on_revoke: RebalanceCallback
    on_lost: RebalanceCallback


def kafka_error_text(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else exc
    return error.str() if isinstance(error, KafkaError) else str(error)


def transactional_id(kafka: KafkaSettings) -> str:
    """exactly_once: the producer's transactional id, one per group and worker id."""
    return f"sentiment-worker.{kafka.group_id}.{kafka.worker_id}"


def delivery_description(kafka: KafkaSettings, delivery: DeliverySettings) -> str:
    """The delivery mode as the start-up log line says it."""
    if delivery.delivery == "exactly_once":
        return (
            "delivery exactly_once: one transaction per window "
            f"(transactional id {transactional_id(kafka)}); readers need isolation.level=read_committed"
        )
    return "delivery at_least_once: idempotent producer, offsets committed after acknowledgement"


def open_producer(
    kafka: KafkaSettings, security: SecuritySettings, delivery: DeliverySettings
) -> ResultProducer:
    """The producer; transactional (``sentiment-worker.<group>.<worker id>``) in exactly_once mode."""
    exactly_once = delivery.delivery == "exactly_once"
    try:
        return ResultProducer(
            librdkafka_common(kafka, security),
            transactional_id=transactional_id(kafka) if exactly_once else None,
            transaction_timeout_ms=delivery.transaction_timeout_ms,
        )
    except KafkaException as exc:
        raise StartupError(f"the Kafka client settings were rejected: {kafka_error_text(exc)}") from exc


def init_transactions(
    producer: ResultProducer, kafka: KafkaSettings, security: SecuritySettings, delivery: DeliverySettings
) -> None:
    """exactly_once: registers the transactional id (fencing an older instance that used it), within
    `transaction_call_timeout_s`."""
    try:
        producer.init_transactions(timeout_s=delivery.transaction_call_timeout_s)
    except CallAbandoned as exc:
        raise StartupError(
            f"exactly_once: cannot initialise transactions: {exc} (bootstrap servers: "
            f"{kafka.bootstrap_servers}); the transaction coordinator did not answer. Nothing was "
            "consumed."
        ) from exc
    except KafkaException as exc:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if error is not None and is_authorization_error(error):
            resource = f"transactional id {producer.transactional_id!r}"
            raise refusal(security, "WRITE", resource, error) from exc
        raise StartupError(f"exactly_once: cannot initialise transactions: {exc.args[0]}") from exc


def output_topic_limits(
    producer: ResultProducer, kafka: KafkaSettings, security: SecuritySettings
) -> tuple[dict[str, int], dict[str, int]]:
    """Partition counts and max.message.bytes of the output and dead-letter topics (which must exist; the
    limits capped at the producer's own), after the start-up topic checks (`worker.kafka.topic_checks`: a
    refusal is a StartupError, a warning a log line)."""
    check_input_topic(producer, kafka, security)
    partition_counts: dict[str, int] = {}
    max_message_bytes: dict[str, int] = {}
    for topic in (kafka.output_topic, kafka.dlq_topic):
        try:
            partition_counts[topic] = producer.partition_count(topic)
            limit = producer.topic_max_message_bytes(topic)
            max_message_bytes[topic] = min(limit, PRODUCER_MAX_MESSAGE_BYTES)
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is not None and is_authorization_error(error):
                raise refusal(security, "WRITE", f"topic {topic!r}", error) from exc
            # librdkafka's own lines saying why (e.g. "SASL authentication error") reach the log when the
            # worker's exit closes the producer (ResultProducer.close).
            raise StartupError(
                f"{exc.args[0]} (bootstrap servers: {kafka.bootstrap_servers}): check the topic's name, or "
                "create it (`sentiment-worker topics create --bootstrap-servers "
                f"{kafka.bootstrap_servers}`). Nothing was consumed."
            ) from exc
    facts = {
        topic: TopicFacts(producer.partition_count(topic), producer.topic_configs(topic))
        for topic in dict.fromkeys([kafka.input_topic, kafka.output_topic, kafka.dlq_topic])
    }
    input_limit = producer.topic_max_message_bytes(kafka.input_topic)
    facts[kafka.input_topic] = _with_limit(facts[kafka.input_topic], input_limit)
    dlq_limit = producer.topic_max_message_bytes(kafka.dlq_topic)
    facts[kafka.dlq_topic] = _with_limit(facts[kafka.dlq_topic], dlq_limit)
    settle_topic_findings(topic_findings(kafka, facts))
    return partition_counts, max_message_bytes


def _with_limit(facts: TopicFacts, limit: int) -> TopicFacts:
    return TopicFacts(facts.partitions, {**facts.configs, "max.message.bytes": str(limit)})


def settle_topic_findings(findings: list[TopicFinding]) -> None:
    """`run`'s verdict on the start-up topic checks (`worker.kafka.topic_checks`, the ones `topics check`
    and `doctor` report): the first `refuse` is a StartupError (exit 2); each `warn` one log line."""
    for finding in findings:
        if finding.severity == "refuse":
            raise StartupError(f"{finding.line()}. Nothing was consumed.")
    for finding in findings:
        if finding.severity == "warn":
            log.warning("topic check %s", finding.line())


def check_fetch_room(kafka: KafkaSettings, input_limit: int) -> None:
    """Refuses to start (StartupError, exit 2) when a record batch the input topic accepts (`input_limit`,
    its max.message.bytes) could not be received: a fetch response larger than receive_message_max_bytes is
    refused by librdkafka and fetched again for ever, stalling every partition of that broker."""
    facts = {kafka.input_topic: TopicFacts(1, {"max.message.bytes": str(input_limit)})}
    settle_topic_findings([f for f in topic_findings(kafka, facts) if f.check == "fetch room"])


_UNREACHABLE = frozenset(
    {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
)


def unreachable(kafka: KafkaSettings, exc: KafkaException) -> StartupError | None:
    """The error to stop with when `exc` says no broker answered at start-up (None for anything else)."""
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if error is None or error.code() not in _UNREACHABLE:
        return None
    return StartupError(
        f"no Kafka broker answered at {kafka.bootstrap_servers} ({error.str()}): check "
        "SENTIMENT_BOOTSTRAP_SERVERS and that a broker runs there (`make kafka-up` starts the local one). "
        "Nothing was consumed."
    )


def check_input_topic(producer: ResultProducer, kafka: KafkaSettings, security: SecuritySettings) -> None:
    """Refuses to start (StartupError, exit 2) when no broker answers or the input topic does not exist: a
    consumer would subscribe to nothing and idle, saying so once."""
    try:
        producer.partition_count(kafka.input_topic)
    except KafkaException as exc:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if error is not None and is_authorization_error(error):
            raise refusal(security, "READ", f"topic {kafka.input_topic!r}", error) from exc
        raise unreachable(kafka, exc) or StartupError(
            f"input topic {kafka.input_topic!r} cannot be read: {exc.args[0]} (bootstrap servers: "
            f"{kafka.bootstrap_servers}); check SENTIMENT_INPUT_TOPIC, or create the topic "
            f"(`sentiment-worker topics create --bootstrap-servers {kafka.bootstrap_servers}`). Nothing was "
            "consumed."
        ) from exc


def open_consumer(
    kafka: KafkaSettings,
    security: SecuritySettings,
    delivery: DeliverySettings,
    rebalance: Rebalance,
    *,
    transactional: bool,
) -> ReviewConsumer:
    """The group member reading the input topic (not yet subscribed); `transactional`: commits are left to
    the producer's transactions."""
    try:
        return ReviewConsumer(
            librdkafka_common(kafka, security),
            group_id=kafka.group_id,
            topic=kafka.input_topic,
            commit_interval_ms=delivery.commit_interval_ms,
            max_poll_interval_ms=kafka.max_poll_interval_ms,
            session_timeout_ms=kafka.session_timeout_ms,
            on_assign=rebalance.on_assign,
            on_revoke=rebalance.on_revoke,
            on_lost=rebalance.on_lost,
            transactional=transactional,
            fetch_limits=kafka.consumer_fetch_limits(),
        )
    except KafkaException as exc:
        raise StartupError(f"the Kafka client settings were rejected: {kafka_error_text(exc)}") from exc


@dataclass(frozen=True)
class KafkaClients:
    """How the worker opens its producer and consumer: the real clients unless a test passes others."""

    open_producer: Callable[[KafkaSettings, SecuritySettings, DeliverySettings], ResultProducer] = (
        open_producer
    )
    open_consumer: Callable[..., ReviewConsumer] = open_consumer
