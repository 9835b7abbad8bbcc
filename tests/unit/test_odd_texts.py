"""The one rule for odd texts (`schemas.review_input.text_problem`) costs at most the limit: a text over
`max_text_chars` is refused by its length alone, and the visible-character scan skips runs of invisible
characters in C and stops at the first visible one. Work is counted (characters looked at in Python), never
timed."""

from __future__ import annotations

import sys
import unicodedata
from types import SimpleNamespace
from typing import Any

import pytest

import schemas.review_input as review_input
from schemas.dead_letter import DeadLetterKind
from schemas.review_decode import DecodeFailure, decode_review
from schemas.review_input import has_visible_character, text_problem
from worker.http.validation import Refusal, RequestLimits, validate_body

MB = 1_048_576


class Unreadable(str):
    """A text whose characters must not be looked at: iterating or indexing it fails the test."""

    def __iter__(self) -> Any:
        raise AssertionError("the text was scanned")

    def __getitem__(self, key: Any) -> Any:
        raise AssertionError("the text was scanned")


@pytest.fixture
def looked_at(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The characters `has_visible_character` classifies in Python (one `unicodedata.category` call each)."""
    seen: list[str] = []

    def category(char: str) -> str:
        seen.append(char)
        return unicodedata.category(char)

    monkeypatch.setattr(review_input, "unicodedata", SimpleNamespace(category=category))
    return seen


@pytest.mark.parametrize("fill", [" ", "\u200b", "\x00"])
def test_a_text_over_the_limit_is_too_long_without_being_read(fill: str) -> None:
    """Before: the whole text was scanned for a visible character first (86 ms for 1 MB of spaces and an
    `x`), and a long blank text was `empty_text`."""
    problem = text_problem(Unreadable(fill * 1_000_000 + "x"), 10_000)
    assert problem is not None and problem.kind is DeadLetterKind.TEXT_TOO_LONG
    blank = text_problem(fill * 10_001, 10_000)
    assert blank is not None and blank.kind is DeadLetterKind.TEXT_TOO_LONG


@pytest.mark.parametrize("fill", [" ", "\u200b", "\u3000\ufeff\u2060", "\x00\x1f\u00ad"])
def test_the_scan_skips_invisible_runs_in_c_and_stops_at_the_first_visible(
    fill: str, looked_at: list[str]
) -> None:
    """Before: one Python-level look per character (10,000 for 9,999 spaces and an `x`)."""
    text = (fill * 10_000)[:9_999] + "x" + "\u200b" * 5_000
    assert text_problem(text, 20_000) is None
    assert looked_at == ["x"]
    looked_at.clear()
    problem = text_problem((fill * 10_000)[:10_000], 10_000)
    assert problem is not None and problem.kind is DeadLetterKind.EMPTY_TEXT
    assert looked_at == []


def test_a_character_the_run_does_not_know_is_still_classified(looked_at: list[str]) -> None:
    """The run's class is Unicode 14's; an invisible character outside it is looked at and skipped."""
    assert not has_visible_character("\u200b\U000e0001")  # in the class: not looked at
    assert looked_at == []
    assert has_visible_character("\u200b\u0301")  # a combining mark shows something
    assert looked_at == ["\u0301"]


def test_the_run_is_exactly_the_invisible_categories_of_this_python() -> None:
    invisible = review_input._INVISIBLE
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        in_run = review_input._INVISIBLE_RUN.fullmatch(char) is not None
        assert in_run == (unicodedata.category(char) in invisible), f"U+{code:04X}"


def test_both_doors_refuse_a_1_mb_hostile_text_by_its_length(looked_at: list[str]) -> None:
    """The Kafka value and the HTTP body of issue 50: 1 MB of spaces then `x`, over the 10,000 limit."""
    value = b'{"text": "' + b" " * (MB - 16) + b'x"}'
    decoded = decode_review(
        value,
        input_format="json",
        max_value_bytes=MB,
        max_text_chars=10_000,
        max_json_depth=32,
        default_id="t",
    )
    assert isinstance(decoded, DecodeFailure) and decoded.kind is DeadLetterKind.TEXT_TOO_LONG
    body = b'{"texts": ["' + b" " * (MB - 32) + b'x", "ok"]}'
    items = validate_body(body, RequestLimits(max_texts=256, max_text_chars=10_000))
    assert not isinstance(items, Refusal)
    kinds = [item.problem.kind if item.problem else None for item in items]
    assert kinds == [DeadLetterKind.TEXT_TOO_LONG, None]
    assert looked_at == ["o"]
