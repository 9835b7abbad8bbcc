"""Reading and writing whole topics, for the bench and the tests: create and delete a run's topics, produce a
backlog as fast as the broker takes it, read a topic back from the beginning."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

log = logging.getLogger(__name__)


def create_run_topics(
    common: dict[str, Any],
    names: Sequence[str],
    partitions: int,
    *,
    max_message_bytes: int | None = None,
    compacted: bool = False,
) -> None:
    """Creates `names`; their records carry the broker's append time (LogAppendTime) as their timestamp;
    `max_message_bytes`: their max.message.bytes (default: the broker's); `compacted`: cleanup.policy
    compact (a control or status topic, as `topics create` makes them)."""
    admin = AdminClient(common)
    config = {"message.timestamp.type": "LogAppendTime"}
    if compacted:
        config["cleanup.policy"] = "compact"
    if max_message_bytes is not None:
        config["max.message.bytes"] = str(max_message_bytes)
    topics = [
        NewTopic(name, num_partitions=partitions, replication_factor=1, config=config) for name in names
    ]
    for name, future in admin.create_topics(topics, operation_timeout=30).items():
        future.result(timeout=60)
        log.debug("created %s", name)


def phase_topics(common: dict[str, Any], prefix: str, phase: str, partitions: int) -> dict[str, str]:
    """A phase's topic and group names (`<prefix>-<phase>-reviews|results|dlq|group`); its reviews, results
    and dead-letter topics created."""
    names = {kind: f"{prefix}-{phase}-{kind}" for kind in ("reviews", "results", "dlq", "group")}
    create_run_topics(common, [names["reviews"]], partitions)
    # As `topics create` makes them: a dead letter (its input plus headers) fits, so the worker starts.
    create_run_topics(common, [names["results"], names["dlq"]], partitions, max_message_bytes=2 * 1024 * 1024)
    return names


def delete_run_topics(common: dict[str, Any], prefix: str) -> list[str]:
    """Deletes every topic whose name starts with `prefix` (this run's); returns their names."""
    admin = AdminClient(common)
    names = [name for name in admin.list_topics(timeout=30).topics if name.startswith(prefix)]
    for name, future in (admin.delete_topics(names, operation_timeout=30) if names else {}).items():
        try:
            future.result(timeout=60)
        except Exception as exc:  # noqa: BLE001 - cleanup is best effort; say what was left behind
            log.warning("could not delete topic %s: %s", name, exc)
    return names


def produce_backlog(common: dict[str, Any], topic: str, texts: Sequence[str], prefix: str) -> float:
    """Produces `{"id": prefix-i, "text": ...}` for every text as fast as possible; returns seconds."""
    producer = Producer({**common, "linger.ms": 20, "compression.type": "lz4", "enable.idempotence": True})
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    started = time.perf_counter()
    for i, text in enumerate(texts):
        value = json.dumps({"id": f"{prefix}-{i}", "text": text}, ensure_ascii=False).encode()
        while True:
            try:
                producer.produce(topic, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120) or failed:
        raise RuntimeError(f"could not produce the backlog: {failed[:1] or 'flush timed out'}")
    return time.perf_counter() - started


def read_topic(
    common: dict[str, Any], topic: str, *, expected: int, timeout_s: float = 60.0, settle_s: float = 0.0
) -> list[Message]:
    """Every record of `topic` from the beginning, until `expected` arrived (then `settle_s` more, to catch
    extras) or `timeout_s` passed. Read-committed (transactional outputs count once committed); commits
    nothing (a throw-away group)."""
    consumer = Consumer(
        {
            **common,
            "group.id": f"topic-reader-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    messages: list[Message] = []
    deadline = time.monotonic() + timeout_s
    settle_until: float | None = None
    try:
        while time.monotonic() < deadline:
            if settle_until is not None and time.monotonic() >= settle_until:
                break
            messages += [m for m in consumer.consume(1000, 0.2) if m.error() is None]
            if len(messages) >= expected and settle_until is None:
                settle_until = time.monotonic() + settle_s
    finally:
        consumer.close()
    return messages


def result_rows(messages: Sequence[Any]) -> list[tuple[dict[str, Any], int | None]]:
    """(result JSON, broker append time in ms or None) per record."""
    rows = []
    for m in messages:
        ts_type, ts = m.timestamp()
        rows.append((json.loads(m.value()), ts if ts_type == TIMESTAMP_LOG_APPEND_TIME else None))
    return rows


def conservation(
    ids_in: set[str], results: Sequence[dict[str, Any]], dead_ids: Sequence[str]
) -> dict[str, Any]:
    """Every input id out exactly once, as a result or a dead letter: counts, and `ok`."""
    ids_out = [str(r["id"]) for r in results] + list(dead_ids)
    return {
        "inputs": len(ids_in),
        "outputs": len(ids_out),
        "missing": len(ids_in - set(ids_out)),
        "duplicates": len(ids_out) - len(set(ids_out)),
        "ok": set(ids_out) == ids_in and len(ids_out) == len(ids_in),
    }


def dead_letter_ids(messages: Sequence[Any]) -> list[str]:
    """The `id` of each dead letter's original JSON ("?" where the original had none)."""
    ids = []
    for m in messages:
        try:
            ids.append(str(json.loads(m.value())["id"]))
        except (ValueError, KeyError, TypeError):
            ids.append("?")
    return ids


def read_drain(
    common: dict[str, Any],
    names: dict[str, str],
    count: int,
    summary: dict[str, Any],
    *,
    prefix: str = "m",
    results_timeout_s: float = 120,
) -> tuple[list[tuple[dict[str, Any], int | None]], list[Any], dict[str, Any]]:
    """Reads back a drain of ``count`` reviews ``<prefix>-0`` …: (results with their append times, the dead
    letters the worker's ``summary`` counts, conservation by id)."""
    results = result_rows(read_topic(common, names["results"], expected=count, timeout_s=results_timeout_s))
    dead = read_topic(common, names["dlq"], expected=int(summary.get("dead_letters", 0)), timeout_s=30)
    ids = {f"{prefix}-{i}" for i in range(count)}
    return results, dead, conservation(ids, [r for r, _ in results], dead_letter_ids(dead))


def drain_seconds(results: Sequence[tuple[dict[str, Any], int | None]]) -> float:
    """Seconds from the first review consumed to the last result acknowledged (its append time, else
    its processed_at)."""
    first_consume = min(r["processed_at_ms"] - r["processing_time_ms"] for r, _ in results)
    last_ack = max((ts if ts is not None else r["processed_at_ms"]) for r, ts in results)
    return (last_ack - first_consume) / 1000.0
