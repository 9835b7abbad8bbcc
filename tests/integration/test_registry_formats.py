"""Avro, JSON Schema and Protobuf through a real Schema Registry and the real broker: every input is one
result or one dead letter (by id, per partition in input order), whatever its format and however
malformed; the registry taken away mid-stream loses nothing and dead-letters nothing; a result schema with
an added optional field is accepted at BACKWARD and read by old readers; a Java client reads Avro results.

The registry: the session's (`schema_registry_url`), and one of the test's own where it is stopped."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Message
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from schemas.dead_letter import DeadLetterKind, parse_dead_letter_headers
from schemas.registry_schemas import avro_result_schema
from schemas.sentiment_result import ModelRef
from tests.integration.helpers import cli_env, make_settings, sample_reviews
from tests.integration.kafka_io import produce, read_topic
from tests.labellers import labeller_for
from tests.polling import wait_until
from tests.registry_fixtures import run_registry_launcher
from tests.worker_commands import run_command
from worker.bench.worker_process import free_port
from worker.kafka.app import SentimentWorker
from worker.kafka.result_encoding import register_result_schema, result_schema
from worker.kafka.wire_format import wire_header
from worker.tools.registry_values import ValueReader, value_encoder

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "deploy" / "samples"
REVIEW_SCHEMAS = {
    "avro": SAMPLES / "review.avsc",
    "json_schema": SAMPLES / "review.schema.json",
    "protobuf": SAMPLES / "review.proto",
}
# The same review without a `text` field (the text is under `body`): each value decodes, and has no text.
NO_TEXT_SCHEMAS = {
    "avro": json.dumps(
        {
            "type": "record",
            "name": "Note",
            "fields": [{"name": "id", "type": "string"}, {"name": "body", "type": "string"}],
        }
    ),
    "json_schema": json.dumps(
        {
            "type": "object",
            "title": "Note",
            "properties": {"id": {"type": "string"}, "body": {"type": "string"}},
        }
    ),
    "protobuf": 'syntax = "proto3";\npackage notes;\nmessage Note {\n  string id = 1;\n  string body = 2;\n}',
}


def _encoder(settings: Any, fmt: str, schema_text: str, topic: str, tmp_path: Path) -> Any:
    suffix = {"avro": ".avsc", "json_schema": ".json", "protobuf": ".proto"}[fmt]
    path = tmp_path / f"schema-{abs(hash(schema_text))}{suffix}"
    path.write_text(schema_text, encoding="utf-8")
    return value_encoder(settings, fmt, path, topic)


def _outputs_by_source(
    results: list[dict[str, Any]], dead: list[Message]
) -> tuple[dict[tuple[int, int], str], dict[tuple[int, int], DeadLetterKind]]:
    # int(): Protobuf's JSON form writes 64-bit integers as strings
    by_result = {(int(r["source"]["partition"]), int(r["source"]["offset"])): r["id"] for r in results}
    by_dead = {}
    for message in dead:
        info = parse_dead_letter_headers(message.headers())
        by_dead[(info.source_partition, info.source_offset)] = info.kind
    return by_result, by_dead


@pytest.mark.parametrize("fmt", ["avro", "json_schema", "protobuf"])
def test_every_input_is_one_result_or_one_dead_letter_in_each_registry_format(
    fmt: str,
    kafka_bootstrap: str,
    topics: Any,
    tiny_classifier: Any,
    schema_registry_url: str,
    tmp_path: Path,
) -> None:
    names = topics(input_partitions=2, output_partitions=2)
    settings = make_settings(
        kafka_bootstrap,
        names,
        input_format=fmt,
        output_format=fmt,
        schema_registry_url=schema_registry_url,
        max_window_messages=16,
    )
    reviews = sample_reviews(30)
    encode = _encoder(
        settings, fmt, REVIEW_SCHEMAS[fmt].read_text(encoding="utf-8"), names["reviews"], tmp_path
    )
    no_text = _encoder(settings, fmt, NO_TEXT_SCHEMAS[fmt], f"{names['reviews']}-notes", tmp_path)
    other_fmt = {"avro": "json_schema", "json_schema": "protobuf", "protobuf": "avro"}[fmt]
    other_schema = REVIEW_SCHEMAS[other_fmt].read_text(encoding="utf-8")
    other = _encoder(settings, other_fmt, other_schema, f"{names['reviews']}-other", tmp_path)
    good = [
        encode({k: v for k, v in r.items() if k in ("id", "text", "domain", "expected")}) for r in reviews
    ]
    schema_id = int.from_bytes(good[0][1:5], "big")
    bad = {
        b'{"id": "plain", "text": "plain JSON on a registry topic"}': DeadLetterKind.NOT_WIRE_FORMAT,
        wire_header(987_654) + good[0][5:]: DeadLetterKind.UNKNOWN_SCHEMA,
        wire_header(schema_id) + b"\xff\xff\xff\xff\xff\xff\xff": DeadLetterKind.INVALID_PAYLOAD,
        no_text({"id": "note-1", "body": "没有text字段"}): DeadLetterKind.MISSING_TEXT,
        other({"id": "other-1", "text": "another format's schema"}): DeadLetterKind.INVALID_PAYLOAD,
    }
    expected_kinds: dict[tuple[int, int], DeadLetterKind] = {}
    expected_ids: dict[tuple[int, int], str] = {}
    for partition in (0, 1):
        records: list[tuple[bytes | None, bytes | None]] = []
        for i in range(partition, len(good), 2):
            if i % 6 == partition:  # the bad values among the good ones
                for value, kind in bad.items():
                    expected_kinds[(partition, len(records))] = kind
                    records.append((b"bad", value))
            expected_ids[(partition, len(records))] = reviews[i]["id"]
            records.append((reviews[i]["id"].encode(), good[i]))
        produce(kafka_bootstrap, names["reviews"], records, partition=partition)
    total = len(expected_ids) + len(expected_kinds)

    worker = SentimentWorker(
        settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
    )
    summary = worker.run(max_messages=total)

    assert (summary.results, summary.dead_letters) == (len(expected_ids), len(expected_kinds))
    reader = ValueReader(settings.sections.registry)
    out = read_topic(kafka_bootstrap, names["results"], expected=len(expected_ids))
    results = [reader.fields(m.value()) for m in out]
    assert all(r is not None for r in results), "a result that does not decode with its registered schema"
    dead = read_topic(kafka_bootstrap, names["dlq"], expected=len(expected_kinds))
    by_result, by_dead = _outputs_by_source([r for r in results if r is not None], dead)
    assert by_result == expected_ids  # each good input one result, with its id
    assert by_dead == expected_kinds  # each bad input one dead letter, of its kind
    assert {m.value() for m in dead} == set(bad)  # dead letters keep the input's bytes
    per_partition: dict[int, list[int]] = defaultdict(list)
    for r in results:
        assert r is not None
        per_partition[int(r["source"]["partition"])].append(int(r["source"]["offset"]))
    assert all(offsets == sorted(offsets) for offsets in per_partition.values())


def test_the_registry_stopped_mid_stream_and_restarted_loses_nothing_and_dead_letters_nothing(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any, tmp_path: Path
) -> None:
    """A registry of the test's own is stopped while values of a schema the worker has not fetched yet
    arrive: they wait (not ready, saying why) and are labelled, in order, once it runs again (with its
    schemas: the launcher keeps them across a restart)."""
    port = free_port()
    common = ["--port", str(port), "--data-dir", str(tmp_path / "registry")]
    up = run_registry_launcher("up", *common)
    assert up.returncode == 0, up.stdout + up.stderr
    url = up.stdout.split()[-1]
    names = topics(input_partitions=1, output_partitions=1)
    settings = make_settings(
        kafka_bootstrap,
        names,
        input_format="avro",
        output_format="avro",
        schema_registry_url=url,
        schema_registry_timeout_s=2,
        max_window_messages=8,
    )
    reviews = sample_reviews(24)
    v1 = REVIEW_SCHEMAS["avro"].read_text(encoding="utf-8")
    # A second version of the review schema (an optional field more), registered now, its values produced
    # only once the registry is down: a schema id the worker has not fetched.
    v2 = json.loads(v1)
    v2["fields"].append({"name": "stars", "type": ["null", "int"], "default": None})
    first = _encoder(settings, "avro", v1, names["reviews"], tmp_path)
    second = _encoder(settings, "avro", json.dumps(v2), names["reviews"], tmp_path)
    earlier = [(r["id"].encode(), first({"id": r["id"], "text": r["text"]})) for r in reviews[:8]]
    later = [(r["id"].encode(), second({"id": r["id"], "text": r["text"], "stars": 4})) for r in reviews[8:]]
    produce(kafka_bootstrap, names["reviews"], earlier)
    worker = SentimentWorker(
        settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
    )
    runner = threading.Thread(target=worker.run, kwargs={"max_messages": len(reviews)})
    runner.start()
    try:
        read_topic(kafka_bootstrap, names["results"], expected=8, settle_s=0)
        down = run_registry_launcher("down", *common, timeout_s=60)
        assert down.returncode == 0, down.stdout + down.stderr
        produce(kafka_bootstrap, names["reviews"], later)
        checks = wait_until(
            lambda: (c := worker.health.readiness()[1]).get("schema_registry") and c,
            60,
            "/readyz to say the registry is away",
        )
        assert "cannot be reached" in str(checks["schema_registry"])
        assert len(read_topic(kafka_bootstrap, names["results"], expected=9, timeout_s=3)) == 8  # held
        up = run_registry_launcher("up", *common)
        assert up.returncode == 0, up.stdout + up.stderr
        runner.join(120)
        assert not runner.is_alive()
        out = read_topic(kafka_bootstrap, names["results"], expected=len(reviews))
        reader = ValueReader(settings.sections.registry)
        ids = [(reader.fields(m.value()) or {}).get("id") for m in out]
    finally:
        worker.request_stop()
        runner.join(30)
        # `down` takes no --no-save (the broker launcher's flag): argparse refused it with exit 2, unchecked,
        # and the restarted registry outlived `make test` (its registry-down knows only the suite's port).
        stopped = run_registry_launcher("down", *common, timeout_s=60)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert ids == [r["id"] for r in reviews]  # each once, in input order
    assert read_topic(kafka_bootstrap, names["dlq"], expected=1, timeout_s=2) == []
    assert worker.health.registry_problem is None


def test_a_result_schema_with_an_optional_field_more_is_accepted_and_old_readers_read_it(
    schema_registry_url: str, unique_name: Any
) -> None:
    client = SchemaRegistryClient({"url": schema_registry_url})
    topic = unique_name("results")
    settings = make_settings(
        "unused:9092",
        {"reviews": "in", "results": topic, "dlq": "dlq", "group": "g"},
        output_format="avro",
        schema_registry_url=schema_registry_url,
    )
    registered = register_result_schema(client, settings.sections.registry, settings.output_topic)
    assert client.get_compatibility(registered.subject) == "BACKWARD"
    old = avro_result_schema()
    # The field's doc is unique to this test: a registry may answer a schema it already holds (under
    # another subject) with its id, without checking it against this subject.
    added = {"name": "explanation", "type": ["null", "string"], "default": None, "doc": topic}
    new = {**old, "fields": [*old["fields"], added]}
    required = {**old, "fields": [*old["fields"], {**added, "type": "string", "default": None}]}
    del required["fields"][-1]["default"]
    with pytest.raises(SchemaRegistryError) as refused:  # a field without a default: old results unreadable
        client.register_schema(registered.subject, Schema(json.dumps(required), "AVRO"))
    assert refused.value.http_status_code == 409
    assert client.test_compatibility(registered.subject, Schema(json.dumps(new), "AVRO"))
    new_id = client.register_schema(registered.subject, Schema(json.dumps(new), "AVRO"))
    assert new_id != registered.schema_id
    assert client.get_versions(registered.subject) == [1, 2]
    # A record written with the new version, read with the old schema file (and the other way round).
    record = {
        "id": "r-1",
        "label": "positive",
        "label_id": 1,
        "confidence": 0.9,
        "probabilities": {"negative": 0.1, "positive": 0.9},
        "model": {"name": "m", "version": "1"},
        "source": {"topic": "in", "partition": 0, "offset": 1, "timestamp_ms": None},
        "processing_time_ms": 1.0,
        "processed_at_ms": 1,
        "metadata": "{}",
        "explanation": "short",
    }
    writer = fastavro.parse_schema(json.loads(client.get_schema(new_id).schema_str))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, writer, record)
    by_old = fastavro.schemaless_reader(io.BytesIO(out.getvalue()), writer, fastavro.parse_schema(old))
    assert by_old["id"] == "r-1" and "explanation" not in by_old
    # The worker's own version stays registered: starting again with it is a no-op (same id).
    assert client.register_schema(registered.subject, result_schema("avro")) == registered.schema_id


@pytest.fixture(scope="session")
def interop_jars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mvn = shutil.which("mvn")
    assert mvn, "the interop reader's jars come from Maven Central: install Maven"
    libs = tmp_path_factory.mktemp("interop") / "libs"
    pom = ROOT / "deploy" / "interop" / "pom.xml"
    command = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={libs}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return libs


def test_a_java_client_reads_the_avro_results(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any, schema_registry_url: str, interop_jars: Path
) -> None:
    names = topics(input_partitions=2, output_partitions=2)
    reviews = sample_reviews(20)
    produce(
        kafka_bootstrap,
        names["reviews"],
        [(r["id"].encode(), json.dumps(r, ensure_ascii=False).encode()) for r in reviews],
    )
    settings = make_settings(
        kafka_bootstrap, names, output_format="avro", schema_registry_url=schema_registry_url
    )
    worker = SentimentWorker(
        settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
    )
    assert worker.run(max_messages=len(reviews)).results == len(reviews)

    java = shutil.which("java")
    assert java
    reader = ROOT / "deploy" / "interop" / "AvroResultsReader.java"
    command = [
        java,
        "-cp",
        f"{interop_jars}/*",
        str(reader),
        kafka_bootstrap,
        names["results"],
        schema_registry_url,
        "20",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in reviews)
    seq = {r["id"]: r["seq"] for r in reviews}
    for record in records:
        assert record["schema_name"] == "sentiment-result" and record["label"] in tiny_classifier.labels
        assert json.loads(record["metadata"])["seq"] == seq[record["id"]]  # metadata, as JSON text


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_command(*args, env={**os.environ, **env}, timeout=300)


def test_the_readme_round_trip_produce_run_tail_and_doctor_in_avro(
    kafka_bootstrap: str, topics: Any, tiny_model_dir: Path, schema_registry_url: str
) -> None:
    names = topics()
    env = cli_env(kafka_bootstrap, names, tiny_model_dir, SENTIMENT_SCHEMA_REGISTRY_URL=schema_registry_url)
    samples = SAMPLES / "reviews.jsonl"
    produced = _cli(
        "produce", str(samples), "--format", "avro", "--schema", str(SAMPLES / "review.avsc"), env=env
    )
    assert produced.returncode == 0, produced.stderr
    assert "read 30, sent 30, skipped 0, failed 0" in produced.stdout, produced.stdout

    avro = {**env, "SENTIMENT_INPUT_FORMAT": "avro", "SENTIMENT_OUTPUT_FORMAT": "avro"}
    run = _cli("run", "--max-messages", "30", env=avro)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert (summary["consumed"], summary["results"], summary["dead_letters"]) == (30, 30, 0)
    assert "HTTP Request" not in run.stderr  # the registry client's request lines stay out of the log

    tail = _cli("tail", "--idle-exit-s", "3", env=env)
    assert tail.returncode == 0, tail.stderr
    rows = [json.loads(line) for line in tail.stdout.splitlines()]
    assert [r["kind"] for r in rows] == ["result"] * 30
    assert sorted(r["id"] for r in rows) == [f"demo-{i:03d}" for i in range(1, 31)]
    assert {r["metadata"]["domain"] for r in rows} >= {"food"}  # metadata, decoded from its JSON text
    inputs = _cli("tail", "--topic", names["reviews"], "--idle-exit-s", "3", env=env)
    assert {json.loads(line)["kind"] for line in inputs.stdout.splitlines()} == {"review"}

    doctor = _cli("doctor", env=avro)
    assert f"[OK  ] subject {names['results']}-value: version 1" in doctor.stdout, doctor.stdout
    assert f"[OK  ] subject {names['reviews']}-value" in doctor.stdout, doctor.stdout
    wrong_field = _cli("doctor", env={**avro, "SENTIMENT_TEXT_FIELD": "body"})
    assert wrong_field.returncode == 1
    assert f"[FAIL] subject {names['reviews']}-value" in wrong_field.stdout
    assert "SENTIMENT_TEXT_FIELD" in wrong_field.stdout
    away = _cli("doctor", env={**avro, "SENTIMENT_SCHEMA_REGISTRY_URL": "http://127.0.0.1:1"})
    assert "[FAIL] schema registry" in away.stdout and "make registry-up" in away.stdout
