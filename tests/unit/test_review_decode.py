"""decode_review: every bad input becomes a DecodeFailure with the right kind and a useful reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from schemas import DeadLetterKind, ReviewInput
from schemas.review_decode import DecodeFailure, InputFormat, decode_review
from schemas.review_input import Review
from worker.config import WorkerSettings
from worker.kafka.windows import DecodeOptions

DEFAULT_ID = "reviews/0/17"


def decode(
    value: bytes | None,
    *,
    input_format: InputFormat = "json",
    max_value_bytes: int = 10_000,
    max_text_chars: int = 100,
    max_json_depth: int = 8,
) -> Review | DecodeFailure:
    return decode_review(
        value,
        input_format=input_format,
        max_value_bytes=max_value_bytes,
        max_text_chars=max_text_chars,
        max_json_depth=max_json_depth,
        default_id=DEFAULT_ID,
    )


def failure(value: bytes | None, **kwargs: Any) -> DecodeFailure:
    result = decode(value, **kwargs)
    assert isinstance(result, DecodeFailure), result
    return result


def ok(value: bytes | None, **kwargs: Any) -> Review:
    result = decode(value, **kwargs)
    assert isinstance(result, Review), result
    return result


# --- valid inputs ------------------------------------------------------------------------------------


def test_json_review_with_string_id_and_metadata() -> None:
    review = ok(json.dumps({"id": "a-1", "text": "物流很快，好评！", "shop": "s1", "stars": 5}).encode())
    assert review == Review(id="a-1", text="物流很快，好评！", metadata={"shop": "s1", "stars": 5})


def test_int_id_becomes_decimal_string() -> None:
    assert ok(b'{"id": 12345678901234567890, "text": "ok"}').id == "12345678901234567890"
    assert ok(b'{"id": -3, "text": "ok"}').id == "-3"


@pytest.mark.parametrize("value", [b'{"text": "ok"}', b'{"text": "ok", "id": null}'])
def test_missing_or_null_id_uses_default(value: bytes) -> None:
    assert ok(value).id == DEFAULT_ID


def test_text_kept_as_given() -> None:
    assert ok('{"text": "  好\\n评  "}'.encode()).text == "  好\n评  "


def test_utf8_bom_and_surrounding_whitespace_are_accepted() -> None:
    assert ok(b'\xef\xbb\xbf  {"text": "ok"}\n').text == "ok"


def test_only_the_bom_is_dropped() -> None:
    assert ok(b"\xef\xbb\xbf" + "好评".encode(), input_format="text").text == "好评"


def test_escaped_surrogate_pair_is_valid() -> None:
    assert ok(b'{"text": "\\ud83d\\ude00"}').text == "\U0001f600"


def test_text_format_uses_whole_value() -> None:
    review = ok("  差评，不推荐 ".encode(), input_format="text")
    assert review == Review(id=DEFAULT_ID, text="  差评，不推荐 ", metadata={})


def test_text_format_does_not_parse_json() -> None:
    assert ok(b'{"text": "x"}', input_format="text").text == '{"text": "x"}'


def test_limits_are_inclusive() -> None:
    value = json.dumps({"text": "a" * 100}).encode()
    assert ok(value, max_value_bytes=len(value), max_text_chars=100).text == "a" * 100
    assert ok(b'{"text": "x", "m": [[1]]}', max_json_depth=3).metadata == {"m": [[1]]}


# --- failures ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("input_format", ["json", "text"])
def test_tombstone_and_empty_value(input_format: InputFormat) -> None:
    assert failure(None, input_format=input_format).kind is DeadLetterKind.EMPTY_VALUE
    assert "tombstone" in failure(None, input_format=input_format).reason
    assert failure(b"", input_format=input_format).kind is DeadLetterKind.EMPTY_VALUE


@pytest.mark.parametrize("input_format", ["json", "text"])
def test_value_too_large(input_format: InputFormat) -> None:
    result = failure(b'{"text": "' + b"a" * 100 + b'"}', input_format=input_format, max_value_bytes=50)
    assert result.kind is DeadLetterKind.VALUE_TOO_LARGE
    assert "112 bytes" in result.reason and "50 bytes" in result.reason


@pytest.mark.parametrize("input_format", ["json", "text"])
def test_invalid_utf8_reports_byte_position(input_format: InputFormat) -> None:
    value = b'{"text": "abcdef\xff"}'
    result = failure(value, input_format=input_format)
    assert result.kind is DeadLetterKind.INVALID_UTF8
    assert "at byte 16" in result.reason
    assert "UTF-8" in result.reason and '{"text": "..."}' in result.reason


@pytest.mark.parametrize(
    "value",
    [b"{", b'{"text": "a",}', b"not json", b'{"text": "a"} trailing', b"{'text': 'a'}"],
)
def test_invalid_json(value: bytes) -> None:
    result = failure(value)
    assert result.kind is DeadLetterKind.INVALID_JSON
    assert result.reason.startswith("value is not valid JSON")


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_standard_constants_are_invalid_json(constant: bytes) -> None:
    result = failure(b'{"text": "ok", "score": ' + constant + b"}")
    assert result.kind is DeadLetterKind.INVALID_JSON
    assert constant.decode().lstrip("-") in result.reason


@pytest.mark.parametrize("value", [b'{"text": "\\ud800"}', b'{"text": "ok", "m": {"\\uDC00": 1}}'])
def test_unpaired_surrogate_escape_is_invalid(value: bytes) -> None:
    result = failure(value)
    assert result.kind is DeadLetterKind.INVALID_JSON
    assert "surrogate" in result.reason


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(b"[1, 2]", "array"), (b'"text"', "string"), (b"3", "number"), (b"null", "null"), (b"true", "boolean")],
)
def test_not_an_object(value: bytes, type_name: str) -> None:
    result = failure(value)
    assert result.kind is DeadLetterKind.NOT_AN_OBJECT
    assert f"JSON {type_name}, not an object" in result.reason


def test_missing_text() -> None:
    result = failure(b'{"id": "1", "body": "good"}')
    assert result.kind is DeadLetterKind.MISSING_TEXT
    assert '"text"' in result.reason


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (b'{"text": 5}', '"text" is a JSON number'),
        (b'{"text": null}', '"text" is a JSON null'),
        (b'{"text": ["a"]}', '"text" is a JSON array'),
        (b'{"text": "ok", "id": true}', '"id" is a JSON boolean'),
        (b'{"text": "ok", "id": 1.5}', '"id" is a JSON number'),
        (b'{"text": "ok", "id": {"a": 1}}', '"id" is a JSON object'),
    ],
)
def test_wrong_type(value: bytes, field: str) -> None:
    result = failure(value)
    assert result.kind is DeadLetterKind.WRONG_TYPE
    assert result.reason.startswith(field)


@pytest.mark.parametrize("text", ["", " ", "\n\t\u3000"])
def test_empty_text(text: str) -> None:
    assert failure(json.dumps({"text": text}).encode()).kind is DeadLetterKind.EMPTY_TEXT
    if text:
        assert failure(text.encode(), input_format="text").kind is DeadLetterKind.EMPTY_TEXT


INVISIBLE_TEXTS = [
    "\u0000",  # NUL (Cc)
    "\u200b",  # zero-width space (Cf)
    "\u200b\u200c\u200d\u2060\ufeff",  # zero-width non-joiner, joiner, word joiner, BOM (Cf)
    "\u00ad\u200e\u200f",  # soft hyphen, direction marks (Cf)
    " \u00a0\u2028\u2029\u0085\x1f",  # no-break space (Zs), line and paragraph separators, NEL, US
]


@pytest.mark.parametrize("text", INVISIBLE_TEXTS)
def test_text_without_a_visible_character_is_empty_text(text: str) -> None:
    """Before: a text of only "\u0000" or "\u200b" was labelled."""
    result = failure(json.dumps({"text": text}).encode())
    assert result.kind is DeadLetterKind.EMPTY_TEXT
    assert "no visible character" in result.reason and "zero-width" in result.reason
    assert failure(text.encode(), input_format="text").kind is DeadLetterKind.EMPTY_TEXT


@pytest.mark.parametrize("text", ["\u200b好\u200b", "\u0000x", "\u0301", "\ue000", "\u3164"])
def test_one_visible_character_is_enough_and_the_text_is_kept_exactly(text: str) -> None:
    """A combining mark, a private-use or an unassigned-looking character shows something: labelled."""
    assert ok(json.dumps({"text": text}).encode()).text == text


@pytest.mark.parametrize(
    "number", ["1e999", "-1e999", "1E400", "1e-999", "-2.5e-400", "1" + "0" * 400 + ".0"]
)
def test_a_number_a_float_cannot_hold_is_refused_not_changed(number: str) -> None:
    """Before: 1e999 in a metadata field became infinity, written as null in the result."""
    for value in (f'{{"text": "ok", "m": {number}}}', f'{{"text": "ok", "m": {{"n": [{number}]}}}}'):
        result = failure(value.encode(), max_value_bytes=100_000)
        assert result.kind is DeadLetterKind.INVALID_JSON
        shown = number if len(number) <= 40 else number[:37] + "..."
        assert f"the number {shown}, which a 64-bit float cannot hold" in result.reason
        assert "send it as a string" in result.reason


@pytest.mark.parametrize("number", ["0.0e-999", "-0.0", "0e5", "1.7976931348623157e308", "5e-324", "0.1"])
def test_numbers_a_float_holds_are_kept(number: str) -> None:
    assert ok(f'{{"text": "ok", "m": {number}}}'.encode()).metadata == {"m": float(number)}


@pytest.mark.parametrize("field", ["id", "m"])
def test_an_integer_too_long_to_convert_says_to_send_it_as_a_string(field: str) -> None:
    """Before: the reason told the producer to call sys.set_int_max_str_digits()."""
    value = f'{{"text": "ok", "{field}": {"9" * 4301}}}'.encode()
    result = failure(value, max_value_bytes=100_000)
    assert result.kind is DeadLetterKind.INVALID_JSON
    assert result.reason == "JSON holds an integer of more than 4,300 digits: send it as a string"
    assert ok(f'{{"text": "ok", "{field}": {"9" * 4300}}}'.encode()).text == "ok"


def test_text_too_long_counts_characters_not_bytes() -> None:
    assert (
        ok(json.dumps({"text": "好" * 10}, ensure_ascii=False).encode(), max_text_chars=10).text == "好" * 10
    )
    result = failure(json.dumps({"text": "好" * 11}, ensure_ascii=False).encode(), max_text_chars=10)
    assert result.kind is DeadLetterKind.TEXT_TOO_LONG
    assert "11 characters" in result.reason and "limit of 10" in result.reason
    assert (
        failure(("好" * 11).encode(), input_format="text", max_text_chars=10).kind
        is DeadLetterKind.TEXT_TOO_LONG
    )


def test_nested_too_deep_in_metadata() -> None:
    value = b'{"text": "ok", "m": ' + b"[" * 8 + b"]" * 8 + b"}"  # depth 9 with the top-level object
    result = failure(value, max_json_depth=8)
    assert result.kind is DeadLetterKind.INVALID_JSON
    assert "nested more than 8 levels" in result.reason
    assert ok(value, max_json_depth=9).metadata == {"m": [[[[[[[[]]]]]]]]}


def test_a_wide_document_at_the_depth_limit_is_not_too_deep() -> None:
    # More brackets than levels allowed, so the depth walk runs; no branch goes past level 3.
    value = b'{"text": "ok", "a": [1], "b": [2], "c": {"d": [3]}, "e": [4]}'
    assert ok(value, max_json_depth=3).metadata == {"a": [1], "b": [2], "c": {"d": [3]}, "e": [4]}


def test_objects_and_arrays_in_turn_count_every_level() -> None:
    value = b'{"text": "ok", "m": [{"n": [1]}]}'  # 4 levels: object, array, object, array
    assert failure(value, max_json_depth=3).kind is DeadLetterKind.INVALID_JSON
    assert ok(value, max_json_depth=4).metadata == {"m": [{"n": [1]}]}


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    assert ok(b'{"text": "[[[[[[[[[[{{{{{{{{{{"}', max_json_depth=1).text == "[[[[[[[[[[{{{{{{{{{{"


@pytest.mark.parametrize("opener", [b"[", b'{"a":'])
def test_pathologically_deep_json_fails_cleanly(opener: bytes) -> None:
    """100,000 levels must not raise RecursionError: the depth is checked before the JSON is parsed."""
    value = opener * 100_000
    result = failure(value, max_value_bytes=10_000_000, max_json_depth=64)
    assert result.kind is DeadLetterKind.INVALID_JSON
    assert "nested more than 64 levels" in result.reason


def test_deep_but_closed_non_object_is_not_an_object() -> None:
    value = b"[" * 500 + b"]" * 500
    assert failure(value, max_value_bytes=10_000, max_json_depth=64).kind is DeadLetterKind.NOT_AN_OBJECT


@pytest.mark.parametrize("input_format", ["xml", "avro"])  # sorting after "json" and before it
def test_unknown_input_format_is_a_programming_error(input_format: str) -> None:
    with pytest.raises(ValueError, match="input_format"):
        decode(b'{"text": "x"}', input_format=input_format)  # type: ignore[arg-type]


# --- agreement with the published contract -----------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        {"text": "好"},
        {"text": "好", "id": 7, "x": {"y": [1]}},
        {"text": "好", "id": "7"},
        {"text": "好", "id": None},
        {"text": "好", "id": True},
        {"text": "好", "id": 2.0},
        {"text": 1},
        {"text": ""},
        {"text": " \t"},
        {"id": "1"},
    ],
)
def test_decode_agrees_with_review_input_schema(payload: dict[str, Any]) -> None:
    """Anything the schema accepts, decode accepts with the same id/text/metadata, and vice versa."""
    value = json.dumps(payload).encode()
    result = decode(value, max_text_chars=10_000, max_json_depth=64)
    try:
        model = ReviewInput.model_validate_json(value)
    except ValidationError:
        assert isinstance(result, DecodeFailure), result
        return
    assert result == Review(id=model.id or DEFAULT_ID, text=model.text, metadata=model.metadata)


# --- the fields named by the settings -----------------------------------------------------------------


def test_text_and_id_are_read_from_the_fields_the_settings_name() -> None:
    s = WorkerSettings(text_field="content", id_field="review_id").sections
    options = DecodeOptions.from_settings(s.registry, s.limits)
    value = '{"review_id": 17, "content": "很好吃", "shop": "s1", "text": "not the review"}'.encode()

    review = decode_review(
        value,
        input_format=options.input_format,
        max_value_bytes=options.max_value_bytes,
        max_text_chars=options.max_text_chars,
        max_json_depth=options.max_json_depth,
        default_id=DEFAULT_ID,
        text_field=options.text_field,
        id_field=options.id_field,
    )

    assert review == Review(id="17", text="很好吃", metadata={"shop": "s1", "text": "not the review"})
    missing = decode_review(
        b'{"text": "x"}',
        input_format="json",
        max_value_bytes=100,
        max_text_chars=100,
        max_json_depth=8,
        default_id=DEFAULT_ID,
        text_field="content",
    )
    assert isinstance(missing, DecodeFailure) and missing.kind is DeadLetterKind.MISSING_TEXT
    assert 'no "content" field' in missing.reason and '{"content": "..."}' in missing.reason


def test_the_text_and_id_fields_must_differ() -> None:
    with pytest.raises(ValidationError, match="name two fields"):
        WorkerSettings(text_field="body", id_field="body")
