"""Publishing results and dead letters with an idempotent producer.

Delivery callbacks run inside `poll()`/`flush()` on the caller's thread; they only record what happened
(`take_deliveries()`). What a delivery means (acknowledged, too large and replaced, failed) is the
publisher's to decide (`worker.kafka.publisher`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from worker.kafka.deadline_calls import CallAbandoned, DeadlineCalls

log = logging.getLogger(__name__)

_KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
_REFUSED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED})
_ABORT_SERVE_S = 5.0  # longest an abort waits for the transaction's delivery reports to be served
_COMMIT_STEP_S = 1.0  # a longer commit is resumed (librdkafka allows it after a timeout)
_CALL_SLACK_S = 1.0  # a transaction call is given up this long after its own timeout (which it may not keep)
T = TypeVar("T")
GiveUp = Callable[[], bool]
OnWait = Callable[[str, float], None]  # (the call, seconds waited so far)


def _never() -> bool:
    return False


# A record batch of one record: batch header + record framing, generously.
_RECORD_OVERHEAD_BYTES = 512
PRODUCER_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The producer's own limit on a record (librdkafka message.max.bytes): a larger one is refused before it
is sent, whatever the topic accepts."""


class SourcePosition(NamedTuple):
    """Where an input came from: the offset its output acknowledges. (The per-record types are named
    tuples: immutable, and built in a third of a frozen dataclass's time, several times per review.)"""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None


class OutboundRecord(NamedTuple):
    """One record to publish for one input offset: a result or a dead letter."""

    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None
    headers: list[tuple[str, bytes | None]] | None  # None: a header without a value (Kafka allows it)
    source: SourcePosition
    kind: str  # "result" or a dead-letter kind
    label: str | None = None  # a result's label, confidence and model version (counted when acknowledged)
    confidence: float | None = None
    model_version: str | None = None


class Delivery(NamedTuple):
    """A broker acknowledgement (error is None) or a definitive failure of one record."""

    record: OutboundRecord
    error: KafkaError | None


@dataclass(frozen=True)
class AbortedTransaction:
    """A transaction `publish_transaction` aborted: the abortable error, and the records of it refused as
    too large (MSG_SIZE_TOO_LARGE), which must not be sent as they are again."""

    error: KafkaError
    too_large: tuple[OutboundRecord, ...] = ()


def _too_large(delivery: Delivery) -> bool:
    return delivery.error is not None and delivery.error.code() == KafkaError.MSG_SIZE_TOO_LARGE


def _given_up(exc: KafkaException) -> CallAbandoned | None:
    """A transaction call that failed without an abortable or fatal error, only by running out of time (or
    any retriable error at its deadline): the transaction is given up like a call that never returned."""
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if error is None or error.fatal() or not error.retriable():
        return None
    return CallAbandoned(f"{error.str()}")


def record_size(record: OutboundRecord) -> int:
    """An upper estimate of the bytes `record` takes on the broker (uncompressed, one per batch): key,
    value, header names and values, and framing."""
    headers = sum(len(name) + len(value or b"") for name, value in record.headers or ())
    return len(record.key or b"") + len(record.value or b"") + headers + _RECORD_OVERHEAD_BYTES


class ResultProducer:
    """An idempotent producer for the output and dead-letter topics."""

    def __init__(
        self,
        common_conf: dict[str, Any],
        *,
        linger_ms: int = 5,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> None:
        conf = dict(common_conf)
        conf.update(
            {
                # Idempotence: no duplicates from producer retries, and order per partition is kept
                # (acks=all, max.in.flight<=5 are implied).
                "enable.idempotence": True,
                "linger.ms": linger_ms,
                "compression.type": "lz4",
                # Dead letters carry the input's value plus headers: allow more than an input can be.
                # The topic's max.message.bytes still decides; larger records are replaced (see publisher).
                "message.max.bytes": PRODUCER_MAX_MESSAGE_BYTES,
            }
        )
        if transactional_id is not None:
            # Exactly-once: a stable id per replica, so a restarted replica fences its zombie and aborts
            # the transaction it left open.
            conf["transactional.id"] = transactional_id
            conf["transaction.timeout.ms"] = transaction_timeout_ms
        self._common_conf = dict(common_conf)
        self._conf = conf
        self._producer = Producer(conf)
        self._transactional = transactional_id is not None
        self.transactional_id = transactional_id
        self._deliveries: list[Delivery] = []
        self._calls = DeadlineCalls("txn-call")  # transaction calls, each with a deadline
        self._given_up: list[Producer] = []  # producers whose transaction call did not return in time
        self._partition_counts: dict[str, int] = {}
        self._closed = False

    def publish(self, record: OutboundRecord) -> None:
        """Queues one record; blocks (serving delivery callbacks) while librdkafka's queue is full."""
        deliveries = self._deliveries

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            deliveries.append(Delivery(record, err))

        kwargs: dict[str, Any] = {"value": record.value, "key": record.key, "on_delivery": on_delivery}
        if record.partition is not None:
            kwargs["partition"] = record.partition
        if record.headers:
            kwargs["headers"] = record.headers
        while True:
            try:
                self._producer.produce(record.topic, **kwargs)
                return
            except BufferError:
                # librdkafka's local queue is full: serve delivery reports to make room (backpressure).
                self._producer.poll(0.1)
            except KafkaException as exc:
                error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if error is None or error.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                    raise
                self._record_delivery(record, error)  # reported like a refused delivery: the caller decides
                return

    def _record_delivery(self, record: OutboundRecord, err: KafkaError | None) -> None:
        self._deliveries.append(Delivery(record, err))

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serves delivery callbacks."""
        self._producer.poll(timeout_s)

    def flush(self, timeout_s: float) -> int:
        """Waits up to `timeout_s` for every queued record; returns how many are still unacknowledged."""
        return int(self._producer.flush(timeout_s))

    def take_deliveries(self) -> list[Delivery]:
        """Returns and forgets the deliveries recorded since the last call."""
        taken = self._deliveries[:]
        self._deliveries.clear()  # the same list: callbacks of records in flight append to it
        return taken

    def partition_count(self, topic: str, timeout_s: float = 10.0) -> int:
        """Number of partitions of `topic` (cached); raises when the topic does not exist."""
        if topic not in self._partition_counts:
            metadata = self._producer.list_topics(topic, timeout=timeout_s)
            info = metadata.topics.get(topic)
            if info is not None and info.error is not None and info.error.code() in _REFUSED:
                raise KafkaException(info.error)  # the caller names the missing ACL
            if info is None or info.error is not None or not info.partitions:
                reason = info.error if info is not None else "not in metadata"
                # No advice here: the caller says what to do (check_input_topic, output_topic_limits).
                raise KafkaException(f"topic {topic!r} is not available ({reason})")
            self._partition_counts[topic] = len(info.partitions)
        return self._partition_counts[topic]

    # ----- exactly-once -----
    def init_transactions(self, timeout_s: float, give_up: GiveUp = _never) -> None:
        """Registers the transactional id: fences older producers with it and finishes their open transaction
        (committed or aborted, as far as it got). A retriable timeout may be resumed by calling again;
        CallAbandoned when the call did not return at all (`renew` then)."""
        init = self._producer.init_transactions
        self._txn_call(init, timeout_s, timeout_s=timeout_s, what="init_transactions", give_up=give_up)

    def renew(self) -> None:
        """Gives up the producer after a transaction call on it did not return in time (CallAbandoned): a
        fresh one with the same settings and transactional id takes its place, to be initialised
        (`init_transactions`), which fences the old one and finishes its transaction. The old one is kept,
        never used again, so that its call can return; its acknowledgements are not counted."""
        if not self._calls.stuck:  # every call given up on has returned: their producers may go
            self._given_up.clear()
        self._given_up.append(self._producer)
        self._producer = Producer(self._conf)
        self._deliveries = []  # the old producer's callbacks append to the old list

    @property
    def stuck_calls(self) -> int:
        """Transaction calls given up on that have not returned yet."""
        return self._calls.stuck

    def _txn_call(
        self,
        fn: Callable[..., T],
        *args: Any,
        timeout_s: float,
        what: str,
        give_up: GiveUp,
        on_wait: OnWait | None = None,
    ) -> T:
        """`fn(*args)` with `timeout_s` (which librdkafka may not keep) and a deadline that it keeps: given up
        `_CALL_SLACK_S` later, or when `give_up()` (a stop out of time): CallAbandoned."""
        waited = None if on_wait is None else (lambda seconds: on_wait(what, seconds))
        return self._calls.call(
            fn, *args, timeout_s=timeout_s + _CALL_SLACK_S, what=what, give_up=give_up, on_wait=waited
        )

    def _commit(self, deadline: float, give_up: GiveUp, on_wait: OnWait | None) -> None:
        """Commits the open transaction by `deadline` (monotonic seconds).

        Once the broker refused a record as too large, the transaction's other records stay queued until
        an abort, and a commit would wait for them until the deadline and fail with a non-abortable
        timeout: the commit is made in steps, and when a step times out after such a refusal, the queued
        records are purged, so the next step raises the abortable error."""
        while True:
            step_s = max(0.001, min(_COMMIT_STEP_S, deadline - time.monotonic()))
            try:
                self._txn_call(self._producer.commit_transaction, step_s, timeout_s=step_s,
                               what="commit_transaction", give_up=give_up, on_wait=on_wait)  # fmt: skip
                return
            except KafkaException as exc:
                error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if error is None or not error.retriable() or time.monotonic() >= deadline:
                    raise
                self._producer.poll(0)  # serves the delivery reports in
                if any(_too_large(d) for d in self._deliveries):
                    self._producer.purge()  # nothing of it may commit now; frees the commit to fail

    def publish_transaction(
        self,
        records: list[OutboundRecord],
        group_metadata: Any,
        timeout_s: float,
        *,
        give_up: GiveUp = _never,
        on_wait: OnWait | None = None,
    ) -> AbortedTransaction | None:
        """Publishes ``records`` and, for each source partition, the offset after its last record, in one
        transaction whose calls have `timeout_s` seconds in all. Returns None once committed, or what was
        aborted (the caller reads those partitions again from their committed offsets). CallAbandoned when a
        call did not return by the deadline or kept timing out: whether the transaction committed is known
        once a renewed producer is initialised (`renew`, `init_transactions`). Any other error is raised. A
        record refused before it was sent (larger than the producer's limit) aborts the transaction too:
        committing would commit its input's offset without its output."""
        next_offsets: dict[tuple[str, int], int] = {}
        for record in records:
            key = (record.source.topic, record.source.partition)
            next_offsets[key] = max(next_offsets.get(key, 0), record.source.offset + 1)
        first = len(self._deliveries)
        deadline = time.monotonic() + timeout_s
        try:
            self._txn_call(self._producer.begin_transaction, timeout_s=timeout_s, what="begin_transaction",
                           give_up=give_up)  # fmt: skip
            for record in records:
                self.publish(record)
            unsent = next((d.error for d in self._deliveries[first:] if _too_large(d)), None)
            if unsent is not None:  # refused before it was sent: committing would lose it
                return self._abort(unsent, first, timeout_s, give_up)
            offsets = [TopicPartition(t, p, o) for (t, p), o in next_offsets.items()]
            left_s = max(0.001, deadline - time.monotonic())
            self._txn_call(self._producer.send_offsets_to_transaction, offsets, group_metadata, left_s,
                           timeout_s=left_s, what="send_offsets_to_transaction", give_up=give_up,
                           on_wait=on_wait)  # fmt: skip
            self._commit(deadline, give_up, on_wait)
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is not None and error.txn_requires_abort():
                return self._abort(error, first, timeout_s, give_up)
            given_up = _given_up(exc)
            if given_up is None:
                raise
            raise given_up from exc
        return None

    def _abort(self, error: KafkaError, first: int, timeout_s: float, give_up: GiveUp) -> AbortedTransaction:
        # librdkafka's abort waits for the delivery reports of the transaction's records to be served, and
        # confluent-kafka does not serve them meanwhile: serve them first (else the abort times out, a
        # non-abortable error). Not purged: dropping records in flight leaves a gap in the idempotent
        # producer's sequence numbers, which aborts the next transaction too. Those refused as too large are
        # named before the deliveries of the aborted transaction are forgotten.
        deadline = time.monotonic() + timeout_s
        serve_until = min(deadline, time.monotonic() + _ABORT_SERVE_S)
        while len(self._producer) and time.monotonic() < serve_until and not give_up():
            self._producer.poll(0.05)
        left_s = max(1.0, deadline - time.monotonic())
        try:
            abort = self._producer.abort_transaction
            self._txn_call(abort, left_s, timeout_s=left_s, what="abort_transaction", give_up=give_up)
        except KafkaException as exc:
            given_up = _given_up(exc)
            if given_up is None:
                raise
            raise given_up from exc
        too_large = tuple(d.record for d in self._deliveries[first:] if _too_large(d))
        self._deliveries.clear()  # acks (and failures) of aborted records mean nothing
        return AbortedTransaction(error, too_large)

    def topic_configs(self, topic: str, timeout_s: float = 10.0) -> dict[str, str]:
        """The topic's configs as the broker describes them (empty when it does not say: the start-up
        checks then assume the broker's defaults)."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        admin = AdminClient(dict(self._common_conf))
        try:
            configs = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
        except KafkaException as exc:
            log.warning("cannot read the configs of %s (%s); assuming the broker's defaults", topic, exc)
            return {}
        return {key: entry.value for key, entry in configs.items() if entry.value is not None}

    def topic_max_message_bytes(self, topic: str, timeout_s: float = 10.0) -> int:
        """The topic's max.message.bytes (the largest record batch the broker accepts for it)."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        conf = dict(self._common_conf)
        admin = AdminClient(conf)
        try:
            configs = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
            return int(configs["max.message.bytes"].value)
        except (KafkaException, KeyError, ValueError) as exc:
            log.warning("cannot read max.message.bytes of %s (%s); assuming Kafka's default", topic, exc)
            return _KAFKA_DEFAULT_MAX_MESSAGE_BYTES

    def broker_answers(self, timeout_s: float) -> bool:
        """True when a broker answers a metadata request within `timeout_s` (for readiness)."""
        try:
            metadata = self._producer.list_topics(timeout=timeout_s)
        except KafkaException:
            return False
        return bool(metadata.brokers)

    def close(self) -> None:
        """Hands over what librdkafka queued for this thread before the client goes: its log lines reach
        the `librdkafka` logger only when the client is polled, and lines still queued when it is destroyed
        are lost (e.g. why the brokers refused it: "SASL authentication error"). Does not flush: the
        worker's drain flushes within its shutdown time. Idempotent."""
        if not self._closed:
            self._closed = True
            self._producer.poll(0)  # serves every queued event (log lines, late delivery reports) at once

    def pending(self) -> int:
        """Records queued or in flight, not yet acknowledged."""
        return len(self._producer)
