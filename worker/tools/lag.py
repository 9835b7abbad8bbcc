"""Consumer-group lag of the input topic, as the broker sees it (the `lag` command).

Per partition: the group's committed offset, the log end offset (high watermark), lag in messages
(end − committed) and in seconds (age of the first message not yet committed, read from the broker), and
the group member that owns the partition — like `kafka-consumer-groups --describe`, plus the seconds.
Nothing here joins the group or commits: offsets are read with the admin API, and the first unconsumed
message is fetched by a consumer that only `assign()`s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

try:  # the model class moved between client versions
    from confluent_kafka import ConsumerGroupTopicPartitions
except ImportError:  # pragma: no cover
    from confluent_kafka.admin import ConsumerGroupTopicPartitions  # type: ignore[no-redef,attr-defined]

from worker.errors import ConfigurationError, OperationError
from worker.kafka.timestamps import timestamps_at

_NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group has committed nothing for the partition


class LagError(OperationError):
    """The lag could not be read; the message says what to check."""


class TopicMissingError(ConfigurationError):
    """The topic does not exist: a setting to fix (or a topic to create), not a failure while running."""


@dataclass(frozen=True)
class PartitionLag:
    """Lag of one partition for one group.

    `committed_offset` is the next offset the group will read (None: nothing committed; the lag then
    counts from the log start, as the worker's `auto.offset.reset=earliest` would). `lag_seconds` is the
    age of the message at the committed offset (0 when caught up; None when it could not be fetched,
    e.g. deleted by retention or not readable under read_committed).
    """

    topic: str
    partition: int
    committed_offset: int | None
    log_start_offset: int
    log_end_offset: int
    lag_messages: int
    lag_seconds: float | None
    oldest_unconsumed_timestamp_ms: int | None
    member_id: str | None
    client_id: str | None
    host: str | None


@dataclass(frozen=True)
class GroupLag:
    """Lag of a group on a topic, partition by partition."""

    group: str
    state: str
    topic: str
    partitions: list[PartitionLag]
    measured_at_ms: int

    @property
    def total_lag_messages(self) -> int:
        return sum(p.lag_messages for p in self.partitions)

    @property
    def max_lag_seconds(self) -> float | None:
        known = [p.lag_seconds for p in self.partitions if p.lag_seconds is not None]
        return max(known) if known else None

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "state": self.state,
            "topic": self.topic,
            "measured_at_ms": self.measured_at_ms,
            "total_lag_messages": self.total_lag_messages,
            "max_lag_seconds": self.max_lag_seconds,
            "partitions": [asdict(p) for p in self.partitions],
        }


def lag_seconds_of(timestamp_ms: int | None, lag_messages: int, now_ms: float) -> float | None:
    """Age in seconds of the first unconsumed message; 0 when nothing is behind, never negative
    (producer clocks may run ahead of ours)."""
    if lag_messages <= 0:
        return 0.0
    if timestamp_ms is None:
        return None
    return max(0.0, (now_ms - timestamp_ms) / 1000.0)


def measure_lag(
    common_conf: dict[str, Any],
    group: str,
    topic: str,
    *,
    timeout_s: float = 10.0,
    now_ms: Callable[[], float] = lambda: time.time() * 1000.0,
) -> GroupLag:
    """Reads the lag of `group` on every partition of `topic` from the broker."""
    admin = AdminClient(dict(common_conf))
    partitions = _partitions_of(admin, topic, timeout_s)
    tps = [TopicPartition(topic, p) for p in partitions]
    committed = _committed(admin, group, tps, timeout_s)
    # High watermark (read_uncommitted), as kafka-consumer-groups and the worker's gauge use.
    ends = _offsets(admin, tps, OffsetSpec.latest(), timeout_s)
    starts = _offsets(admin, tps, OffsetSpec.earliest(), timeout_s)
    state, owners = _owners(admin, group, timeout_s)

    # Next offset the group reads: the committed one, else the log start (auto.offset.reset=earliest).
    positions = {p: _or(committed[p], starts[p]) for p in partitions}
    first_unread = {p: max(positions[p], starts[p]) for p in partitions if positions[p] < ends[p]}
    timestamps = timestamps_at(common_conf, topic, first_unread, timeout_s)
    measured = now_ms()

    rows = []
    for p in partitions:
        lag = max(0, ends[p] - positions[p])
        ts = timestamps.get(p)
        member = owners.get(p)
        rows.append(
            PartitionLag(
                topic=topic,
                partition=p,
                committed_offset=committed[p],
                log_start_offset=starts[p],
                log_end_offset=ends[p],
                lag_messages=lag,
                lag_seconds=lag_seconds_of(ts, lag, measured),
                oldest_unconsumed_timestamp_ms=ts if lag else None,
                member_id=member[0] if member else None,
                client_id=member[1] if member else None,
                host=member[2] if member else None,
            )
        )
    return GroupLag(group=group, state=state, topic=topic, partitions=rows, measured_at_ms=int(measured))


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


# ----- broker reads -----
def _partitions_of(admin: AdminClient, topic: str, timeout_s: float) -> list[int]:
    try:
        metadata = admin.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        raise LagError(f"cannot reach the broker: {exc.args[0].str()}") from None
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise TopicMissingError(
            f"topic {topic!r} does not exist: check --topic / SENTIMENT_INPUT_TOPIC and the bootstrap "
            "servers, or create it with `sentiment-worker topics create`"
        )
    return sorted(info.partitions)


def _committed(
    admin: AdminClient, group: str, tps: list[TopicPartition], timeout_s: float
) -> dict[int, int | None]:
    future = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, tps)], request_timeout=timeout_s
    )[group]
    result = _result(future, timeout_s, f"committed offsets of group {group!r}")
    return {
        tp.partition: (tp.offset if tp.offset >= 0 and tp.offset != _NO_OFFSET else None)
        for tp in result.topic_partitions
    }


def _offsets(
    admin: AdminClient, tps: list[TopicPartition], spec: OffsetSpec, timeout_s: float
) -> dict[int, int]:
    futures = admin.list_offsets({tp: spec for tp in tps}, request_timeout=timeout_s)
    return {
        tp.partition: int(_result(f, timeout_s, f"offsets of {tp.topic}[{tp.partition}]").offset)
        for tp, f in futures.items()
    }


def _owners(admin: AdminClient, group: str, timeout_s: float) -> tuple[str, dict[int, tuple[str, str, str]]]:
    """The group's state and, per partition, (member id, client id, host) of its current owner."""
    future = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group]
    description = _result(future, timeout_s, f"members of group {group!r}")
    owners: dict[int, tuple[str, str, str]] = {}
    for member in description.members or []:
        assignment = getattr(member, "assignment", None)
        for tp in getattr(assignment, "topic_partitions", None) or []:
            owners[tp.partition] = (member.member_id, member.client_id, member.host)
    state = getattr(description.state, "name", str(description.state))
    return state, owners


def _result(future: Any, timeout_s: float, what: str) -> Any:
    try:
        return future.result(timeout=timeout_s + 5)
    except KafkaException as exc:
        err = exc.args[0]
        raise LagError(f"cannot read {what}: {err.str() if hasattr(err, 'str') else err}") from None
    except TimeoutError:
        raise LagError(f"cannot read {what}: the broker did not answer in {timeout_s:g} s") from None


# ----- output -----
_COLUMNS = (
    "TOPIC",
    "PARTITION",
    "CURRENT-OFFSET",
    "LOG-END-OFFSET",
    "LAG",
    "LAG-SECONDS",
    "CONSUMER-ID",
    "HOST",
    "CLIENT-ID",
)


# What the broker's group states mean to someone who has not read the group protocol.
_STATE_NOTES = {
    "DEAD": "no members and no committed offsets: nothing has consumed it yet",
    "EMPTY": "no active members; the committed offsets stay",
    "PREPARING_REBALANCE": "members are joining or leaving",
    "COMPLETING_REBALANCE": "partitions are being assigned",
}


def format_table(lag: GroupLag) -> str:
    """A table like `kafka-consumer-groups --describe` with a LAG-SECONDS column; '-' = unknown/none."""

    def cell(value: object) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.1f}"
        return str(value)

    rows = [
        [
            p.topic,
            p.partition,
            p.committed_offset,
            p.log_end_offset,
            p.lag_messages,
            p.lag_seconds,
            p.member_id,
            p.host,
            p.client_id,
        ]
        for p in lag.partitions
    ]
    text_rows = [list(_COLUMNS)] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in text_rows) for i in range(len(_COLUMNS))]
    note = _STATE_NOTES.get(lag.state)
    lines = [f"GROUP {lag.group} ({lag.state}{': ' + note if note else ''})"]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in text_rows]
    max_s = lag.max_lag_seconds
    lines.append(
        f"total lag {lag.total_lag_messages} messages"
        + (f", oldest unconsumed message {max_s:.1f} s old" if max_s else "")
    )
    return "\n".join(lines)
