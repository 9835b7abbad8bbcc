"""The `sentiment-worker` commands as a user runs them: exit codes, outputs, no tracebacks."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.integration.helpers import SAMPLES, cli_env
from tests.kafka_fixtures import DLQ_CONFIG
from tests.worker_commands import run_command
from worker.bench.worker_process import free_port
from worker.files.predict import predict_lines
from worker.labelling.labeller import Labeller
from worker.model.manifest import model_content_hash

pytestmark = pytest.mark.integration


def cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 180) -> Any:
    return run_command(*args, env={**os.environ, **(env or {})}, timeout=timeout, input=stdin)


def test_predict_gives_one_line_per_input_line_in_order(tiny_model_dir: Path, tiny_classifier: Any) -> None:
    texts = [json.loads(line)["text"] for line in SAMPLES.read_text(encoding="utf-8").splitlines()]
    lines = [*texts[:10], "   ", *texts[10:20]]
    done = cli("predict", "--model", str(tiny_model_dir), "--device", "cpu", stdin="\n".join(lines) + "\n")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["line"] for r in rows] == list(range(1, 22))
    assert rows[10]["error"] == "empty_text"
    valid = [r for r in rows if "error" not in r]
    assert [r["text"] for r in valid] == texts[:20]
    expected = tiny_classifier.predict_texts(texts[:20])
    assert [r["label"] for r in valid] == [tiny_classifier.labels[int(np.argmax(p))] for p in expected]


def test_predict_a_file_shows_progress_and_equals_the_stdin_path(
    tiny_model_dir: Path, tiny_classifier: Any, tmp_path: Path
) -> None:
    texts = [json.loads(line)["text"] for line in SAMPLES.read_text(encoding="utf-8").splitlines()]
    lines = [texts[i % len(texts)] + ("!" * (i % 7)) for i in range(1200)]  # 3 chunks
    path = tmp_path / "reviews.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = cli("predict", str(path), "--model", str(tiny_model_dir), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    expected = list(predict_lines(Labeller.of(tiny_classifier), lines))
    assert [r["line"] for r in rows] == list(range(1, 1201))
    assert [(r["text"], r["label"]) for r in rows] == [(e["text"], e["label"]) for e in expected]
    assert "100%  1,200 lines" in done.stderr and "lines/s" in done.stderr
    missing = cli("predict", str(tmp_path / "nope.txt"), "--model", str(tiny_model_dir))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_produce_run_tail_and_doctor_through_the_cli(
    kafka_bootstrap: str, topics: Any, tiny_model_dir: Path
) -> None:
    names = topics()
    env = cli_env(kafka_bootstrap, names, tiny_model_dir)
    produced = cli("produce", str(SAMPLES), env=env)
    assert produced.returncode == 0, produced.stderr
    assert "read 30, sent 30, skipped 0, failed 0" in produced.stdout, produced.stdout

    run = cli("run", "--max-messages", "30", env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert (summary["consumed"], summary["results"], summary["dead_letters"]) == (30, 30, 0)
    # The rate counts labelling time only: not the model load before the first message.
    assert 0 < summary["labelling_seconds"] < summary["seconds"]
    busy = min(summary["busy_seconds"], summary["labelling_seconds"])  # without the quiet spells
    assert 0 < busy <= summary["labelling_seconds"]
    assert summary["messages_per_second"] == pytest.approx(30 / busy, rel=0.05)

    tail = cli("tail", "--idle-exit-s", "3", env=env)
    assert tail.returncode == 0, tail.stderr
    rows = [json.loads(line) for line in tail.stdout.splitlines()]
    assert sorted(r["id"] for r in rows) == [f"demo-{i:03d}" for i in range(1, 31)]
    assert {r["label"] for r in rows} <= {"positive", "negative"}

    doctor = cli("doctor", env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "[OK  ] broker" in doctor.stdout and f"[OK  ] topic {names['results']}" in doctor.stdout
    assert "[OK  ] cpu" in doctor.stdout and ("VNNI" in doctor.stdout or "AVX2" in doctor.stdout)
    # the content hash a control record would name: the sha256 of the model's manifest
    assert f"content sha256 {model_content_hash(tiny_model_dir)}" in doctor.stdout

    missing = cli("doctor", env={**env, "SENTIMENT_DLQ_TOPIC": names["dlq"] + "-nope"})
    assert missing.returncode == 1
    assert f"[FAIL] topic {names['dlq']}-nope: missing" in missing.stdout
    assert f"run `sentiment-worker topics create --bootstrap-servers {kafka_bootstrap}`" in missing.stdout
    assert_quiet(missing)


NEWCOMER_CSV = (
    "review_id,content,shop\n"
    "R1,外送很快，餐點還是熱的,s1\n"
    "R2,,s2\n"  # line 3: an empty text
    "\n"  # line 4: a blank row
    'R4,"Great food, fast delivery!",s1\n'
    "R5,\u200b\u200d,s2\n"  # line 6: only zero-width characters
    "R6,😡😡,s3\n"
)


def test_a_csv_export_goes_in_whole_or_not_at_all_by_its_named_columns(
    kafka_bootstrap: str, topics: Any, tmp_path: Path
) -> None:
    names = topics()
    env = {"SENTIMENT_BOOTSTRAP_SERVERS": kafka_bootstrap, "SENTIMENT_INPUT_TOPIC": names["reviews"]}
    path = tmp_path / "reviews.csv"
    path.write_text(NEWCOMER_CSV, encoding="utf-8")

    unnamed = cli("produce", str(path), env=env)
    assert (
        unnamed.returncode == 2 and "no `text` column" in unnamed.stderr and "--text-field" in unnamed.stderr
    )
    columns = ["--text-field", "content", "--id-field", "review_id"]
    refused = cli("produce", str(path), *columns, env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "3 of 6 rows cannot be labelled, so nothing was sent" in refused.stderr
    for line in ("line 3: empty_text", "line 4: empty_text", "line 6: empty_text"):
        assert line in refused.stderr
    assert end_offsets(kafka_bootstrap, names["reviews"]) == 0  # nothing on the topic

    skipping = cli("produce", str(path), *columns, "--skip-bad", env=env)
    assert skipping.returncode == 0, skipping.stderr
    assert "read 6, sent 3, skipped 3, failed 0" in skipping.stdout
    assert "skipped line 3: empty_text: the `content` column is empty" in skipping.stderr
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": names["group"], "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([names["reviews"]])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got.append(message)
    consumer.close()
    assert sorted((m.key(), json.loads(m.value())["id"]) for m in got) == [
        (b"R1", "R1"),
        (b"R4", "R4"),
        (b"R6", "R6"),
    ]
    assert {json.loads(m.value())["shop"] for m in got} == {"s1", "s3"}  # the other columns: metadata


def end_offsets(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "end-offsets"})
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = metadata.topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions
        )
    finally:
        consumer.close()


def test_predict_reads_a_csv_by_column_with_ids_and_takes_the_model_like_run(
    tiny_model_dir: Path, tiny_classifier: Any, tmp_path: Path
) -> None:
    path = tmp_path / "reviews.csv"
    path.write_text(NEWCOMER_CSV, encoding="utf-8")
    env = {"SENTIMENT_MODEL": str(tiny_model_dir), "SENTIMENT_DEVICE": "cpu"}  # no --model: as `run` takes it

    done = cli(
        "predict", str(path), "--text-field", "content", "--id-field", "review_id", "--no-progress", env=env
    )

    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["id"], r["line"], r.get("error")) for r in rows] == [
        ("R1", 2, None),
        ("R2", 3, "empty_text"),
        ("4", 4, "empty_text"),
        ("R4", 5, None),
        ("R5", 6, "empty_text"),
        ("R6", 7, None),
    ]
    texts = ["外送很快，餐點還是熱的", "Great food, fast delivery!", "😡😡"]
    assert [r["text"] for r in rows if "error" not in r] == texts  # not the header, not the id or shop cells
    expected = [row["label"] for row in predict_lines(Labeller.of(tiny_classifier), texts)]
    assert [r["label"] for r in rows if "error" not in r] == expected


def assert_quiet(run: Any) -> None:
    """No Python warnings, no colour codes, no PaddleNLP INFO lines and no raw librdkafka lines."""
    out = run.stdout + run.stderr
    assert "UserWarning" not in out, run.stderr
    assert "\x1b[" not in out, run.stderr
    assert "INFO" not in run.stderr and "%3|" not in run.stderr, run.stderr


def test_doctor_is_quiet_and_each_failing_check_names_the_command_that_fixes_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    nobody = f"127.0.0.1:{free_port()}"  # a port nothing listens on
    env = {
        "SENTIMENT_BOOTSTRAP_SERVERS": nobody,
        "SENTIMENT_DEVICE": "cpu",
        "SENTIMENT_MODEL": str(tiny_model_dir),
    }
    unreachable = cli("doctor", env=env)
    assert unreachable.returncode == 1, unreachable.stdout + unreachable.stderr
    assert "[OK  ] model:" in unreachable.stdout  # PaddleNLP loaded the model, and said nothing
    assert_quiet(unreachable)
    broker = next(line for line in unreachable.stdout.splitlines() if line.startswith("[FAIL] broker:"))
    assert "Connection refused" in broker  # why, from librdkafka's own report
    assert "`make kafka-up`" in broker and "SENTIMENT_BOOTSTRAP_SERVERS" in broker

    no_model = cli("doctor", env={**env, "SENTIMENT_MODEL": str(tmp_path / "no-such-model")})
    assert no_model.returncode == 1
    assert_quiet(no_model)
    model = next(line for line in no_model.stdout.splitlines() if line.startswith("[FAIL] model:"))
    assert "does not exist" in model and "`make model`" in model and "`sentiment-worker train" in model


def test_bad_settings_and_a_missing_model_are_clear_errors_without_tracebacks(tmp_path: Path) -> None:
    bad = cli("run", env={"SENTIMENT_MAX_BATCH_SIZE": "zero"})
    assert bad.returncode == 2 and "max_batch_size" in bad.stderr and "Traceback" not in bad.stderr
    missing = cli("run", "--model", str(tmp_path / "no-such-model"), "--device", "cpu")
    assert missing.returncode == 2 and "model" in missing.stderr and "Traceback" not in missing.stderr
    assert "sentiment-worker train" in missing.stderr  # says how to get one


@pytest.mark.parametrize("command", ["tune", "bench"])
def test_a_config_files_inference_settings_reach_the_model_tune_and_bench_load(
    command: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The file asks for the static backend, which a training directory cannot serve: a command that
    # honours the file stops at loading with backend=static's own error (one that dropped it would go on
    # and measure the dynamic backend).
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({"backend": "static", "model": str(tiny_model_dir)}), encoding="utf-8")
    done = cli(command, "--config", str(config), "--device", "cpu", timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "backend=static but" in done.stderr and "Traceback" not in done.stderr


def test_onnx_backend_and_quantize_through_the_cli(
    tiny_onnx_dir: Path, tiny_model_dir: Path, tiny_classifier: Any, tmp_path: Path
) -> None:
    texts = [json.loads(line)["text"] for line in SAMPLES.read_text(encoding="utf-8").splitlines()][:20]
    env = {"SENTIMENT_BACKEND": "onnx", "SENTIMENT_DEVICE": "cpu"}
    done = cli("predict", "--model", str(tiny_onnx_dir), env=env, stdin="\n".join(texts) + "\n")
    assert done.returncode == 0, done.stderr
    expected = tiny_classifier.predict_texts(texts)
    labels = [json.loads(line)["label"] for line in done.stdout.splitlines()]
    assert labels == [tiny_classifier.labels[int(np.argmax(p))] for p in expected]

    out = tmp_path / "int8"
    done = cli(
        "quantize", "--model", str(tiny_onnx_dir), "--output-dir", str(out), "--calibration-texts", "50"
    )
    assert done.returncode == 0, done.stderr
    assert "held-out accuracy" in done.stdout and (out / "README.md").is_file()

    wrong = cli("quantize", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "x"))
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert (
        wrong.stderr.strip().startswith("sentiment-worker quantize: error:")
        and "--format onnx" in wrong.stderr
    )


def test_librdkafka_lines_go_through_the_worker_log_not_raw_to_stderr() -> None:
    closed = f"127.0.0.1:{free_port()}"  # librdkafka retries and logs every refused connection
    lag = cli("lag", "--timeout-s", "2", env={"SENTIMENT_BOOTSTRAP_SERVERS": closed}, timeout=60)
    assert lag.returncode == 1
    assert f"{closed} did not answer within 2 s" in lag.stderr and len(lag.stderr.strip().splitlines()) == 1
    raw = [line for line in lag.stderr.splitlines() if line.startswith("%")]
    assert raw == [], lag.stderr  # was: one `%3|...|FAIL|...` line per retry


def test_topics_list_and_delete_as_kafka_topics_users_expect(
    kafka_bootstrap: str, unique_name: Any, create_topics: Any
) -> None:
    prefix = unique_name("topics-cli")
    names = {"input": f"{prefix}-in", "output": f"{prefix}-out", "dlq": f"{prefix}-dlq"}
    create_topics(names["input"], partitions=2)
    create_topics([names["output"], names["dlq"]], partitions=1, config=DLQ_CONFIG)
    group = f"{prefix}-group"
    env = {
        "SENTIMENT_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "SENTIMENT_INPUT_TOPIC": names["input"],
        "SENTIMENT_OUTPUT_TOPIC": names["output"],
        "SENTIMENT_DLQ_TOPIC": names["dlq"],
        "SENTIMENT_GROUP_ID": group,
    }
    ours = sorted(names.values())

    listed = cli("topics", "list", env=env)
    matched = cli("topics", "list", "--partitions", "--topic", f"{prefix}-.*", env=env)
    assert listed.returncode == 0 and set(ours) <= set(listed.stdout.splitlines()), listed.stderr
    expected = [f"{names['dlq']}\t1", f"{names['input']}\t2", f"{names['output']}\t1"]
    assert matched.stdout.splitlines() == expected

    dry = cli("topics", "delete", env=env)  # the settings' three topics, but not without --yes
    assert dry.returncode == 1 and "--yes" in dry.stderr
    assert dry.stdout.splitlines() == [
        f"would delete {names['input']} (2 partitions)",
        f"would delete {names['output']} (1 partitions)",
        f"would delete {names['dlq']} (1 partitions)",
    ]
    missing = cli("topics", "delete", "--topic", f"{prefix}-nope", "--yes", env=env)
    assert missing.returncode == 1 and "no topic" in missing.stderr

    worker = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    try:
        worker.subscribe([names["input"]])  # the group consumes the input topic, as a running worker does
        deadline = time.monotonic() + 60
        while not worker.assignment():
            assert time.monotonic() < deadline, "the consumer was never assigned its partitions"
            worker.poll(0.2)
        refused = cli("topics", "delete", "--yes", env=env)
        still = cli("topics", "list", "--topic", f"{prefix}-.*", env=env)
        forced = cli("topics", "delete", "--topic", f"{prefix}-(in|out)", "--yes", "--force", env=env)
    finally:
        worker.close()
    assert refused.returncode == 1 and "--force" in refused.stderr
    for name in ours:  # the input it reads, and the output and dead-letter topics its worker writes
        assert f"{name}: in use by group {group}" in refused.stderr
    assert still.stdout.splitlines() == ours
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.splitlines() == [f"{names['input']}: deleted", f"{names['output']}: deleted"]

    rest = cli("topics", "delete", "--topic", f"{prefix}-.*", "--yes", env=env)  # nobody reads it now
    assert rest.returncode == 0 and rest.stdout.splitlines() == [f"{names['dlq']}: deleted"], rest.stderr
    deadline = time.monotonic() + 60
    while True:  # the broker drops deleted topics from its metadata shortly after answering
        left = cli("topics", "list", "--topic", f"{prefix}-.*", env=env)
        if left.stdout.strip() == "":
            break
        assert time.monotonic() < deadline, left.stdout


@pytest.mark.parametrize("command", ["serve", "run"])
def test_a_taken_http_port_is_one_line_naming_the_setting_and_exit_2(
    command: str, tiny_model_dir: Path
) -> None:
    """Issue 40: replicas on one host with the default port died with a 26-line traceback and exit 1."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        taken = cli(
            command,
            "--model",
            str(tiny_model_dir),
            "--device",
            "cpu",
            "--http-port",
            str(port),
            env={"SENTIMENT_BOOTSTRAP_SERVERS": "127.0.0.1:1"},  # never reached: the port is checked first
            timeout=120,
        )
    assert taken.returncode == 2, taken.stderr[-2000:]
    assert "Traceback" not in taken.stderr
    errors = [line for line in taken.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0] and "SENTIMENT_HTTP_PORT" in errors[0]


def test_a_broker_that_never_answers_at_start_up_is_exit_2_in_words(tiny_model_dir: Path) -> None:
    """Issue 40: a wrong broker address ended on a raw KafkaError{code=_TRANSPORT,...}."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once the socket is closed
    wrong = cli(
        "run",
        "--model",
        str(tiny_model_dir),
        "--device",
        "cpu",
        "--http-port",
        "0",
        env={"SENTIMENT_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"},
        timeout=120,
    )
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    (error,) = [line for line in wrong.stderr.splitlines() if "error:" in line]
    assert f"no Kafka broker answered at 127.0.0.1:{port}" in error and "SENTIMENT_BOOTSTRAP_SERVERS" in error
    assert "KafkaError{" not in error and "Traceback" not in wrong.stderr
    connect_lines = [line for line in wrong.stderr.splitlines() if "Connect to" in line]
    assert len(connect_lines) <= 4, connect_lines  # once per interval, not many times a second
