"""A team's own cluster: topics an admin made with the broker's defaults (AdminClient, no configs), checked by
`topics check` and `doctor` as `run` checks them, settled by `topics create --fix` through the admin API."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from tests.integration.helpers import cli_env
from tests.integration.test_cli import cli

pytestmark = pytest.mark.integration


def admin_made(
    create_topics: Any, unique_name: Callable[[str], str], **configs: dict[str, str]
) -> dict[str, str]:
    """Input (1 partition), output and dead-letter topics as an admin makes them: the broker's defaults."""
    names = {k: unique_name(k) for k in ("reviews", "results", "dlq", "group")}
    for key in ("reviews", "results", "dlq"):
        create_topics(names[key], partitions=1, config=configs.get(key))
    return names


def test_run_starts_on_admin_made_topics_with_one_warning_naming_the_stand_in_and_the_fix(
    kafka_bootstrap: str, create_topics: Any, unique_name: Callable[[str], str], tiny_model_dir: Path
) -> None:
    names = admin_made(create_topics, unique_name)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(5):
        producer.produce(names["reviews"], json.dumps({"id": f"r{i}", "text": "质量很好"}).encode())
    assert producer.flush(30) == 0
    run = cli("run", "--max-messages", "5", env=cli_env(kafka_bootstrap, names, tiny_model_dir))
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["results"] + summary["dead_letters"] == 5
    warned = [line for line in run.stderr.splitlines() if "dead-letter room" in line]
    assert len(warned) == 1, run.stderr[-2000:]
    assert "stand-in without key and value" in warned[0]
    assert f"topics create --fix --bootstrap-servers {kafka_bootstrap}" in warned[0]
    assert "1 partition: only one replica" in run.stderr


def test_topics_check_and_doctor_report_what_run_checks_and_fix_settles_it(
    kafka_bootstrap: str, create_topics: Any, unique_name: Callable[[str], str], tiny_model_dir: Path
) -> None:
    names = admin_made(create_topics, unique_name, dlq={"cleanup.policy": "compact"})
    env = cli_env(kafka_bootstrap, names, tiny_model_dir)
    check = cli("topics", "check", "--replicas", "3", env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"[WARN] dead-letter room ({names['dlq']})" in check.stdout
    assert f"[WARN] partitions ({names['reviews']}): 1 partition(s) for 3 replicas" in check.stdout
    assert f"[WARN] cleanup ({names['dlq']}): cleanup.policy=compact" in check.stdout
    assert "3 warnings, 0 would stop `run`" in check.stdout

    doctor = cli("doctor", env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"[WARN] topic {names['dlq']} dead-letter room" in doctor.stdout
    assert f"[WARN] topic {names['reviews']} partitions: 1 partition" in doctor.stdout

    fixed = cli("topics", "create", "--fix", "--partitions", "2", env=env)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert (
        f"{names['dlq']}: set max.message.bytes=" in fixed.stdout and "cleanup.policy=delete" in fixed.stdout
    )
    assert f"{names['reviews']}: now 2 partitions" in fixed.stdout

    resource = ConfigResource(ConfigResource.Type.TOPIC, names["dlq"])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert int(configs["max.message.bytes"].value) > 1_048_588
    assert configs["cleanup.policy"].value == "delete"
    again = cli("topics", "check", env=env)
    assert again.returncode == 0 and "0 warnings, 0 would stop `run`" in again.stdout, again.stdout


def test_refuse_is_opt_in_and_missing_topics_fail_the_check(
    kafka_bootstrap: str, create_topics: Any, unique_name: Callable[[str], str], tiny_model_dir: Path
) -> None:
    names = admin_made(create_topics, unique_name)
    env = {**cli_env(kafka_bootstrap, names, tiny_model_dir), "SENTIMENT_DLQ_SIZE_CHECK": "refuse"}
    check = cli("topics", "check", env=env)
    assert check.returncode == 1 and f"[FAIL] dead-letter room ({names['dlq']})" in check.stdout
    run = cli("run", "--max-messages", "1", env=env)
    assert run.returncode == 2 and "dead-letter room" in run.stderr and "Traceback" not in run.stderr
    gone = cli("topics", "check", env={**env, "SENTIMENT_OUTPUT_TOPIC": names["results"] + "-nope"})
    assert gone.returncode == 1 and f"[FAIL] exists ({names['results']}-nope): missing" in gone.stdout


@pytest.mark.parametrize(
    ("command", "consequence"),
    [
        (["produce", "FILE"], "Nothing was sent."),
        (["tail"], "Nothing was read."),
        (["topics", "list"], "Nothing was done."),
    ],
)
def test_commands_give_up_on_an_unreachable_broker_in_one_line_and_the_common_deadline(
    tmp_path: Path, command: list[str], consequence: str
) -> None:
    from worker.bench.worker_process import free_port

    path = tmp_path / "reviews.txt"
    path.write_text("质量很好\n太差了\n", encoding="utf-8")
    away = f"127.0.0.1:{free_port()}"
    args = [str(path) if word == "FILE" else word for word in command]
    produced = cli(*args, "--bootstrap-servers", away, timeout=60)
    assert produced.returncode == 1
    lines = produced.stderr.strip().splitlines()
    assert len(lines) == 1, produced.stderr
    assert f"{away} did not answer within 10 s" in lines[0] and consequence in lines[0]
    assert "make kafka-up" in lines[0]


def test_produce_to_a_missing_topic_and_run_on_one_give_their_advice_once(
    kafka_bootstrap: str,
    create_topics: Any,
    unique_name: Callable[[str], str],
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    names = admin_made(create_topics, unique_name)
    path = tmp_path / "reviews.txt"
    path.write_text("质量很好\n", encoding="utf-8")
    env = {
        **cli_env(kafka_bootstrap, names, tiny_model_dir),
        "SENTIMENT_INPUT_TOPIC": names["reviews"] + "-nope",
    }
    produced = cli("produce", str(path), env=env, timeout=60)
    assert produced.returncode == 1 and len(produced.stderr.strip().splitlines()) == 1, produced.stderr
    assert f"topic '{names['reviews']}-nope' does not exist at {kafka_bootstrap}" in produced.stderr
    run = cli("run", "--max-messages", "1", env=env)
    assert run.returncode == 2, run.stderr[-2000:]
    said = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(said) == 1 and said[0].count("topics create") == 1, run.stderr[-2000:]
    gone = {**cli_env(kafka_bootstrap, names, tiny_model_dir), "SENTIMENT_DLQ_TOPIC": names["dlq"] + "-nope"}
    run = cli("run", "--max-messages", "1", env=gone)
    said = [line for line in run.stderr.splitlines() if "error:" in line]
    assert run.returncode == 2 and len(said) == 1 and said[0].count("topics create") == 1, run.stderr[-2000:]
