"""OutboundRecords' partitioning, the README's rule: by default a result (and a dead letter) goes to the
output partition with the same number as its input partition, modulo that topic's partition count; with
`output_partitioning=key`, librdkafka's partitioner decides (no partition set)."""

from __future__ import annotations

import numpy as np
import pytest

from schemas import DeadLetterKind
from schemas.sentiment_result import ModelRef
from worker.stream.decode import DecodedReview
from worker.stream.producer import SourcePosition
from worker.stream.records import InputMessage, OutboundRecords

OUT, DLQ = "results", "dlq"


def records(
    partitioning: str = "source", out_partitions: int = 3, dlq_partitions: int = 2
) -> OutboundRecords:
    return OutboundRecords(
        labels=["negative", "positive"],
        model=ModelRef(name="m", version="1"),
        output_topic=OUT,
        dlq_topic=DLQ,
        worker_id="w",
        partitioning=partitioning,
        partition_counts={OUT: out_partitions, DLQ: dlq_partitions},
        max_message_bytes={OUT: 1 << 20, DLQ: 1 << 20},
    )


def message(partition: int, offset: int = 5) -> InputMessage:
    return InputMessage(SourcePosition("reviews", partition, offset, None), b"k", b"{}", consumed_at=0.0)


@pytest.mark.parametrize("source_partition", range(8))
def test_results_and_dead_letters_go_to_the_source_partition_modulo_the_partition_count(
    source_partition: int,
) -> None:
    outbound = records(out_partitions=3, dlq_partitions=2)
    item = message(source_partition)
    result = outbound.result(item, DecodedReview("id", "好", {}), np.array([0.2, 0.8]), now=1.0)
    dead = outbound.dead_letter(item, DeadLetterKind.EMPTY_TEXT, "empty")
    assert (result.topic, result.partition) == (OUT, source_partition % 3)
    assert (dead.topic, dead.partition) == (DLQ, source_partition % 2)


def test_same_partition_numbers_when_the_output_has_as_many_partitions() -> None:
    outbound = records(out_partitions=6)
    assert [outbound.partition(OUT, p) for p in range(6)] == list(range(6))


def test_key_partitioning_leaves_the_partition_to_the_producer() -> None:
    outbound = records(partitioning="key")
    item = message(4)
    assert (
        outbound.result(item, DecodedReview("id", "好", {}), np.array([0.2, 0.8]), now=1.0).partition is None
    )
    assert outbound.dead_letter(item, DeadLetterKind.EMPTY_TEXT, "empty").partition is None
