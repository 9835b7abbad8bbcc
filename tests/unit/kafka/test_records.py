"""OutboundRecords' partitioning, the README's rule: by default a result (and a dead letter) goes to the
output partition with the same number as its input partition, modulo that topic's partition count; with
`output_partitioning=key`, librdkafka's partitioner decides (no partition set)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from confluent_kafka import KafkaError

from schemas import DeadLetterKind
from schemas.dead_letter import parse_dead_letter_headers
from schemas.review_input import Review
from schemas.sentiment_result import ModelRef
from worker.kafka.producer import OutboundRecord, SourcePosition, record_size
from worker.kafka.records import InputMessage, OutboundRecords

OUT, DLQ = "results", "dlq"
MODEL = ModelRef(name="m", version="1")


def records(
    partitioning: str = "source",
    out_partitions: int = 3,
    dlq_partitions: int = 2,
    out_max_bytes: int = 1 << 20,
) -> OutboundRecords:
    return OutboundRecords(
        labels=["negative", "positive"],
        output_topic=OUT,
        dlq_topic=DLQ,
        worker_id="w",
        partitioning=partitioning,
        partition_counts={OUT: out_partitions, DLQ: dlq_partitions},
        max_message_bytes={OUT: out_max_bytes, DLQ: 1 << 20},
    )


def message(partition: int, offset: int = 5, consumed_at: float = 0.0) -> InputMessage:
    return InputMessage(
        SourcePosition("reviews", partition, offset, None), b"k", b"{}", consumed_at=consumed_at
    )


def result_of(outbound: OutboundRecords, item: InputMessage, now: float = 1.0) -> OutboundRecord:
    return outbound.result(item, Review("id", "好", {}), np.array([0.2, 0.8]), MODEL, now=now)


@pytest.mark.parametrize("source_partition", range(8))
def test_results_and_dead_letters_go_to_the_source_partition_modulo_the_partition_count(
    source_partition: int,
) -> None:
    outbound = records(out_partitions=3, dlq_partitions=2)
    item = message(source_partition)
    result = outbound.result(item, Review("id", "好", {}), np.array([0.2, 0.8]), MODEL, now=1.0)
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
        outbound.result(item, Review("id", "好", {}), np.array([0.2, 0.8]), MODEL, now=1.0).partition is None
    )
    assert outbound.dead_letter(item, DeadLetterKind.EMPTY_TEXT, "empty").partition is None


def test_a_record_exactly_at_max_message_bytes_is_sent_one_byte_more_is_replaced() -> None:
    size = record_size(result_of(records(), message(1)))
    at_limit = records(out_max_bytes=size)
    record = result_of(at_limit, message(1))
    assert at_limit.replacement(record) is None
    assert records().replacement(record) is None  # far below the limit
    over = records(out_max_bytes=size - 1)
    stand_in = over.replacement(result_of(over, message(1)))
    assert stand_in is not None
    assert (stand_in.topic, stand_in.kind, stand_in.value) == (DLQ, "value_too_large", None)
    assert over.replacement(stand_in) is None  # a stand-in has nothing left to drop


def test_a_record_the_broker_refused_as_too_large_is_replaced_other_refusals_are_not() -> None:
    outbound = records()
    record = result_of(outbound, message(1))
    stand_in = outbound.replacement(record, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert stand_in is not None and (stand_in.kind, stand_in.value) == ("value_too_large", None)
    assert outbound.replacement(record, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)) is None


def test_the_stand_in_for_a_too_large_result_drops_key_and_value_and_names_sizes_topic_and_source() -> None:
    outbound = records(out_max_bytes=600)
    result = result_of(outbound, message(1, offset=7))
    stand_in = outbound.replacement(result)
    assert stand_in is not None
    assert (stand_in.key, stand_in.value, stand_in.source) == (None, None, result.source)
    info = parse_dead_letter_headers(stand_in.headers)
    assert info.kind is DeadLetterKind.VALUE_TOO_LARGE
    assert (info.source_topic, info.source_partition, info.source_offset) == ("reviews", 1, 7)
    value_bytes = len(result.value or b"")
    assert info.reason.startswith(
        f"the result for this input is {value_bytes + 1} bytes (key 1 bytes, value {value_bytes} bytes), "
    )
    assert f"more than topic {OUT!r} accepts (max.message.bytes 600)" in info.reason
    assert "reviews partition 1 at offset 7" in info.reason
    assert "dead-lettered as" not in info.reason


HUGE_KEY_BYTES = 1_048_350  # the largest key the broker's default max.message.bytes takes with a small value


def test_a_result_with_a_key_near_one_megabyte_is_replaced_before_sending_by_a_stand_in_that_fits() -> None:
    outbound = records(out_max_bytes=1_048_588)
    item = InputMessage(
        SourcePosition("reviews", 2, 11, 1_700_000_000_000), b"k" * HUGE_KEY_BYTES, b"{}", consumed_at=0.0
    )
    result = result_of(outbound, item)
    assert len(result.value or b"") < 1000 and record_size(result) > 1_048_588  # the key counts
    stand_in = outbound.replacement(result)
    assert stand_in is not None and (stand_in.topic, stand_in.key, stand_in.value) == (DLQ, None, None)
    assert record_size(stand_in) < 4096  # fits any topic the worker starts with
    assert outbound.replacement(stand_in) is None  # nothing left to drop
    info = parse_dead_letter_headers(stand_in.headers)
    assert (info.source_topic, info.source_partition, info.source_offset) == ("reviews", 2, 11)
    assert info.source_timestamp_ms == 1_700_000_000_000
    assert f"(key {HUGE_KEY_BYTES} bytes, value {len(result.value or b'')} bytes)" in info.reason
    assert "max.message.bytes 1048588" in info.reason


def test_a_dead_letter_of_a_tombstone_with_a_huge_key_is_replaced_too() -> None:
    outbound = records()
    item = InputMessage(SourcePosition("reviews", 0, 4, None), b"k" * HUGE_KEY_BYTES, None, consumed_at=0.0)
    dead = outbound.dead_letter(item, DeadLetterKind.EMPTY_VALUE, "null value")
    stand_in = outbound.replacement(dead)
    assert stand_in is not None and (stand_in.key, stand_in.value) == (None, None)
    assert parse_dead_letter_headers(stand_in.headers).reason.endswith("dead-lettered as empty_value.")


def test_a_stand_in_the_broker_refuses_is_not_replaced_again() -> None:
    outbound = records()
    stand_in = outbound.too_large(result_of(outbound, message(1)))
    assert outbound.replacement(stand_in, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)) is None


def test_a_record_refused_in_an_aborted_transaction_goes_as_its_stand_in_until_one_commits() -> None:
    outbound = records()
    record = result_of(outbound, message(1, offset=3))
    other = result_of(outbound, message(1, offset=4))
    assert outbound.replacement(record) is None  # the estimate says it fits
    outbound.refused_in_aborted_transaction(record)
    for _attempt in range(2):  # the stand-in's own transaction may be aborted too (an epoch bump)
        stand_in = outbound.replacement(record)
        assert stand_in is not None and (stand_in.kind, stand_in.key, stand_in.value) == (
            "value_too_large",
            None,
            None,
        )
    outbound.committed([other])  # another input's transaction: still owed
    assert outbound.replacement(record) is not None
    outbound.committed([stand_in])  # the stand-in committed: remembered until then, not forever
    assert outbound.replacement(record) is None


@pytest.mark.parametrize(
    ("kind", "suffix"),
    [
        (DeadLetterKind.INVALID_JSON, " It was dead-lettered as invalid_json."),
        (DeadLetterKind.VALUE_TOO_LARGE, "max.message.bytes."),
    ],
)
def test_the_stand_in_for_a_too_large_dead_letter_says_why_it_was_dead_lettered(
    kind: DeadLetterKind, suffix: str
) -> None:
    outbound = records()
    item = InputMessage(SourcePosition("reviews", 0, 3, None), b"k", b"x" * 2000, consumed_at=0.0)
    stand_in = outbound.too_large(outbound.dead_letter(item, kind, "why"))
    info = parse_dead_letter_headers(stand_in.headers)
    assert (stand_in.key, stand_in.value, info.kind) == (None, None, DeadLetterKind.VALUE_TOO_LARGE)
    assert info.reason.startswith(
        "the dead letter for this input is 2001 bytes (key 1 bytes, value 2000 bytes)"
    )
    assert f"more than topic {DLQ!r} accepts" in info.reason
    assert info.reason.endswith(suffix)


@pytest.mark.parametrize(
    ("consumed_at", "now", "expected_ms"),
    [(10.0, 10.25, 250.0), (0.0, 0.0012344, 1.234), (5.0, 4.5, 0.0)],  # a clock step back gives 0
)
def test_processing_time_is_milliseconds_since_consumed_rounded_to_microseconds(
    consumed_at: float, now: float, expected_ms: float
) -> None:
    result = result_of(records(), message(0, consumed_at=consumed_at), now=now)
    assert json.loads(result.value or b"")["processing_time_ms"] == expected_ms


def test_processed_at_is_the_wall_clock_in_epoch_milliseconds() -> None:
    before = int(time.time() * 1000)
    result = result_of(records(), message(0))
    after = int(time.time() * 1000)
    assert before <= json.loads(result.value or b"")["processed_at_ms"] <= after


def test_a_review_without_id_is_named_by_its_input_position() -> None:
    assert message(2, offset=9).default_id == "reviews/2/9"


def test_a_dead_letter_keeps_the_input_s_headers_and_replaces_forged_worker_headers() -> None:
    item = InputMessage(
        SourcePosition("reviews", 0, 9, None),
        b"k",
        b"x",
        consumed_at=0.0,
        headers=[("trace-id", b"t1"), ("sentiment.error.kind", b"forged"), ("empty", None)],
    )
    dead = records().dead_letter(item, DeadLetterKind.INVALID_JSON, "not JSON")
    assert dead.headers is not None
    assert dead.headers[:2] == [("trace-id", b"t1"), ("empty", None)]
    assert [value for name, value in dead.headers if name == "sentiment.error.kind"] == [b"invalid_json"]
    assert parse_dead_letter_headers(dead.headers).kind is DeadLetterKind.INVALID_JSON


@pytest.mark.parametrize(
    ("review_id", "probabilities", "timestamp_ms", "metadata"),
    [
        ("r-1", [0.25, 0.75], 1_700_000_000_000, {}),
        ('带"引号"\\和\n换行的 id 👍', [1.0, 0.0], None, {"shop": "川味小馆", "stars": 5, "price": 12.5}),
        ("tiny", [0.9999996, 3.6e-7], 0, {"nested": {"a": [1, 2.0, None, True, "\u2028"]}, "big": 2**70}),
        ("tie", [0.5, 0.5], 42, {"e": 1e-7, "u": "\x00\x1f"}),
    ],
)
def test_a_result_value_is_exactly_what_the_result_schema_model_writes(
    review_id: str, probabilities: list[float], timestamp_ms: int | None, metadata: dict[str, object]
) -> None:
    from schemas.sentiment_result import SentimentResult, SourceRef
    from worker.kafka.records import ResultWriter

    model = ModelRef(name="ernie-3.0-mini-zh-sentiment", version="abc@1")
    source = SourcePosition("reviews", 3, 1234, timestamp_ms)
    writer = ResultWriter(["negative", "positive"])
    value, fields = writer.value(
        review_id, np.array(probabilities), model, source, 12.345, 1_700_000_000_100, metadata
    )
    expected = SentimentResult(
        id=review_id,
        **fields,
        model=model,
        source=SourceRef(topic="reviews", partition=3, offset=1234, timestamp_ms=timestamp_ms),
        processing_time_ms=12.345,
        processed_at_ms=1_700_000_000_100,
        metadata=metadata,
    )
    assert json.loads(value) == json.loads(expected.model_dump_json())
    assert list(json.loads(value)) == list(json.loads(expected.model_dump_json()))  # the schema's field order
    assert SentimentResult.model_validate_json(value) == expected
