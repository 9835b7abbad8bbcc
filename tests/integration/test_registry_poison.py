"""Issue 50, findings 1 and 4: hostile values and hostile registries, against the real broker.

Finding 1: poison values of every registry format (NaN and infinite doubles, recursion 1,000 and 5,000 deep,
an array of 2^60 nulls, a 100 KB decimal, a JSON value 5,000 deep, a `$ref: "#"` value 450 deep, a 300-level
schema and a `.proto` of 500 nested messages the registry accepted, garbage) among good ones, in both
delivery modes: each poison value one dead letter of its stated kind, the good ones labelled in order, the
worker (a `run` process) never exits. Before, each one made the worker exit 1 (or SIGSEGV), on every restart.

Finding 4: a registry of the test's own (`FakeRegistry`, a real HTTP server) trickling its answer, answering
HTML or `{}`, answering an invalid schema, and answering 404 slowly: the window is held back (not ready,
saying why; nothing dead-lettered, nothing committed) within the timeout per answer, SIGTERM is honoured,
and an unknown id costs one request per period.
"""

from __future__ import annotations

import io
import json
import math
import signal
import struct
import threading
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from schemas.dead_letter import DeadLetterKind, parse_dead_letter_headers
from schemas.sentiment_result import ModelRef
from tests.integration.helpers import http_get, make_settings, sample_reviews, worker_env
from tests.integration.kafka_io import committed_offsets, produce, read_topic
from tests.labellers import labeller_for
from tests.polling import wait_until
from tests.registry_fixtures import FakeRegistry
from tests.wire_values import NODE_AVRO, varint, zigzag
from tests.worker_commands import run_command, start_command
from worker.bench.worker_process import free_port
from worker.kafka.app import SentimentWorker
from worker.kafka.wire_format import wire_header

pytestmark = pytest.mark.integration

K = DeadLetterKind
REVIEW_AVRO = {
    "type": "record",
    "name": "Review",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "text", "type": "string"},
        {"name": "score", "type": ["null", "double"], "default": None},
    ],
}
NULLS_AVRO = {
    "type": "record",
    "name": "Nulls",
    "fields": [{"name": "text", "type": "string"}, {"name": "a", "type": {"type": "array", "items": "null"}}],
}
DECIMAL_AVRO = {
    "type": "record",
    "name": "Priced",
    "fields": [
        {"name": "text", "type": "string"},
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    ],
}
REVIEW_JSON = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"id": {"type": "string"}, "text": {"type": "string"}, "score": {"type": "number"}},
    "required": ["text"],
}
REF_ROOT_JSON = {"type": "object", "properties": {"text": {"type": "string"}, "c": {"$ref": "#"}}}
REVIEW_PROTO = (
    'syntax = "proto3";\nmessage Review {\n  string id = 1;\n  string text = 2;\n  double score = 3;\n}\n'
)
NODE_PROTO = 'syntax = "proto3";\nmessage Node {\n  string text = 1;\n  Node child = 2;\n}\n'


def _avro(schema_id: int, schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return wire_header(schema_id) + out.getvalue()


def _proto_string(field: int, text: str) -> bytes:
    data = text.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


def _proto_review(schema_id: int, review_id: str, text: str, score: float) -> bytes:
    body = _proto_string(1, review_id) + _proto_string(2, text) + b"\x19" + struct.pack("<d", score)
    return wire_header(schema_id) + b"\x00" + body


class _Registered:
    """Schemas registered in the real registry under subjects of this test's own; `id(...)` their ids."""

    def __init__(self, url: str) -> None:
        self._client = SchemaRegistryClient({"url": url})
        self._prefix = uuid.uuid4().hex[:8]

    def id(self, schema: Any, schema_type: str) -> int:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        subject = f"poison-{self._prefix}-{abs(hash(text))}-value"
        return int(self._client.register_schema(subject, Schema(text, schema_type)))


Case = tuple[bytes, Any]  # a value and what it must become: a review's id (None: the default id) or a kind


def _cases(fmt: str, registry_url: str, reviews: list[dict[str, Any]]) -> tuple[list[Case], list[Case]]:
    """The good values (one per review, and one nested within the limits) with their ids, and the poison
    ones, each with the dead-letter kind it must get."""
    reg = _Registered(registry_url)
    poison: dict[bytes, DeadLetterKind] = {}
    if fmt == "avro":
        review_id = reg.id(REVIEW_AVRO, "AVRO")
        good = [_avro(review_id, REVIEW_AVRO, {**_plain(r), "score": 0.5}) for r in reviews]
        node_id = reg.id(NODE_AVRO, "AVRO")
        poison = {
            _avro(review_id, REVIEW_AVRO, {"id": "nan", "text": "好", "score": math.nan}): K.INVALID_PAYLOAD,
            _avro(review_id, REVIEW_AVRO, {"id": "inf", "text": "好", "score": -math.inf}): K.INVALID_PAYLOAD,
            wire_header(node_id) + b"\x02x\x02" * 999 + b"\x02x\x00": K.INVALID_PAYLOAD,  # 1,000 deep
            wire_header(node_id) + b"\x02x\x02" * 4999 + b"\x02x\x00": K.INVALID_PAYLOAD,  # 5,000 deep
            wire_header(reg.id(NULLS_AVRO, "AVRO")) + b"\x02x" + zigzag(2**60) + b"\x00": K.INVALID_PAYLOAD,
            wire_header(reg.id(DECIMAL_AVRO, "AVRO")) + b"\x02x" + zigzag(100_000) + b"\x7f" * 100_000: (
                K.INVALID_PAYLOAD
            ),
            wire_header(review_id) + b"\xff\xff\xff\xff\xff\xff": K.INVALID_PAYLOAD,
            wire_header(987_654_321) + b"\x02x": K.UNKNOWN_SCHEMA,
        }
        shallow = wire_header(node_id) + b"\x04ok\x02" * 2 + b"\x04ok\x00"  # 3 deep: a review
        return [*_ids(good, reviews), (shallow, None)], list(poison.items())
    if fmt == "json_schema":
        review_id = reg.id(REVIEW_JSON, "JSON")
        good = [wire_header(review_id) + json.dumps({**_plain(r), "score": 0.5}).encode() for r in reviews]
        ref_id = reg.id(REF_ROOT_JSON, "JSON")
        deep_ref: Any = {"text": "x"}
        for _ in range(449):
            deep_ref = {"text": "x", "c": deep_ref}
        tall: Any = {"type": "string"}
        for _ in range(300):
            tall = {"type": "object", "properties": {"c": tall}}
        deep = b'{"text": "x", "m": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        poison = {
            wire_header(review_id) + deep: K.INVALID_PAYLOAD,
            wire_header(ref_id) + json.dumps(deep_ref).encode(): K.INVALID_PAYLOAD,
            wire_header(reg.id(tall, "JSON")) + b'{"text": "x"}': K.INVALID_SCHEMA,
            wire_header(review_id) + b'{"text": "x", "score": NaN}': K.INVALID_PAYLOAD,
            wire_header(review_id) + b'{"text": "x", "score": 1e999}': K.INVALID_PAYLOAD,
            wire_header(review_id) + b"\xff\xfe garbage": K.INVALID_PAYLOAD,
        }
        shallow = wire_header(ref_id) + json.dumps({"text": "好", "c": {"text": "y"}}).encode()
        return [*_ids(good, reviews), (shallow, None)], list(poison.items())
    review_id = reg.id(REVIEW_PROTO, "PROTOBUF")
    good = [_proto_review(review_id, r["id"], r["text"], 0.5) for r in reviews]
    nested = 'syntax = "proto3";\n' + "".join(f"message M{i} {{\n" for i in range(500)) + "}\n" * 500
    deep_node = b""
    for _ in range(80):
        deep_node = _proto_string(1, "x") + b"\x12" + varint(len(deep_node)) + deep_node
    poison = {
        wire_header(reg.id(nested, "PROTOBUF")) + b"\x00" + _proto_string(1, "x"): K.INVALID_SCHEMA,
        wire_header(reg.id(NODE_PROTO, "PROTOBUF")) + b"\x00" + deep_node: K.INVALID_PAYLOAD,
        _proto_review(review_id, "nan", "好", math.nan): K.INVALID_PAYLOAD,
        _proto_review(review_id, "inf", "好", math.inf): K.INVALID_PAYLOAD,
        wire_header(review_id) + b"\x00\xff\xff\xff\xff": K.INVALID_PAYLOAD,
    }
    return _ids(good, reviews), list(poison.items())


def _ids(values: list[bytes], reviews: list[dict[str, Any]]) -> list[Case]:
    return [(value, review["id"]) for value, review in zip(values, reviews, strict=True)]


def _plain(review: dict[str, Any]) -> dict[str, Any]:
    return {"id": review["id"], "text": review["text"]}


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("fmt", ["avro", "json_schema", "protobuf"])
def test_poison_values_of_every_registry_format_are_dead_letters_and_the_worker_goes_on(
    fmt: str,
    delivery: str,
    kafka_bootstrap: str,
    topics: Any,
    tiny_model_dir: Path,
    schema_registry_url: str,
) -> None:
    names = topics(input_partitions=2, output_partitions=2)
    good, poison = _cases(fmt, schema_registry_url, sample_reviews(12))
    expected: dict[
        tuple[int, int], Any
    ] = {}  # (partition, offset) -> the review's id or the dead letter's kind
    for partition in (0, 1):
        mine, bad = good[partition::2], poison[partition::2]
        records: list[tuple[bytes | None, bytes | None]] = []
        for index, (value, review_id) in enumerate(mine):  # each poison value once, among good ones
            for item, outcome in [(value, review_id), *([bad[index]] if index < len(bad) else [])]:
                offset = len(records)
                expected[(partition, offset)] = outcome or f"{names['reviews']}/{partition}/{offset}"
                records.append((b"k", item))
        for item, outcome in bad[len(mine) :]:
            expected[(partition, len(records))] = outcome
            records.append((b"k", item))
        produce(kafka_bootstrap, names["reviews"], records, partition=partition)
    env = worker_env(
        kafka_bootstrap,
        names,
        tiny_model_dir,
        SENTIMENT_INPUT_FORMAT=fmt,
        SENTIMENT_SCHEMA_REGISTRY_URL=schema_registry_url,
        SENTIMENT_DELIVERY=delivery,
        SENTIMENT_MAX_WINDOW_MESSAGES="8",
    )
    run = run_command("run", "--max-messages", str(len(expected)), env=env, timeout=600)
    assert run.returncode == 0, f"the worker exited {run.returncode}: {run.stderr[-3000:]}"
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert (summary["results"], summary["dead_letters"]) == (len(good), len(poison))

    results = [
        json.loads(m.value()) for m in read_topic(kafka_bootstrap, names["results"], expected=len(good))
    ]
    dead = read_topic(kafka_bootstrap, names["dlq"], expected=len(poison))
    by_source: dict[tuple[int, int], Any] = {
        (r["source"]["partition"], r["source"]["offset"]): r["id"] for r in results
    }
    reasons = {}
    for message in dead:
        info = parse_dead_letter_headers(message.headers())
        by_source[(info.source_partition, info.source_offset)] = info.kind
        reasons[info.kind] = info.reason
    assert by_source == expected  # every input once: each good one labelled with its id, each poison its kind
    assert {m.value() for m in dead} == {value for value, _ in poison}  # the input's bytes, untouched
    offsets: dict[int, list[int]] = defaultdict(list)
    for r in results:
        offsets[r["source"]["partition"]].append(r["source"]["offset"])
    assert all(o == sorted(o) for o in offsets.values())  # per-partition input order
    assert all("schema id" in reason for reason in reasons.values())  # each reason names the schema


def _review_values(schema_id: int, reviews: list[dict[str, Any]]) -> list[tuple[bytes | None, bytes | None]]:
    return [(r["id"].encode(), _avro(schema_id, REVIEW_AVRO, {**_plain(r), "score": None})) for r in reviews]


def test_a_registry_trickling_its_answer_is_given_up_per_answer_readyz_names_it_and_sigterm_is_honoured(
    kafka_bootstrap: str, topics: Any, tiny_model_dir: Path
) -> None:
    """Before: an answer sent a byte every 3 s held the poll loop for over 97 s (the timeout was per read),
    /readyz said 200, and SIGTERM was not honoured in 40 s."""
    names = topics(input_partitions=1, output_partitions=1)
    port = free_port()
    with FakeRegistry() as registry:
        registry.mode, registry.trickle_s = "trickle", 0.5
        produce(kafka_bootstrap, names["reviews"], _review_values(1, sample_reviews(3)))
        env = worker_env(
            kafka_bootstrap,
            names,
            tiny_model_dir,
            SENTIMENT_INPUT_FORMAT="avro",
            SENTIMENT_SCHEMA_REGISTRY_URL=registry.url,
            SENTIMENT_SCHEMA_REGISTRY_TIMEOUT_S="2",
            SENTIMENT_SHUTDOWN_TIMEOUT_S="10",
            SENTIMENT_HTTP_PORT=str(port),
        )
        proc = start_command(env, "run")
        try:
            body = wait_until(
                lambda: (
                    (got := http_get(f"http://127.0.0.1:{port}/readyz"))[0] == 503
                    and "schema_registry" in got[1]
                    and got[1]
                ),
                120,
                "/readyz to fail naming the registry",
                interval_s=0.5,
            )
            assert "did not answer within 2 s" in json.loads(body)["schema_registry"]
            # Given up and asked again (the back-off is 0.5 s, then 1, 2, 5): no request holds the loop.
            wait_until(lambda: len(registry.requests) >= 3, 60, "the registry to be asked again")
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)  # the shutdown timeout is 10 s
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["stopped"] == "stop requested"
    assert read_topic(kafka_bootstrap, names["results"], expected=1, timeout_s=3) == []
    assert read_topic(kafka_bootstrap, names["dlq"], expected=1, timeout_s=3) == []
    assert committed_offsets(kafka_bootstrap, names["group"], names["reviews"], 1) == {0: -1001}


def test_html_and_empty_answers_hold_the_window_back_and_nothing_is_dead_lettered_or_committed(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    """Before: a registry answering 200 with HTML got 3 of 3 valid inputs dead-lettered as invalid_payload,
    and committed."""
    names = topics(input_partitions=1, output_partitions=1)
    reviews = sample_reviews(3)
    with FakeRegistry() as registry:
        registry.mode = "html"
        settings = make_settings(
            kafka_bootstrap,
            names,
            input_format="avro",
            schema_registry_url=registry.url,
            schema_registry_timeout_s=2,
        )
        produce(kafka_bootstrap, names["reviews"], _review_values(1, reviews))
        worker = SentimentWorker(
            settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
        )
        runner = threading.Thread(target=worker.run, kwargs={"max_messages": len(reviews)})
        runner.start()
        try:
            for mode, shown in (("html", "text/html"), ("empty", "'{}'")):
                registry.mode = mode
                problem = wait_until(
                    lambda shown=shown: shown in str(worker.health.readiness()[1].get("schema_registry")),
                    60,
                    f"/readyz to name the registry's {mode} answer",
                )
                assert problem and not worker.health.readiness()[0]
                assert read_topic(kafka_bootstrap, names["dlq"], expected=1, timeout_s=2) == []
                assert committed_offsets(kafka_bootstrap, names["group"], names["reviews"], 1) == {0: -1001}
            registry.schemas[1] = {"schema": json.dumps(REVIEW_AVRO)}
            registry.mode = "ok"
            runner.join(120)
            assert not runner.is_alive()
        finally:
            worker.request_stop()
            runner.join(30)
    results = read_topic(kafka_bootstrap, names["results"], expected=len(reviews))
    assert [json.loads(m.value())["id"] for m in results] == [r["id"] for r in reviews]
    assert read_topic(kafka_bootstrap, names["dlq"], expected=1, timeout_s=2) == []
    assert worker.health.registry_problem is None


def test_an_invalid_schema_dead_letters_its_values_and_an_unknown_id_is_asked_once_per_period(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any
) -> None:
    """Before: an answered schema that was no Avro schema raised TypeError (the worker exited, on every
    restart), and each value of an unknown id asked the registry again (a slow 404: 0.2 values/s)."""
    names = topics(input_partitions=1, output_partitions=1)
    reviews = sample_reviews(10)
    with FakeRegistry() as registry:
        registry.schemas[1] = {"schema": json.dumps(REVIEW_AVRO)}
        registry.schemas[2] = {"schema": json.dumps({"type": "recordz", "fields": 7})}
        registry.delay_s = 0.5  # each "not found" takes half a second
        records: list[tuple[bytes | None, bytes | None]] = []
        expected: list[Any] = []
        for (key, value), review in zip(_review_values(1, reviews), reviews, strict=True):
            records += [
                (key, value),
                (b"bad", wire_header(2) + value[5:]),
                (b"unknown", wire_header(999) + value[5:]),
            ]
            records += [(b"unknown", wire_header(999) + value[5:])] * 3
            expected += [
                review["id"],
                K.INVALID_SCHEMA,
                K.UNKNOWN_SCHEMA,
                K.UNKNOWN_SCHEMA,
                K.UNKNOWN_SCHEMA,
                K.UNKNOWN_SCHEMA,
            ]
        produce(kafka_bootstrap, names["reviews"], records)
        settings = make_settings(
            kafka_bootstrap, names, input_format="avro", schema_registry_url=registry.url
        )
        worker = SentimentWorker(
            settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
        )
        summary = worker.run(max_messages=len(records))
        unknown_asked = registry.requests.count("/schemas/ids/999")
        invalid_asked = registry.requests.count("/schemas/ids/2")
    assert (summary.results, summary.dead_letters) == (len(reviews), len(records) - len(reviews))
    outputs: dict[int, Any] = {
        json.loads(m.value())["source"]["offset"]: json.loads(m.value())["id"]
        for m in read_topic(kafka_bootstrap, names["results"], expected=len(reviews))
    }
    dead = read_topic(kafka_bootstrap, names["dlq"], expected=len(records) - len(reviews))
    for message in dead:
        info = parse_dead_letter_headers(message.headers())
        outputs[info.source_offset] = info.kind
        if info.kind is K.INVALID_SCHEMA:
            assert "not a valid Avro schema" in info.reason and "schema id 2" in info.reason
    assert [outputs[offset] for offset in range(len(records))] == expected
    assert invalid_asked == 1  # a schema that cannot be read is kept as such
    assert unknown_asked <= 2  # 40 values, one request per 10 s (the run may straddle one period's end)
