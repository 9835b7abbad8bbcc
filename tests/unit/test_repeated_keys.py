"""One rule for a key repeated in a JSON object, at both doors (Kafka JSON input, `POST /v1/sentiment`): the
last value wins, at every level, as Python's `json` and pydantic's parser both read it (docs/http-api.md).
The rule was the same at both doors before; issue 50 asked that it be said and kept: this pins it."""

from __future__ import annotations

import pytest

from schemas.review_decode import decode_review
from schemas.review_input import Review
from worker.http.validation import Refusal, RequestLimits, validate_body

LIMITS = RequestLimits(max_texts=8, max_text_chars=100)
ESCAPED = b'{"id": "a", "text": "\\u0074ext", "\\u0074ext": "last"}'  # an escaped key is the same key


def kafka(value: bytes) -> Review:
    decoded = decode_review(
        value, input_format="json", max_value_bytes=4096, max_text_chars=100, max_json_depth=8, default_id="d"
    )
    assert isinstance(decoded, Review), decoded
    return decoded


@pytest.mark.parametrize(
    ("value", "text", "review_id"),
    [
        (b'{"text": "first", "text": "last"}', "last", None),
        (b'{"text": "t", "id": "first", "id": "last"}', "t", "last"),
        (b'{"text": "t", "id": 1, "id": 2}', "t", "2"),
        (ESCAPED, "last", "a"),
    ],
)
def test_the_last_value_of_a_repeated_key_is_the_one_read_at_both_doors(
    value: bytes, text: str, review_id: str | None
) -> None:
    review = kafka(value)
    assert (review.text, review.id) == (text, review_id or "d")
    items = validate_body(value, LIMITS)
    assert not isinstance(items, Refusal)
    assert [(item.text, item.id) for item in items] == [(text, review_id or "0")]


def test_a_repeated_list_or_metadata_key_keeps_its_last_value() -> None:
    items = validate_body(b'{"texts": ["a", "b"], "texts": ["c"], "ids": ["x"]}', LIMITS)
    assert not isinstance(items, Refusal) and [(i.id, i.text) for i in items] == [("x", "c")]
    review = kafka(b'{"text": "t", "shop": "s1", "meta": {"k": 1, "k": 2}, "shop": "s2"}')
    assert review.metadata == {"shop": "s2", "meta": {"k": 2}}
