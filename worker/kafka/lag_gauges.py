"""The consumer-lag gauges: per partition, messages and seconds behind, refreshed on the poll thread."""

from __future__ import annotations

import time
from typing import Any

from worker.kafka.consumer import PartitionBacklog, ReviewConsumer
from worker.kafka.partitions import PartitionBook, PartitionKey
from worker.kafka.timestamps import timestamps_at
from worker.metrics import WorkerMetrics

_WAITING_TIMESTAMP_TIMEOUT_S = 2.0


class LagGauges:
    """Sets `sentiment_consumer_lag_messages` and `_seconds` for every assigned partition.

    Messages behind come from the broker's high watermarks (`ReviewConsumer.lag`); seconds behind from the
    book's lag clock. A partition behind that nothing was fetched from yet has no consumed message to date
    it: the timestamp of the message it waits for is read from the broker, once per partition and offset.
    """

    def __init__(
        self, metrics: WorkerMetrics, book: PartitionBook, common_conf: dict[str, Any], input_topic: str
    ) -> None:
        self._metrics = metrics
        self._book = book
        self._common_conf = common_conf
        self._input_topic = input_topic

    def refresh(self, consumer: ReviewConsumer) -> None:
        backlog = consumer.lag()
        self._read_waiting_timestamps(backlog)
        now_ms = time.time() * 1000.0
        for (topic, partition), left in backlog.items():
            self._metrics.consumer_lag_messages.labels(topic, str(partition)).set(left.lag_messages)
            seconds = self._book.lag_seconds((topic, partition), left.lag_messages, now_ms)
            if seconds is not None:
                self._metrics.consumer_lag_seconds.labels(topic, str(partition)).set(seconds)

    def _read_waiting_timestamps(self, backlog: dict[PartitionKey, PartitionBacklog]) -> None:
        clock = self._book.lag_clock
        wanted = {
            key: left.next_offset
            for key, left in backlog.items()
            if not left.fetched and left.lag_messages > 0 and not clock.knows_waiting(key, left.next_offset)
        }
        if not wanted:
            return
        found = timestamps_at(
            self._common_conf,
            self._input_topic,
            {partition: offset for (_, partition), offset in wanted.items()},
            timeout_s=_WAITING_TIMESTAMP_TIMEOUT_S,
        )
        for key, offset in wanted.items():
            clock.waiting(key, offset, found.get(key[1]))
