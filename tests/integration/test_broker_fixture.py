"""The session broker and the launcher really move messages."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka_fixtures import CreateTopics, free_port, load_launcher, run_launcher

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> list[Message]:
    """Produce (key, value) records; return their delivery reports (raises on a delivery error)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    delivered: list[Message] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append(msg)

    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    assert producer.flush(30) == 0, "messages still in the producer queue after 30 s"
    assert errors == []
    return delivered


def consume(bootstrap: str, topic: str, group: str, expected: int, timeout_s: float = 30.0) -> list[Message]:
    """Read ``expected`` messages from the beginning of ``topic`` as a new consumer group."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    received: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(received) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            received.append(msg)
        # nothing beyond what was produced
        extra = consumer.poll(1.0)
        assert extra is None or extra.error() is not None, f"unexpected extra message {extra.value()!r}"
    finally:
        consumer.close()
    return received


def test_produce_and_consume_ten_messages_on_three_partitions(
    kafka_bootstrap: str, unique_name: Callable[[str], str], create_topics: CreateTopics
) -> None:
    (topic,) = create_topics(unique_name("fixture"), partitions=3)
    records = [(f"key-{i}".encode(), f"value-{i}".encode()) for i in range(10)]

    delivered = produce(kafka_bootstrap, topic, records)
    received = consume(kafka_bootstrap, topic, unique_name("group"), expected=10)

    assert len(delivered) == 10
    assert {m.partition() for m in delivered} <= {0, 1, 2}
    assert len(received) == 10
    assert Counter(m.value() for m in received) == Counter(v for _, v in records)
    assert {m.key(): m.value() for m in received} == dict(records)
    # each message comes back from the partition and offset it was acknowledged at
    assert {(m.topic(), m.partition(), m.offset()) for m in received} == {
        (m.topic(), m.partition(), m.offset()) for m in delivered
    }
    # a fresh topic: each partition is read from offset 0, in offset order, without gaps
    for partition in {m.partition() for m in received}:
        offsets = [m.offset() for m in received if m.partition() == partition]
        assert offsets == list(range(len(offsets)))


def create_topic(bootstrap: str, topic: str) -> None:
    # a local client: it is gone (no reconnect noise) before the broker is stopped
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout=30)


def _process_exists(pid: int) -> bool:
    return bool(load_launcher().launch_common.pid_alive(pid))


def test_launcher_up_status_produce_consume_down(tmp_path: Path) -> None:
    port, controller_port = free_port(), free_port()
    data_dir, pid_file = tmp_path / "broker", tmp_path / "run" / "broker.pid"
    common = ["--port", str(port), "--data-dir", str(data_dir), "--pid-file", str(pid_file)]
    bootstrap = f"localhost:{port}"

    up = run_launcher("up", *common, "--controller-port", str(controller_port), "--timeout-s", "120")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert up.stdout.splitlines()[-1] == bootstrap
        pid = int(pid_file.read_text())
        assert _process_exists(pid)
        props = (data_dir / "server.properties").read_text()
        assert "process.roles=broker,controller" in props
        assert "auto.create.topics.enable=false" in props
        assert (data_dir / "kraft-logs" / "meta.properties").is_file()

        status = run_launcher("status", *common, timeout_s=60)
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"running pid {pid} at {bootstrap} (answers)" in status.stdout

        again = run_launcher("up", *common, "--controller-port", str(controller_port), timeout_s=60)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "already running" in again.stdout
        assert int(pid_file.read_text()) == pid

        create_topic(bootstrap, "launcher-check")
        delivered = produce(bootstrap, "launcher-check", [(b"k", b"hello")])
        received = consume(bootstrap, "launcher-check", "launcher-check-group", expected=1)
        assert [(m.key(), m.value(), m.offset()) for m in received] == [
            (b"k", b"hello", delivered[0].offset())
        ]
    finally:
        down = run_launcher("down", *common, timeout_s=60)

    assert down.returncode == 0, down.stdout + down.stderr
    assert "Broker stopped" in down.stdout
    assert not _process_exists(pid)
    assert not pid_file.exists()

    after = run_launcher("status", *common, timeout_s=60)
    assert after.returncode == 3
    assert after.stdout.startswith("not running")
    again_down = run_launcher("down", *common, timeout_s=60)
    assert again_down.returncode == 0
    assert "No pid file" in again_down.stdout
