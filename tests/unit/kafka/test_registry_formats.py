"""The Schema Registry formats' pure parts: the wire format's header, a decoded record → review or dead
letter, the registry's troubles told apart from bad values, the result schema in three formats kept in step
with the pydantic model and read back. Against the real registry: tests/integration/test_registry_formats.py.
"""

from __future__ import annotations

import base64
import decimal
import io
import json
import re
import threading
import uuid

import fastavro
import pytest
from confluent_kafka.schema_registry.common._httpx_compat import httpx
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf import json_format

from schemas.dead_letter import DeadLetterKind
from schemas.registry_schemas import (
    PROTOBUF_RESULT_FILE,
    avro_result_schema,
    json_result_schema,
    protobuf_result_file,
)
from schemas.review_decode import DecodeFailure
from schemas.review_input import Review
from schemas.sentiment_result import ModelRef, SentimentResult, SourceRef
from tests.labellers import labeller_for
from tests.polling import wait_until
from tests.unit.kafka.fake_kafka import FakePublisher, fake_clients
from tests.unit.kafka.test_app import MODEL, TOPIC, FakeLengthClassifier, settings
from worker.kafka.app import SentimentWorker
from worker.kafka.producer import SourcePosition
from worker.kafka.protobuf_values import _message_indexes
from worker.kafka.records import InputMessage
from worker.kafka.registry_client import RegistryClient
from worker.kafka.registry_decode import (
    RegistryDecoder,
    RegistryUnavailable,
    registry_trouble,
    review_of_record,
)
from worker.kafka.registry_limits import plain_json
from worker.kafka.result_encoding import (
    avro_encoder,
    json_schema_encoder,
    protobuf_encoder,
    protobuf_result_class,
    result_subject,
)
from worker.kafka.run_tracker import RunSummary
from worker.kafka.windows import DecodeOptions, prepare_window
from worker.kafka.wire_format import not_wire_format_reason, schema_id_of, wire_header

CLOSED_PORT_URL = "http://127.0.0.1:1"  # nothing listens there: a registry that cannot be reached


# --- the header ----------------------------------------------------------------------------------------


def test_the_header_is_magic_byte_0_and_the_schema_id_big_endian() -> None:
    assert wire_header(258) == b"\x00\x00\x00\x01\x02"
    assert schema_id_of(wire_header(258) + b"payload") == 258
    assert schema_id_of(wire_header(2**32 - 1) + b"x") == 2**32 - 1


@pytest.mark.parametrize(
    "value",
    [
        '{"text": "好"}'.encode(),
        b"\x01\x00\x00\x00\x01payload",
        b"\x00\x00\x00\x00\x01",
        b"\x00",
        b"plain text",
    ],
)
def test_a_value_without_the_header_and_a_payload_has_no_schema_id(value: bytes) -> None:
    assert schema_id_of(value) is None


def test_the_reason_says_what_the_value_starts_with_and_what_to_do() -> None:
    reason = not_wire_format_reason(b'{"text": "x"}', "avro")
    assert "byte 0x7b" in reason and "SENTIMENT_INPUT_FORMAT" in reason
    assert "too short" in not_wire_format_reason(b"\x00\x00", "avro")


def test_protobuf_message_indexes_zero_means_the_first_message() -> None:
    assert _message_indexes(b"\x00\x00\x00\x00\x01\x00rest", 5) == ((0,), 6)
    # count 2 (zig-zag 4), indexes 1 (2) and 0 (0)
    assert _message_indexes(b"\x04\x02\x00rest", 0) == ((1, 0), 3)
    with pytest.raises(ValueError, match="message index"):
        _message_indexes(b"\x04\x02", 0)


# --- a decoded record → review -------------------------------------------------------------------------


def _review(document: object, **overrides: object) -> Review | DecodeFailure:
    options: dict[str, object] = {
        "input_format": "avro",
        "schema_id": 3,
        "default_id": "reviews/0/9",
        "text_field": "text",
        "id_field": "id",
        "max_text_chars": 100,
    }
    return review_of_record(document, **{**options, **overrides})  # type: ignore[arg-type]


def test_text_and_id_come_from_their_fields_and_the_rest_is_json_metadata() -> None:
    review = _review(
        {"text": "很好", "id": 42, "stars": 5, "raw": b"\x00\xff", "price": decimal.Decimal("9.90")}
    )
    assert review == Review(
        id="42",
        text="很好",
        metadata={"stars": 5, "raw": base64.b64encode(b"\x00\xff").decode(), "price": "9.90"},
    )
    assert json.dumps(review.metadata)  # JSON-able, so every output format can carry it


def test_named_fields_and_a_missing_id_falls_back_to_the_records_position() -> None:
    review = _review({"body": "不错", "sku": "A1"}, text_field="body", id_field="review_id")
    assert review == Review(id="reviews/0/9", text="不错", metadata={"sku": "A1"})


@pytest.mark.parametrize(
    ("document", "kind"),
    [
        ({"body": "x"}, DeadLetterKind.MISSING_TEXT),
        ({"text": None}, DeadLetterKind.WRONG_TYPE),
        ({"text": 5}, DeadLetterKind.WRONG_TYPE),
        ({"text": "x", "id": 1.5}, DeadLetterKind.WRONG_TYPE),
        ({"text": "  "}, DeadLetterKind.EMPTY_TEXT),
        ({"text": "长" * 101}, DeadLetterKind.TEXT_TOO_LONG),
        ("a string", DeadLetterKind.INVALID_PAYLOAD),
    ],
)
def test_a_record_that_is_no_review_is_a_dead_letter_of_its_kind(
    document: object, kind: DeadLetterKind
) -> None:
    failure = _review(document)
    assert isinstance(failure, DecodeFailure) and failure.kind is kind


def test_missing_text_names_the_field_and_the_setting() -> None:
    failure = _review({"body": "x"})
    assert isinstance(failure, DecodeFailure)
    assert '"text"' in failure.reason and "SENTIMENT_TEXT_FIELD" in failure.reason


def test_plain_json_keeps_json_values_and_writes_the_others_as_text() -> None:
    some_id = uuid.UUID(int=1)
    assert plain_json({"a": [1, 2.5, None, True], "u": some_id, "t": (1, 2)}, 3) == {
        "a": [1, 2.5, None, True],
        "u": str(some_id),
        "t": [1, 2],
    }


# --- the registry's trouble is not the value's fault --------------------------------------------------


def test_unreachable_5xx_and_refused_credentials_are_the_registrys_trouble() -> None:
    assert registry_trouble(httpx.ConnectError("refused"), "http://r") is not None
    assert registry_trouble(SchemaRegistryError(503, 50003, "down"), "http://r") is not None
    refused = registry_trouble(SchemaRegistryError(401, 401, "Unauthorized"), "http://r")
    assert refused is not None and "BASIC_AUTH_USER_INFO" in str(refused)


def test_an_unknown_subject_and_an_incompatible_schema_are_answers_not_trouble() -> None:
    assert registry_trouble(SchemaRegistryError(404, 40401, "Subject not found"), "http://r") is None
    assert registry_trouble(SchemaRegistryError(409, 409, "incompatible"), "http://r") is None


def _decoder(input_format: str, url: str = CLOSED_PORT_URL) -> RegistryDecoder:
    client = RegistryClient(url, timeout_s=2)
    return RegistryDecoder(client, input_format, max_value_bytes=1000, max_text_chars=100)


@pytest.mark.parametrize("input_format", ["avro", "json_schema", "protobuf"])
def test_a_value_that_needs_an_unreachable_registry_raises_instead_of_being_dead_lettered(
    input_format: str,
) -> None:
    with pytest.raises(RegistryUnavailable, match="cannot be reached"):
        _decoder(input_format).decode(wire_header(1) + b"\x02payload", "reviews/0/0")


@pytest.mark.parametrize("input_format", ["avro", "json_schema", "protobuf"])
def test_values_without_the_header_are_dead_letters_without_asking_the_registry(input_format: str) -> None:
    decoder = _decoder(input_format)  # unreachable: it is never asked
    values = (b'{"text": "x"}', b"\x00\x00", None, b"", b"a" * 1001)
    outcomes = [decoder.decode(value, "x") for value in values]
    assert [o.kind for o in outcomes if isinstance(o, DecodeFailure)] == [
        DeadLetterKind.NOT_WIRE_FORMAT,
        DeadLetterKind.NOT_WIRE_FORMAT,
        DeadLetterKind.EMPTY_VALUE,
        DeadLetterKind.EMPTY_VALUE,
        DeadLetterKind.VALUE_TOO_LARGE,
    ]


def _message(offset: int, value: bytes) -> InputMessage:
    return InputMessage(SourcePosition(TOPIC, 0, offset, None), None, value, 0.0)


def test_a_window_needing_an_unreachable_registry_is_not_prepared_at_all() -> None:
    s = settings(input_format="avro", schema_registry_url=CLOSED_PORT_URL)
    options = DecodeOptions.from_settings(s.sections.registry, s.sections.limits, _decoder("avro"))
    items = [_message(0, b"not wire format"), _message(1, wire_header(1) + b"\x02x")]
    with pytest.raises(RegistryUnavailable):
        prepare_window(items, options)


def test_the_worker_holds_inputs_while_the_registry_is_away_and_says_so_on_readyz() -> None:
    """Nothing is published or committed for inputs whose schema cannot be fetched: not even the malformed
    value before them in the window (the window is prepared whole, later)."""
    log: dict[int, list[bytes | None]] = {
        0: [b"not wire format", wire_header(7) + b"\x02x", wire_header(7) + b"\x02y"]
    }
    publisher = FakePublisher()
    clients, consumers = fake_clients(TOPIC, log, publisher)
    s = settings(input_format="avro", schema_registry_url=CLOSED_PORT_URL, schema_registry_timeout_s=1)
    worker = SentimentWorker(s.sections, labeller_for(FakeLengthClassifier(), s, MODEL), clients=clients)
    runner = threading.Thread(target=worker.run, kwargs={"max_messages": 3})
    runner.start()
    try:
        checks = wait_until(
            lambda: (checks := worker.health.readiness()[1]).get("schema_registry") and checks,
            30,
            "/readyz to name the registry",
        )
        assert "cannot be reached" in str(checks["schema_registry"])
        assert not worker.health.readiness()[0]
    finally:
        worker.request_stop()
        runner.join(30)
    assert not runner.is_alive()
    assert publisher.sent == []  # no result, no dead letter
    assert all(not commit for commit in consumers[0].commits)


# --- the result schema in three formats ---------------------------------------------------------------

RESULT = SentimentResult(
    id="r-1",
    label="positive",
    label_id=1,
    confidence=0.875,
    probabilities={"negative": 0.125, "positive": 0.875},
    model=ModelRef(name="m", version="v1"),
    source=SourceRef(topic="reviews", partition=2, offset=40, timestamp_ms=None),
    processing_time_ms=1.5,
    processed_at_ms=1_700_000_000_000,
    metadata={"stars": 5, "shop": "北京"},
)
FIELDS = set(SentimentResult.model_fields)


def test_the_three_result_schemas_have_the_models_fields() -> None:
    assert {f["name"] for f in avro_result_schema()["fields"]} == FIELDS
    assert set(json_result_schema()["properties"]) == FIELDS
    assert {f.name for f in protobuf_result_file().message_type[0].field} == FIELDS


def test_the_proto_file_and_the_built_descriptor_name_the_same_fields_and_numbers() -> None:
    text = PROTOBUF_RESULT_FILE.read_text(encoding="utf-8")
    field = re.compile(r"^\s+(?:optional )?[\w<>, .]+ (\w+) = (\d+);", re.M)
    written = {(name, int(number)) for name, number in field.findall(text)}
    built = protobuf_result_file().message_type[0]
    descriptor = {(f.name, f.number) for f in built.field}
    for nested in built.nested_type:
        if nested.name != "ProbabilitiesEntry":  # the map's entry: no field of the file
            descriptor |= {(f.name, f.number) for f in nested.field}
    assert written == descriptor


def test_avro_result_reads_back_with_the_schema_file() -> None:
    value = avro_encoder(12)(RESULT)
    assert value[:5] == wire_header(12)
    schema = fastavro.parse_schema(avro_result_schema())
    record = fastavro.schemaless_reader(io.BytesIO(value[5:]), schema, None)
    assert record["id"] == "r-1" and record["probabilities"] == RESULT.probabilities
    assert record["source"]["timestamp_ms"] is None and json.loads(record["metadata"]) == RESULT.metadata


def test_json_schema_result_is_the_json_result_after_the_header() -> None:
    value = json_schema_encoder(5)(RESULT)
    assert value[:5] == wire_header(5) and json.loads(value[5:]) == json.loads(RESULT.model_dump_json())


def test_protobuf_result_reads_back_with_the_result_message() -> None:
    value = protobuf_encoder(9)(RESULT)
    assert value[:6] == wire_header(9) + b"\x00"
    message = protobuf_result_class()()
    message.ParseFromString(value[6:])
    back = json_format.MessageToDict(message, preserving_proto_field_name=True)
    assert back["id"] == "r-1" and back["source"] == {"topic": "reviews", "partition": 2, "offset": "40"}
    assert json.loads(back["metadata"]) == RESULT.metadata


def test_an_optional_avro_field_added_keeps_old_and_new_readers_reading() -> None:
    old = avro_result_schema()
    added = {"name": "explanation", "type": ["null", "string"], "default": None}
    new = {**old, "fields": [*old["fields"], added]}
    old_value = avro_encoder(1)(RESULT)[5:]
    old_parsed, new_parsed = fastavro.parse_schema(old), fastavro.parse_schema(new)
    by_new = fastavro.schemaless_reader(io.BytesIO(old_value), old_parsed, new_parsed)
    assert by_new["explanation"] is None and by_new["id"] == "r-1"
    out = io.BytesIO()
    fastavro.schemaless_writer(out, new_parsed, {**by_new, "explanation": "short"})
    by_old = fastavro.schemaless_reader(io.BytesIO(out.getvalue()), new_parsed, old_parsed)
    assert "explanation" not in by_old and by_old["id"] == "r-1"


@pytest.mark.parametrize(
    ("strategy", "subject"),
    [
        ("topic", "results-value"),
        ("record", "sentiment.SentimentResult"),
        ("topic_record", "results-sentiment.SentimentResult"),
    ],
)
def test_subject_name_strategies(strategy: str, subject: str) -> None:
    assert result_subject(strategy, "results") == subject


def test_the_worker_waits_for_the_registry_to_register_the_result_schema_and_a_stop_ends_the_wait() -> None:
    publisher = FakePublisher()
    clients, consumers = fake_clients(TOPIC, {0: [b'{"text": "x"}']}, publisher)
    s = settings(output_format="avro", schema_registry_url=CLOSED_PORT_URL, schema_registry_timeout_s=1)
    worker = SentimentWorker(s.sections, labeller_for(FakeLengthClassifier(), s, MODEL), clients=clients)
    failures: list[BaseException] = []
    summaries: list[RunSummary] = []

    def run() -> None:
        try:
            summaries.append(worker.run(max_messages=1))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failures.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        wait_until(
            lambda: worker.health.readiness()[1].get("schema_registry"), 30, "/readyz to name the registry"
        )
        assert consumers == []  # not in the group before results can be written
    finally:
        worker.request_stop()
        runner.join(30)
    assert not runner.is_alive()
    assert failures == []  # a clean stop: nothing was consumed
    assert [s.stop_reason for s in summaries] == [
        "stop requested while waiting for the Schema Registry to register the result schema"
    ]
    assert summaries[0].consumed == 0 and publisher.sent == []
