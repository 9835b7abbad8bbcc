"""validate_body, the one validation of a `POST /v1/sentiment` body: the items of a valid request, or the
status, error and reason of its refusal; hostile JSON is refused as malformed, never raised."""

from __future__ import annotations

import json

import pytest

from schemas import DeadLetterKind
from worker.config import WorkerSettings
from worker.http.validation import Refusal, RequestItem, RequestLimits, validate_body

LIMITS = RequestLimits(max_texts=3, max_text_chars=10)


def refusal(body: bytes) -> Refusal:
    answer = validate_body(body, LIMITS)
    assert isinstance(answer, Refusal), answer
    return answer


def pairs(body: bytes) -> list[tuple[str, str]]:
    answer = validate_body(body, LIMITS)
    assert not isinstance(answer, Refusal), answer
    assert all(item.problem is None for item in answer), answer
    return [(item.id, item.text) for item in answer]


def test_items_in_request_order_with_ids_or_positions() -> None:
    assert pairs(b'{"text": "ok", "id": 42}') == [("42", "ok")]
    assert pairs(b'{"text": "ok"}') == [("0", "ok")]
    assert pairs('{"texts": ["好", "差"], "ids": ["b", 7]}'.encode()) == [("b", "好"), ("7", "差")]
    assert pairs(b'{"texts": ["a", "b", "c"]}') == [("0", "a"), ("1", "b"), ("2", "c")]


def test_a_leading_byte_order_mark_is_ignored() -> None:
    assert pairs('\ufeff{"text": "ok"}'.encode()) == [("0", "ok")]


def test_the_longest_integer_id_python_converts_is_its_decimal_string() -> None:
    assert pairs(b'{"text": "ok", "id": ' + b"9" * 4300 + b"}") == [("9" * 4300, "ok")]


def test_an_escaped_surrogate_pair_is_one_character() -> None:
    assert pairs(b'{"text": "ok", "id": "\\ud83d\\ude00"}') == [("\U0001f600", "ok")]


def test_a_bad_text_in_a_list_gets_its_own_problem_and_the_others_are_kept() -> None:
    body = json.dumps({"texts": ["好", "  ", "\u200b", "elevenchars", ""], "ids": ["a", "b", "c", "d", "e"]})

    answer = validate_body(body.encode(), RequestLimits(max_texts=5, max_text_chars=10))

    assert not isinstance(answer, Refusal), answer
    assert [(item.id, item.problem.kind if item.problem else None) for item in answer] == [
        ("a", None),
        ("b", DeadLetterKind.EMPTY_TEXT),
        ("c", DeadLetterKind.EMPTY_TEXT),
        ("d", DeadLetterKind.TEXT_TOO_LONG),
        ("e", DeadLetterKind.EMPTY_TEXT),
    ]
    assert answer[0] == RequestItem("a", "好")
    assert (
        answer[3].problem is not None
        and "11 characters, more than the limit of 10" in answer[3].problem.reason
    )


@pytest.mark.parametrize(
    ("body", "status", "error", "reason"),
    [
        (b"", 422, "invalid_request", 'the body is empty: send {"text": "..."}'),
        (b'{"text": "ok"', 422, "invalid_request", "malformed JSON: EOF while parsing"),
        (b'{"text": "\xff"}', 422, "invalid_request", "malformed JSON: invalid unicode code point"),
        (b"{}", 422, "invalid_request", "give either `text` (one review) or `texts`"),
        (b'{"text": "  "}', 422, "invalid_request", "text: text is empty or has no visible character"),
        (b'{"text": "\\u200b"}', 422, "invalid_request", "text: text is empty or has no visible character"),
        (b'{"texts": ["ok", 3]}', 422, "invalid_request", "texts.1: Input should be a valid string"),
        (b'{"text": "ok", "extra": 1}', 422, "invalid_request", "extra: Extra inputs are not permitted"),
        (b'{"text": "ok", "ids": ["a"]}', 422, "invalid_request", "`ids` goes with `texts`"),
        (b'["ok"]', 422, "invalid_request", "Input should be an object"),
        (b'{"texts": ["a", "b", "c", "d"]}', 413, "too_many_texts", "4 texts; at most 3"),
        (
            b'{"text": "elevenchars"}',
            422,
            "text_too_long",
            "text: text is 11 characters, more than the limit of 10",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_refusal_has_its_status_error_and_reason(
    body: bytes, status: int, error: str, reason: str
) -> None:
    answer = refusal(body)
    assert (answer.status, answer.error) == (status, error)
    assert reason in answer.reason, answer.reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        # json.loads raised RecursionError (a bare 500) at about 990 levels inside the server.
        (b'{"text": "ok", "m": ' + b"[" * 990 + b"]" * 990 + b"}", "recursion limit exceeded"),
        (b"[" * 100_000, "recursion limit exceeded"),
        (b'{"text": "ok", "m": ' + b'{"a": ' * 990 + b"1" + b"}" * 990 + b"}", "recursion limit exceeded"),
        # int(...) of more than 4,300 digits raised ValueError.
        (b'{"text": "ok", "id": ' + b"9" * 4301 + b"}", "number out of range"),
        (b'{"texts": ["ok"], "ids": [-' + b"9" * 5000 + b"]}", "number out of range"),
        # An unpaired surrogate passed validation in `id`, then its answer could not be encoded.
        (b'{"text": "ok", "id": "\\ud800"}', "hex escape"),
        (b'{"texts": ["ok"], "ids": ["x\\udc00"]}', "surrogate"),
        (b'{"text": "ok\\ud800\\u0041"}', "surrogate"),
    ],
    ids=[
        "deep-array",
        "100k-open",
        "deep-object",
        "long-id",
        "long-ids",
        "high-surrogate",
        "low",
        "unpaired",
    ],
)
def test_hostile_json_is_malformed_json_with_what_to_change(body: bytes, reason: str) -> None:
    answer = refusal(body)
    assert (answer.status, answer.error) == (422, "invalid_request")
    assert answer.reason.startswith("malformed JSON: ") and reason in answer.reason, answer.reason
    hint = answer.reason.split("; ", 1)[1]  # what to change, after pydantic's words
    assert hint.startswith(("nested too deeply: send {", "send an id this long as a string", "a \\uXXXX"))


def test_a_raw_surrogate_in_utf8_is_not_utf8() -> None:
    body = b'{"text": "ok", "id": "\xed\xa0\x80"}'  # "\ud800" encoded as if it were a character
    assert "malformed JSON: invalid unicode code point" in refusal(body).reason


def test_at_most_five_problems_are_listed() -> None:
    body = json.dumps({"texts": [1, 2, 3, 4, 5, 6, 7]}).encode()
    assert refusal(body).reason.count("Input should be a valid string") == 5


def test_limits_come_from_the_settings() -> None:
    settings = WorkerSettings(http_max_texts=7, max_text_chars=99)
    s = settings.sections
    assert RequestLimits.from_settings(s.http, s.limits) == RequestLimits(max_texts=7, max_text_chars=99)
