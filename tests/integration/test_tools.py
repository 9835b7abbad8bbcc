"""The `topics create`, `produce` and `tail` tool modules against the session's real broker."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from worker.cli.main import main
from worker.files.review_files import ReviewFile
from worker.tools import topics
from worker.tools.produce import check_file, feed_records, produce_reviews
from worker.tools.tail import TailedRecord, TailError, format_table, result_row, tail_records

pytestmark = pytest.mark.integration

IDLE_S = 3.0


def read_reviews(path: Path, *, raw_text: bool = False) -> Any:
    return feed_records(ReviewFile(path), raw_text=raw_text)


def conf(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "client.id": "test-tools"}


@pytest.fixture
def new_topic(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> Callable[[str], str]:
    """`new_topic(prefix)` creates a one-partition topic with a unique name from `prefix` and returns it."""

    def create(prefix: str) -> str:
        topic = unique_name(prefix)
        topics.create_topics(conf(kafka_bootstrap), [topic], partitions=1)
        return topic

    return create


def tail_all(bootstrap: str, topic: str, expected: int, **kwargs: Any) -> list[TailedRecord]:
    """Read the topic from the start; stops after `expected` records + 1 extra (so surplus shows) or idle."""
    return list(tail_records(conf(bootstrap), topic, max_messages=expected + 1, idle_exit_s=IDLE_S, **kwargs))


def test_create_topics_reports_created_then_exists(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    a, b = unique_name("tools-a"), unique_name("tools-b")

    first = topics.create_topics(conf(kafka_bootstrap), [a, b], partitions=3)
    second = topics.create_topics(conf(kafka_bootstrap), [a], partitions=3)
    different = topics.create_topics(conf(kafka_bootstrap), [b], partitions=1)

    assert first == {a: "created", b: "created"}
    assert second == {a: "exists"}
    assert different == {b: "exists (3 partitions)"}
    missing = unique_name("tools-missing")
    assert topics.describe_topics(conf(kafka_bootstrap), [a, missing]) == {a: 3, missing: None}


def test_create_topics_error_says_what_to_do(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    with pytest.raises(
        topics.TopicAdminError, match="replication factor is larger than the number of brokers"
    ):
        topics.create_topics(
            conf(kafka_bootstrap), [unique_name("tools-rf")], partitions=1, replication_factor=3
        )


def test_produce_jsonl_and_tail_it_back_in_order(
    kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("tools-jsonl")
    assert topics.create_topics(conf(kafka_bootstrap), [topic], partitions=2) == {topic: "created"}
    lines = [
        json.dumps({"id": f"r{i % 5}", "text": f"第{i}条评论", "seq": i}, ensure_ascii=False)
        for i in range(40)
    ]
    path = tmp_path / "reviews.jsonl"
    path.write_text("\n".join(lines[:20]) + "\n\n" + "\n".join(lines[20:]) + "\n", encoding="utf-8")

    report = produce_reviews(conf(kafka_bootstrap), topic, read_reviews(path))
    tailed = tail_all(kafka_bootstrap, topic, expected=40)

    assert (report.sent, report.acknowledged, report.failed, report.first_error) == (40, 40, 0, None)
    assert len(tailed) == 40
    assert sorted(r.value for r in tailed if r.value) == sorted(line.encode() for line in lines)
    by_key: dict[bytes, list[int]] = {}
    for rec in tailed:
        assert rec.key is not None and rec.value is not None
        document = json.loads(rec.value)
        assert rec.key == document["id"].encode()
        by_key.setdefault(rec.key, []).append(document["seq"])
        assert rec.topic == topic and rec.timestamp_ms is not None
    # One key → one partition, and within a partition records come back in file order.
    assert {k: seqs for k, seqs in by_key.items()} == {
        f"r{k}".encode(): list(range(k, 40, 5)) for k in range(5)
    }
    for partition in {r.partition for r in tailed}:
        offsets = [r.offset for r in tailed if r.partition == partition]
        assert offsets == sorted(offsets)
        seqs = [json.loads(r.value or b"")["seq"] for r in tailed if r.partition == partition]
        assert seqs == sorted(seqs)
    rows = [result_row(r) for r in tailed]
    assert {row["kind"] for row in rows} == {"review"}
    assert "第0条评论" in format_table(rows)


def test_produce_csv_with_limit_and_rate(
    kafka_bootstrap: str, new_topic: Callable[[str], str], tmp_path: Path
) -> None:
    topic = new_topic("tools-csv")
    path = tmp_path / "reviews.csv"
    rows = ["id,text,stars"] + [f"c{i},评论{i}，还不错,{i % 5 + 1}" for i in range(30)]
    path.write_text("\ufeff" + "\n".join(rows) + "\n", encoding="utf-8")
    progress: list[str] = []

    report = produce_reviews(
        conf(kafka_bootstrap), topic, read_reviews(path), rate_per_s=10.0, limit=25, progress=progress.append
    )
    tailed = tail_all(kafka_bootstrap, topic, expected=25)

    assert (report.sent, report.acknowledged, report.failed) == (25, 25, 0)
    # 25 records at 10/s: the last is not due before 2.4 s after the first (the rate is a ceiling; a loaded
    # machine may take longer, which is why there is no upper bound).
    assert report.seconds >= 2.3
    assert progress and progress[-1].startswith("sent 25, acknowledged 25, failed 0")
    assert [r.key for r in tailed] == [f"c{i}".encode() for i in range(25)]
    assert [r.offset for r in tailed] == list(range(25))
    assert [json.loads(r.value or b"") for r in tailed] == [
        {"id": f"c{i}", "text": f"评论{i}，还不错", "stars": str(i % 5 + 1)} for i in range(25)
    ]


def test_a_resume_from_a_line_sends_only_the_rest(
    kafka_bootstrap: str, new_topic: Callable[[str], str], tmp_path: Path
) -> None:
    topic = new_topic("tools-resume")
    path = tmp_path / "reviews.jsonl"
    path.write_text('{"text": "一"}\n{"text": "二"}\n{"text": "三"}\n{"text": "四"}\n', encoding="utf-8")

    report = produce_reviews(conf(kafka_bootstrap), topic, feed_records(ReviewFile(path), from_line=3))
    tailed = tail_all(kafka_bootstrap, topic, expected=2)

    assert (report.acknowledged, report.failed, report.resume_line) == (2, 0, None)
    assert [r.value for r in tailed] == ['{"text": "三"}'.encode(), '{"text": "四"}'.encode()]
    assert check_file(ReviewFile(path), from_line=3).read == 2


def test_tail_does_not_commit_and_can_start_at_the_end(
    kafka_bootstrap: str, unique_name: Callable[[str], str], new_topic: Callable[[str], str], tmp_path: Path
) -> None:
    topic, group = new_topic("tools-tail"), unique_name("tools-group")
    path = tmp_path / "reviews.txt"
    path.write_text("好\n坏\n一般\n", encoding="utf-8")
    produce_reviews(conf(kafka_bootstrap), topic, read_reviews(path, raw_text=True))

    first = tail_all(kafka_bootstrap, topic, expected=3, group_id=group)
    again = tail_all(kafka_bootstrap, topic, expected=3, group_id=group)
    from_end = list(tail_records(conf(kafka_bootstrap), topic, from_beginning=False, idle_exit_s=1.0))

    assert [r.value for r in first] == ["好".encode(), "坏".encode(), "一般".encode()]
    assert [r.offset for r in again] == [0, 1, 2]  # nothing was committed for the group
    assert from_end == []


def test_tail_of_a_missing_topic_says_so(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    with pytest.raises(TailError, match="does not exist"):
        list(tail_records(conf(kafka_bootstrap), unique_name("tools-nope"), idle_exit_s=1.0))


def test_full_local_queue_is_waited_out_not_lost(
    kafka_bootstrap: str, new_topic: Callable[[str], str], tmp_path: Path
) -> None:
    topic = new_topic("tools-buffer")
    path = tmp_path / "reviews.txt"
    path.write_text("".join(f"评论 {i}\n" for i in range(300)), encoding="utf-8")
    # A 10-record local queue: produce() raises BufferError many times during this run.
    tiny_queue = {**conf(kafka_bootstrap), "queue.buffering.max.messages": 10}

    report = produce_reviews(tiny_queue, topic, read_reviews(path))
    tailed = tail_all(kafka_bootstrap, topic, expected=300)

    assert (report.sent, report.acknowledged, report.failed) == (300, 300, 0)
    assert [json.loads(r.value or b"")["text"] for r in tailed] == [f"评论 {i}" for i in range(300)]


def test_undeliverable_records_are_counted_failed_with_the_first_error(tmp_path: Path) -> None:
    path = tmp_path / "reviews.txt"
    path.write_text("一\n二\n三\n", encoding="utf-8")
    # Nothing listens on port 1: every record times out after 1.5 s.
    unreachable = {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 1500, "log_level": 0}

    report = produce_reviews(unreachable, "nowhere", read_reviews(path), flush_timeout_s=30)

    assert (report.sent, report.acknowledged, report.failed) == (3, 0, 3)
    assert report.first_error is not None and "timed out" in report.first_error.lower()
    assert (report.resume_line, report.delivered_after_resume) == (1, 0)  # nothing went: resume at line 1


def test_topics_create_makes_the_groups_compacted_control_and_status_topics(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [k for k in os.environ if k.startswith("SENTIMENT_")]:
        monkeypatch.delenv(name)
    group, reviews = unique_name("tools-group"), unique_name("tools-reviews")
    args = ["topics", "create", "--bootstrap-servers", kafka_bootstrap, "--group-id", group,
            "--input-topic", reviews, "--output-topic", reviews + "-out",
            "--dlq-topic", reviews + "-dlq"]  # fmt: skip
    made = [reviews, reviews + "-out", reviews + "-dlq", f"{group}.control", f"{group}.status"]
    try:
        assert main(args) == 0
        assert capsys.readouterr().out.splitlines() == [f"{name}: created" for name in made]
        admin = AdminClient(conf(kafka_bootstrap))
        assert topics.describe_topics(conf(kafka_bootstrap), made[3:]) == {made[3]: 1, made[4]: 1}
        for name in made[3:]:
            resource = ConfigResource(ConfigResource.Type.TOPIC, name)
            config = admin.describe_configs([resource])[resource].result(timeout=30)
            assert config["cleanup.policy"].value == "compact", name
        assert main(args) == 0  # again: each exists
        assert capsys.readouterr().out.splitlines() == [f"{name}: exists" for name in made]
    finally:
        topics.delete_topics(conf(kafka_bootstrap), made)
