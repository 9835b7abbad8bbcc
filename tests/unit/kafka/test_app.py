"""The poll loop (`SentimentWorker`) on in-memory Kafka clients and a fake classifier: every input offset
yields exactly one record, per partition in input order; offsets are stored only once everything before
them was acknowledged; a failed delivery stops the worker before it goes past it. The same promises against
the real broker: tests/integration/test_worker_pipeline.py and tests/faults."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence

import numpy as np
import pytest
from confluent_kafka import KafkaError

from schemas.sentiment_result import ModelRef
from tests.labellers import labeller_for
from tests.unit.kafka.fake_kafka import FakeConsumer, FakePublisher, fake_clients
from worker.config import WorkerSettings
from worker.inference.token_budget import StartupError
from worker.kafka.app import SentimentWorker
from worker.kafka.kafka_clients import KafkaClients
from worker.kafka.partitions import PartitionKey
from worker.kafka.producer import Delivery, OutboundRecord
from worker.kafka.publisher import DeliveryFailedError

TOPIC, RESULTS, DLQ = "reviews", "results", "dlq"
MODEL = ModelRef(name="fake", version="1")


class FakeLengthClassifier:
    """'positive' = characters / 100, so a result can be matched to its text."""

    labels = ["negative", "positive"]
    call_overhead_tokens = None
    parallel_calls = 2

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [[1, *([7] * len(text)), 2] for text in texts]

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        p = np.array([(len(row) - 2) / 100 for row in batch], dtype=np.float32)
        return np.stack([1 - p, p], axis=1)


def settings(**overrides: object) -> WorkerSettings:
    base: dict[str, object] = {
        "input_topic": TOPIC,
        "output_topic": RESULTS,
        "dlq_topic": DLQ,
        "http_port": 0,
        "max_window_messages": 16,
        "max_wait_ms": 5,
        "max_batch_size": 8,
        "max_batch_tokens": 4096,
        "shutdown_timeout_s": 5,
    }
    return WorkerSettings(**{**base, **overrides})  # type: ignore[arg-type]


def review_log(partitions: int, per_partition: int) -> dict[int, list[bytes | None]]:
    """Reviews whose text length encodes (partition, offset), with poison mixed in."""
    log: dict[int, list[bytes | None]] = {}
    for p in range(partitions):
        values: list[bytes | None] = []
        for offset in range(per_partition):
            if offset % 11 == 5:
                values.append(b"{not json")
            elif offset % 13 == 7:
                values.append(None)  # a tombstone
            else:
                values.append(json.dumps({"id": f"{p}-{offset}", "text": "好" * (1 + offset % 50)}).encode())
        log[p] = values
    return log


def by_source(records: list[OutboundRecord]) -> dict[PartitionKey, list[int]]:
    out: dict[PartitionKey, list[int]] = {}
    for record in records:
        out.setdefault((record.source.topic, record.source.partition), []).append(record.source.offset)
    return out


def test_every_input_offset_yields_one_record_in_input_order_and_all_offsets_are_committed() -> None:
    log = review_log(partitions=3, per_partition=70)
    publisher = FakePublisher()
    clients, consumers = fake_clients(TOPIC, log, publisher)
    worker = SentimentWorker(
        settings().sections, labeller_for(FakeLengthClassifier(), settings(), MODEL), clients=clients
    )
    summary = worker.run(max_messages=210, idle_exit_s=5)

    outputs = [r for r in publisher.sent if r.topic in (RESULTS, DLQ)]
    assert by_source(outputs) == {(TOPIC, p): list(range(70)) for p in range(3)}  # one each, in order
    for record in publisher.results(RESULTS):
        body = json.loads(record.value or b"")
        p, offset = (int(part) for part in body["id"].split("-"))
        assert (p, offset) == (record.source.partition, record.source.offset)
        assert body["probabilities"]["positive"] == pytest.approx((1 + offset % 50) / 100, abs=1e-6)
    kinds = {r.kind for r in publisher.results(DLQ)}
    assert kinds == {"invalid_json", "empty_value"}
    assert (summary.consumed, summary.results + summary.dead_letters) == (210, 210)
    assert summary.dead_letters == len(publisher.results(DLQ))
    consumer = consumers[0]
    assert consumer.commits[-1] == {(TOPIC, p): 70 for p in range(3)}  # the final commit: everything
    assert consumer.closed and publisher.closed


class SlowAckPublisher(FakePublisher):
    """Acknowledges each record only `polls` polls after it was produced."""

    def __init__(self, polls: int) -> None:
        super().__init__()
        self.polls = polls
        self.age: list[tuple[OutboundRecord, int]] = []
        self.acked: set[tuple[int, int]] = set()

    def publish(self, record: OutboundRecord) -> None:
        self.sent.append(record)
        self.age.append((record, 0))

    def poll(self, timeout_s: float = 0.0) -> None:
        aged = [(record, n + 1) for record, n in self.age]
        due = [record for record, n in aged if n >= self.polls]
        self.age = [(record, n) for record, n in aged if n < self.polls]
        for record in due:
            self.acked.add((record.source.partition, record.source.offset))
            self._deliveries.append(Delivery(record, None))

    def flush(self, timeout_s: float) -> int:
        for _ in range(self.polls):
            self.poll()
        return 0

    def pending(self) -> int:
        return len(self.age)


class CheckingConsumer(FakeConsumer):
    """Fails the test if an offset is stored before every offset below it was acknowledged."""

    publisher: SlowAckPublisher

    def store(self, offsets: dict[PartitionKey, int]) -> None:
        for (_, partition), position in offsets.items():
            missing = [o for o in range(position) if (partition, o) not in self.publisher.acked]
            assert not missing, f"stored {partition}@{position} before acks of {missing[:5]}"
        super().store(offsets)


def test_offsets_are_stored_only_after_everything_before_them_was_acknowledged() -> None:
    log = review_log(partitions=2, per_partition=60)
    publisher = SlowAckPublisher(polls=3)
    consumers: list[CheckingConsumer] = []

    def open_checking(
        kafka: object, security: object, delivery: object, rebalance: object, *, transactional: bool
    ) -> CheckingConsumer:
        consumer = CheckingConsumer(TOPIC, log, rebalance)  # type: ignore[arg-type]
        consumer.publisher = publisher
        consumers.append(consumer)
        return consumer

    clients = KafkaClients(open_producer=lambda *_sections: publisher, open_consumer=open_checking)
    summary = SentimentWorker(
        settings().sections, labeller_for(FakeLengthClassifier(), settings(), MODEL), clients=clients
    ).run(max_messages=120, idle_exit_s=5)
    assert summary.results + summary.dead_letters == 120
    assert consumers[0].stored == {(TOPIC, 0): 60, (TOPIC, 1): 60}


def test_a_refused_delivery_stops_the_worker_and_its_offset_is_never_committed() -> None:
    log = review_log(partitions=2, per_partition=40)
    refused = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    publisher = FakePublisher(
        refuse=lambda r: (
            refused if (r.source.partition, r.source.offset, r.value is not None) == (1, 21, True) else None
        )
    )
    clients, consumers = fake_clients(TOPIC, log, publisher)
    worker = SentimentWorker(
        settings().sections, labeller_for(FakeLengthClassifier(), settings(), MODEL), clients=clients
    )
    with pytest.raises(DeliveryFailedError, match="input reviews/1/21"):
        worker.run(max_messages=80, idle_exit_s=5)
    consumer = consumers[0]
    committed = {**consumer.stored, **(consumer.commits[-1] if consumer.commits else {})}
    assert committed.get((TOPIC, 1), 0) <= 21  # never past the refused record


def test_a_missing_output_topic_is_a_startup_error_naming_it() -> None:
    publisher = FakePublisher(missing_topics=frozenset({DLQ}))
    clients, consumers = fake_clients(TOPIC, review_log(1, 3), publisher)
    with pytest.raises(StartupError, match="dlq"):
        SentimentWorker(
            settings().sections, labeller_for(FakeLengthClassifier(), settings(), MODEL), clients=clients
        ).run(max_messages=3)
    assert consumers == [] and publisher.closed  # nothing consumed; the producer closed on the way out


def test_topics_at_the_broker_defaults_start_with_a_warning_naming_the_stand_in_and_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = {TOPIC: 1_048_588, RESULTS: 1_048_588, DLQ: 1_048_588}  # an admin's topics, broker defaults
    clients, _ = fake_clients(TOPIC, review_log(1, 3), FakePublisher(max_message_bytes=limits))
    worker = SentimentWorker(
        settings().sections, labeller_for(FakeLengthClassifier(), settings(), MODEL), clients=clients
    )
    with caplog.at_level(logging.WARNING, logger="worker.kafka.kafka_clients"):
        summary = worker.run(max_messages=3, idle_exit_s=5)
    assert summary.results + summary.dead_letters == 3
    warned = [r.getMessage() for r in caplog.records if "dead-letter room" in r.getMessage()]
    assert len(warned) == 1
    assert f"dead-letter topic {DLQ!r} accepts records of up to 1048588 bytes" in warned[0]
    assert "stand-in without key and value" in warned[0]
    needed = re.search(rf"sets max.message.bytes=(\d+) on {DLQ!r}", warned[0])
    assert needed is not None and 1_048_588 + 4096 < int(needed.group(1)) < 1_048_588 + 8192
    assert "topics create --fix --bootstrap-servers" in warned[0]


def test_refusing_topics_whose_dead_letters_do_not_fit_is_opt_in() -> None:
    limits = {TOPIC: 1_048_588, RESULTS: 1_048_588, DLQ: 1_048_588}
    publisher = FakePublisher(max_message_bytes=limits)
    clients, consumers = fake_clients(TOPIC, review_log(1, 3), publisher)
    refusing = settings(dlq_size_check="refuse")
    with pytest.raises(StartupError) as refused:
        SentimentWorker(
            refusing.sections, labeller_for(FakeLengthClassifier(), refusing, MODEL), clients=clients
        ).run(max_messages=3)
    said = str(refused.value)
    assert f"input topic {TOPIC!r} accepts 1048588" in said and "topics create --fix" in said
    assert consumers == [] and publisher.closed  # nothing consumed


@pytest.mark.parametrize("given", [False, "false", "off"])
def test_the_dead_letter_size_check_can_be_turned_off(
    given: object, caplog: pytest.LogCaptureFixture
) -> None:
    limits = {TOPIC: 1_048_588, RESULTS: 1_048_588, DLQ: 1_048_588}
    clients, _ = fake_clients(TOPIC, review_log(1, 3), FakePublisher(max_message_bytes=limits))
    quiet = settings(dlq_size_check=given)
    assert quiet.sections.kafka.dlq_size_check == "off"
    worker = SentimentWorker(
        quiet.sections, labeller_for(FakeLengthClassifier(), quiet, MODEL), clients=clients
    )
    with caplog.at_level(logging.WARNING, logger="worker.kafka.kafka_clients"):
        summary = worker.run(max_messages=3, idle_exit_s=5)
    assert summary.results + summary.dead_letters == 3
    assert not [r for r in caplog.records if "dead-letter room" in r.getMessage()]


def test_true_still_means_refuse() -> None:
    assert settings(dlq_size_check=True).sections.kafka.dlq_size_check == "refuse"


def test_a_compacted_dead_letter_topic_is_a_startup_warning(caplog: pytest.LogCaptureFixture) -> None:
    publisher = FakePublisher(configs={DLQ: {"cleanup.policy": "compact"}})
    clients, _ = fake_clients(TOPIC, review_log(1, 3), publisher)
    worker = SentimentWorker(
        settings().sections, labeller_for(FakeLengthClassifier(), settings(), MODEL), clients=clients
    )
    with caplog.at_level(logging.WARNING, logger="worker.kafka.kafka_clients"):
        summary = worker.run(max_messages=3, idle_exit_s=5)
    assert summary.results + summary.dead_letters == 3
    assert [r.getMessage() for r in caplog.records if "cleanup.policy=compact" in r.getMessage()]


class WithholdingPublisher(FakePublisher):
    """A broker that never answers for partition 1's records (they stay in flight); once the worker's
    readiness names partition 1 stuck and partition 0 is done, it asks the worker to stop."""

    def __init__(self) -> None:
        super().__init__()
        self.worker: SentimentWorker | None = None
        self.readiness_when_stopped: tuple[bool, dict[str, object]] | None = None
        self.stalled_when_stopped: dict[str, float | None] = {}

    def poll(self, timeout_s: float = 0.0) -> None:
        withheld = [r for r in self._in_flight if r.source.partition == 1]
        self._in_flight = [r for r in self._in_flight if r.source.partition != 1]
        super().poll(timeout_s)
        self._in_flight = withheld
        worker = self.worker
        if worker is None or self.readiness_when_stopped is not None:
            return
        stuck = worker.health.stuck_partitions
        if f"{TOPIC}[1]" in stuck and f"{TOPIC}[0]" not in stuck:
            self.readiness_when_stopped = worker.health.readiness()
            for p in ("0", "1"):
                labels = {"topic": TOPIC, "partition": p}
                value = worker.registry.get_sample_value("sentiment_partition_stalled_seconds", labels)
                self.stalled_when_stopped[p] = value
            worker.request_stop()


def test_a_partition_whose_outputs_are_never_acknowledged_fails_readiness_naming_it() -> None:
    publisher = WithholdingPublisher()
    clients, _ = fake_clients(TOPIC, review_log(partitions=2, per_partition=5), publisher)
    worker = SentimentWorker(
        settings(stuck_partition_s=0.2).sections,
        labeller_for(FakeLengthClassifier(), settings(stuck_partition_s=0.2), MODEL),
        clients=clients,
    )
    publisher.worker = worker
    summary = worker.run()

    assert summary.stop_reason == "stop requested"
    assert publisher.readiness_when_stopped is not None
    ready, checks = publisher.readiness_when_stopped
    assert not ready and list(checks["stuck_partitions"]) == [f"{TOPIC}[1]"]  # type: ignore[call-overload]
    stalled = publisher.stalled_when_stopped
    assert stalled["0"] == 0 and (stalled["1"] or 0) > 0.2


def test_a_draining_worker_says_its_progress(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 40: nothing showed progress while a backlog drained."""
    # A line every turn with news.
    monkeypatch.setattr("worker.kafka.loop_observer._BROKER_CHECK_EVERY_S", 0.0)
    log = review_log(partitions=1, per_partition=40)
    clients, _ = fake_clients(TOPIC, log, FakePublisher())
    with caplog.at_level("INFO", logger="worker.kafka"):
        SentimentWorker(
            settings().sections, labeller_for(FakeLengthClassifier(), settings(), MODEL), clients=clients
        ).run(max_messages=40, idle_exit_s=5)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("labelled ")]
    assert lines and "msg/s over the last" in lines[-1]
    counts = [int(line.split()[1]) for line in lines]
    assert counts == sorted(counts) and counts[-1] <= 40  # growing, never past what was done
