"""Message contracts: input coercion, output shape, dead-letter headers, and JSON Schema files in sync."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas import (
    HEADER_ERROR_KIND,
    HEADER_ERROR_REASON,
    HEADER_PREFIX,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TIMESTAMP_MS,
    HEADER_SOURCE_TOPIC,
    HEADER_WORKER_ID,
    DeadLetterInfo,
    DeadLetterKind,
    ModelRef,
    ReviewInput,
    SentimentResult,
    SourceRef,
    build_dead_letter_headers,
    export,
    parse_dead_letter_headers,
)
from schemas.dead_letter import MAX_REASON_CHARS
from schemas.http_api import SentimentRequest


def make_result(**overrides: object) -> SentimentResult:
    fields: dict[str, object] = {
        "id": "r-1",
        "label": "positive",
        "label_id": 1,
        "confidence": 0.9,
        "probabilities": {"negative": 0.1, "positive": 0.9},
        "model": ModelRef(name="ernie-3.0-mini-zh", version="abc123"),
        "source": SourceRef(topic="reviews", partition=2, offset=41, timestamp_ms=1_700_000_000_000),
        "processing_time_ms": 12.5,
        "processed_at_ms": 1_700_000_000_100,
        "metadata": {"shop": "s1", "stars": 5},
    }
    fields.update(overrides)
    return SentimentResult.model_validate(fields)


# --- ReviewInput -------------------------------------------------------------------------------------


def test_review_input_coerces_int_id_and_keeps_metadata() -> None:
    review = ReviewInput.model_validate_json('{"text": "很好", "id": 42, "shop": "s1", "tags": ["a"]}')
    assert review.id == "42"
    assert review.text == "很好"
    assert review.metadata == {"shop": "s1", "tags": ["a"]}


def test_review_input_id_is_optional() -> None:
    assert ReviewInput.model_validate({"text": "ok"}).id is None
    assert ReviewInput.model_validate({"text": "ok", "id": None}).id is None


@pytest.mark.parametrize("bad_id", [True, 1.5, ["1"], {"a": 1}])
def test_review_input_rejects_other_id_types(bad_id: object) -> None:
    with pytest.raises(ValidationError) as info:
        ReviewInput.model_validate({"text": "ok", "id": bad_id})
    assert info.value.errors()[0]["loc"] == ("id",)


@pytest.mark.parametrize(
    ("payload", "error_type"),
    [
        ({}, "missing"),
        ({"text": 5}, "string_type"),
        ({"text": ""}, "string_too_short"),
        ({"text": " \n"}, "value_error"),
    ],
)
def test_review_input_text_rules(payload: dict[str, object], error_type: str) -> None:
    with pytest.raises(ValidationError) as info:
        ReviewInput.model_validate(payload)
    errors = info.value.errors()
    assert [(e["loc"], e["type"]) for e in errors] == [(("text",), error_type)]


def test_review_input_text_kept_as_given() -> None:
    assert ReviewInput.model_validate({"text": "  好 评  "}).text == "  好 评  "


# --- SentimentResult ---------------------------------------------------------------------------------


def test_result_json_round_trip_has_every_field() -> None:
    result = make_result()
    payload = json.loads(result.model_dump_json())
    assert payload["schema_name"] == "sentiment-result"
    assert payload["schema_version"] == 1
    assert payload["source"] == {
        "topic": "reviews",
        "partition": 2,
        "offset": 41,
        "timestamp_ms": 1_700_000_000_000,
    }
    assert payload["model"] == {"name": "ernie-3.0-mini-zh", "version": "abc123"}
    assert set(payload) == {
        "schema_name",
        "schema_version",
        "id",
        "label",
        "label_id",
        "confidence",
        "probabilities",
        "model",
        "source",
        "processing_time_ms",
        "processed_at_ms",
        "metadata",
    }
    assert SentimentResult.model_validate_json(result.model_dump_json()) == result


def test_result_is_frozen() -> None:
    result = make_result()
    with pytest.raises(ValidationError):
        result.label = "negative"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        result.source.offset = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    "overrides",
    [
        {"confidence": 1.01},
        {"confidence": -0.1},
        {"schema_version": 2},
        {"schema_name": "other"},
        {"unexpected": 1},
        {"processing_time_ms": -1.0},
    ],
)
def test_result_rejects_out_of_contract_values(overrides: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        make_result(**overrides)


def test_result_source_timestamp_may_be_null() -> None:
    result = make_result(source=SourceRef(topic="t", partition=0, offset=0))
    assert json.loads(result.model_dump_json())["source"]["timestamp_ms"] is None


# --- Dead letters ------------------------------------------------------------------------------------


def test_dead_letter_kinds_are_the_contract_values() -> None:
    assert {kind.value for kind in DeadLetterKind} == {
        "empty_value",
        "invalid_utf8",
        "invalid_json",
        "not_an_object",
        "missing_text",
        "wrong_type",
        "empty_text",
        "text_too_long",
        "value_too_large",
        "not_wire_format",
        "unknown_schema",
        "invalid_payload",
        "invalid_schema",
        "decode_failed",
        "inference_failed",
        "too_long_for_memory",
        "undecodable_batch",
    }


def test_dead_letter_headers_round_trip() -> None:
    headers = build_dead_letter_headers(
        DeadLetterKind.INVALID_JSON,
        "value is not valid JSON: 坏",
        "reviews",
        3,
        1234,
        1_700_000_000_000,
        "w-7",
    )
    assert all(name.startswith(HEADER_PREFIX) and isinstance(value, bytes) for name, value in headers)
    as_dict = dict(headers)
    assert as_dict[HEADER_ERROR_KIND] == b"invalid_json"
    assert as_dict[HEADER_ERROR_REASON] == "value is not valid JSON: 坏".encode()
    assert as_dict[HEADER_SOURCE_PARTITION] == b"3"
    assert as_dict[HEADER_SOURCE_OFFSET] == b"1234"
    info = parse_dead_letter_headers(headers)
    assert info == DeadLetterInfo(
        kind=DeadLetterKind.INVALID_JSON,
        reason="value is not valid JSON: 坏",
        source_topic="reviews",
        source_partition=3,
        source_offset=1234,
        source_timestamp_ms=1_700_000_000_000,
        worker_id="w-7",
        dlq_version=1,
    )


@pytest.mark.parametrize("timestamp_ms", [None, -1])
def test_dead_letter_missing_timestamp_is_omitted(timestamp_ms: int | None) -> None:
    headers = build_dead_letter_headers(DeadLetterKind.EMPTY_VALUE, "null", "t", 0, 5, timestamp_ms, "w")
    assert HEADER_SOURCE_TIMESTAMP_MS not in dict(headers)
    assert parse_dead_letter_headers(headers).source_timestamp_ms is None


def test_dead_letter_reason_is_bounded() -> None:
    headers = build_dead_letter_headers(DeadLetterKind.INFERENCE_FAILED, "x" * 5000, "t", 0, 1, None, "w")
    reason = parse_dead_letter_headers(headers).reason
    assert len(reason) == MAX_REASON_CHARS
    assert reason.endswith("…")


def test_parse_ignores_foreign_headers_and_last_value_wins() -> None:
    headers: list[tuple[str, bytes | str | None]] = [
        ("traceparent", b"00-abc"),
        ("content-type", None),
        *build_dead_letter_headers(DeadLetterKind.EMPTY_TEXT, "first", "t", 1, 2, None, "w"),
        (HEADER_ERROR_REASON, "second"),
    ]
    info = parse_dead_letter_headers(headers)
    assert info.reason == "second"
    assert info.kind is DeadLetterKind.EMPTY_TEXT


def test_parse_rejects_missing_or_malformed_headers() -> None:
    headers = build_dead_letter_headers(DeadLetterKind.EMPTY_TEXT, "r", "t", 1, 2, None, "w")
    without_topic = [(k, v) for k, v in headers if k != HEADER_SOURCE_TOPIC]
    with pytest.raises(ValidationError):
        parse_dead_letter_headers(without_topic)
    bad_offset = [(k, b"12x" if k == HEADER_SOURCE_OFFSET else v) for k, v in headers]
    with pytest.raises(ValidationError):
        parse_dead_letter_headers(bad_offset)
    bad_kind = [(k, b"nope" if k == HEADER_ERROR_KIND else v) for k, v in headers]
    with pytest.raises(ValidationError):
        parse_dead_letter_headers(bad_kind)
    with pytest.raises(ValidationError):
        parse_dead_letter_headers(None)


def test_dead_letter_schema_describes_the_header_map() -> None:
    schema = json.loads(export.render_schema(DeadLetterInfo, "validation"))
    headers = build_dead_letter_headers(DeadLetterKind.WRONG_TYPE, "r", "t", 1, 2, 3, "w")
    assert set(schema["properties"]) == {name for name, _ in headers}
    assert set(schema["required"]) == {name for name, _ in headers} - {HEADER_SOURCE_TIMESTAMP_MS}
    assert schema["properties"][HEADER_WORKER_ID]["type"] == "string"
    assert schema["properties"][HEADER_SOURCE_OFFSET] == {
        "description": "Offset of the original record (decimal).",
        "pattern": "^-?[0-9]+$",
        "title": "Source offset",
        "type": "string",
    }


# --- JSON Schema files -------------------------------------------------------------------------------


def test_schema_files_match_models() -> None:
    """Fails when a model changed without re-running `python -m schemas.export` (or vice versa)."""
    for name, expected in export.expected_files().items():
        path = export.DEFAULT_DIR / name
        assert path.is_file(), f"{path} missing: run `python -m schemas.export`"
        assert path.read_text(encoding="utf-8") == expected, f"{path} drifted: run `python -m schemas.export`"
    assert export.drifted_files() == []


def test_expected_files_are_versioned_and_formatted() -> None:
    files = export.expected_files()
    assert sorted(files) == [
        "dead-letter-headers.v1.schema.json",
        "review-input.v1.schema.json",
        "sentiment-request.v1.schema.json",
        "sentiment-response.v1.schema.json",
        "sentiment-result.v1.schema.json",
    ]
    for text in files.values():
        schema = json.loads(text)
        assert text == json.dumps(schema, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["description"]


def test_result_schema_requires_every_output_field() -> None:
    schema = json.loads(export.expected_files()["sentiment-result.v1.schema.json"])
    assert set(schema["required"]) == set(SentimentResult.model_fields)
    assert all(prop.get("description") for prop in schema["properties"].values())


def test_check_detects_drift_and_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert export.main(["--check", "--dir", str(tmp_path)]) == 1  # nothing written yet
    assert export.main(["--dir", str(tmp_path)]) == 0
    assert export.main(["--check", "--dir", str(tmp_path)]) == 0
    target = tmp_path / "review-input.v1.schema.json"
    target.write_text(target.read_text(encoding="utf-8").replace("review text", "text"), encoding="utf-8")
    capsys.readouterr()
    assert export.main(["--check", "--dir", str(tmp_path)]) == 1
    assert export.drifted_files(tmp_path) == [target]
    assert "review-input.v1.schema.json" in capsys.readouterr().err


# ----- the HTTP API contract -----
def test_sentiment_request_items_in_order_with_ids_or_positions() -> None:
    assert SentimentRequest.model_validate({"text": "好", "id": 7}).items() == [("7", "好")]
    assert SentimentRequest.model_validate({"text": "好"}).items() == [("0", "好")]
    assert SentimentRequest.model_validate({"texts": ["a", "b"]}).items() == [("0", "a"), ("1", "b")]
    assert SentimentRequest.model_validate({"texts": ["a", "b"], "ids": ["x", 2]}).items() == [
        ("x", "a"),
        ("2", "b"),
    ]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({}, "either `text`"),
        ({"text": "a", "texts": ["b"]}, "either `text`"),
        ({"texts": ["a"], "id": "x"}, "`id` goes with `text`"),
        ({"text": "a", "ids": ["x"]}, "`ids` goes with `texts`"),
        ({"texts": ["a", "b"], "ids": ["x"]}, "1 entries for 2 texts"),
        ({"text": "bad \ud800"}, "valid string, unable to parse raw data as a unicode string"),
        ({"text": "a", "extra": 1}, "Extra inputs are not permitted"),
        ({"texts": ["a"], "ids": [True]}, "valid string"),
    ],
)
def test_sentiment_request_refusals_say_why(payload: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        SentimentRequest.model_validate(payload)
