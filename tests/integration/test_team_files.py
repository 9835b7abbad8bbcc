"""Files as teams export them, through the commands: a GBK CSV with Chinese column names and a repeated id
reaches the topic as UTF-8 JSON; a command whose reader goes away (`tail --dlq | head -2`) ends quietly."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from tests.integration.test_cli import cli
from tests.worker_commands import start_command

pytestmark = pytest.mark.integration

SHOP_ROWS = [
    ("评论ID", "评论内容", "店铺", "评分"),
    ("C001", "外送很快，饭菜还是热的", "川味小馆", "5"),
    ("C002", "Great value - will buy again", "面馆", "4"),
    ("C003", "太咸了，不推荐", "川味小馆", "2"),
    ("C001", "第二次买，还是很好", "川味小馆", "5"),
]


def read_topic(bootstrap: str, topic: str, count: int) -> list[Any]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    messages: list[Any] = []
    try:
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                messages.append(message)
            if len(messages) >= count:
                break
    finally:
        consumer.close()
    return messages


def test_a_gbk_csv_is_produced_as_utf8_and_its_repeated_id_is_named(
    kafka_bootstrap: str, create_topics: Any, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = create_topics(unique_name("gbk"), partitions=1)[0]
    path = tmp_path / "店铺评论.csv"
    path.write_bytes("".join(",".join(row) + "\r\n" for row in SHOP_ROWS).encode("gbk"))
    env = {"SENTIMENT_BOOTSTRAP_SERVERS": kafka_bootstrap, "SENTIMENT_INPUT_TOPIC": topic}
    produced = cli("produce", str(path), "--text-field", "评论内容", "--id-field", "评论ID", env=env)
    assert produced.returncode == 0, produced.stderr
    assert "read 4, sent 4, skipped 0, failed 0" in produced.stdout
    assert "1 id(s) occur more than once (C001 ×2)" in produced.stderr
    values = [json.loads(m.value()) for m in read_topic(kafka_bootstrap, topic, 4)]
    assert [(v["id"], v["text"]) for v in values] == [(row[0], row[1]) for row in SHOP_ROWS[1:]]
    assert values[0]["店铺"] == "川味小馆"


def test_a_closed_pipe_ends_a_command_quietly_with_141(
    kafka_bootstrap: str, create_topics: Any, unique_name: Callable[[str], str]
) -> None:
    topic = create_topics(unique_name("pipe"), partitions=1)[0]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(3000):  # more than a pipe's buffer holds (64 KiB), so the writer meets the closed end
        producer.produce(topic, json.dumps({"id": f"r{i}", "text": "质量很好，非常满意" * 3}).encode())
    assert producer.flush(30) == 0
    tail = start_command(dict(os.environ), "tail", "--topic", topic, "--bootstrap-servers", kafka_bootstrap)
    assert tail.stdout is not None and tail.stderr is not None
    first = [tail.stdout.readline(), tail.stdout.readline()]  # what `head -2` takes
    tail.stdout.close()
    returncode = tail.wait(timeout=120)
    stderr = tail.stderr.read()
    assert all(json.loads(line)["id"].startswith("r") for line in first)
    assert returncode == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr
