"""Timestamps of the messages at given offsets, read from the broker without joining any group.

Used for lag in seconds where nothing was consumed yet: the `lag` command (the message at the group's
committed offset) and the worker's gauge for a partition it has not fetched from yet.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition


def timestamps_at(
    common_conf: dict[str, Any], topic: str, offsets: dict[int, int], timeout_s: float
) -> dict[int, int]:
    """Timestamp (ms) of the message at `offsets[partition]`, per partition, fetched by a consumer that
    only `assign()`s (never subscribes or commits). A partition is missing from the answer when its
    message could not be read within `timeout_s` (deleted by retention, nothing there, broker silent)."""
    if not offsets:
        return {}
    conf = dict(common_conf)
    conf.update(
        {
            # A throw-away group id: librdkafka wants one, but assign() never joins and we never commit.
            "group.id": f"sentiment-lag-probe-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # The offset may have been deleted by retention since we read it: then report no timestamp.
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            # The worker reads read_committed; the first message it waits for is the first committed one.
            "isolation.level": "read_committed",
            "fetch.max.bytes": 1_048_576,
        }
    )
    consumer = Consumer(conf)
    found: dict[int, int] = {}
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
        deadline = time.monotonic() + timeout_s
        pending = set(offsets)
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(len(pending), min(0.5, max(0.01, deadline - time.monotonic()))):
                p = message.partition()
                if p not in pending:
                    continue
                err = message.error()
                if err is not None:
                    if err.code() in (KafkaError._PARTITION_EOF, KafkaError._AUTO_OFFSET_RESET):
                        pending.discard(p)
                    continue
                ts_type, ts = message.timestamp()
                if ts_type and ts >= 0:
                    found[p] = int(ts)
                pending.discard(p)
                consumer.incremental_unassign([TopicPartition(topic, p)])
    finally:
        consumer.close()
    return found
