"""A review input's bytes → a validated review, or the reason it cannot be labelled: the one decoding of the
review input contract (`review_input`) that the front doors share (a Kafka value, a JSONL line of a review
file); a Kafka input refused here goes to the dead-letter topic.

Runs once per consumed record, so it is written for speed: plain checks instead of pydantic validation
(the rules match `schemas.ReviewInput`; a unit test keeps the two in agreement) and a depth scan that only
runs when the value could possibly be nested too deeply. It never raises on bad input.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final, Literal

from schemas.dead_letter import DeadLetterKind
from schemas.review_input import Review, text_problem

InputFormat = Literal["json", "text"]

_EXAMPLE: Final = 'send UTF-8 encoded JSON like {"text": "..."}'
_BOM: Final = "\ufeff"


@dataclass(frozen=True, slots=True)
class DecodeFailure:
    """Why a record cannot be labelled: the dead-letter kind and a reason telling the producer what to fix."""

    kind: DeadLetterKind
    reason: str


class _NonStandardConstantError(ValueError):
    pass


class _NumberOutOfRangeError(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NonStandardConstantError(name)


def non_finite_reason(number: str) -> str:
    """The one rule for NaN and the infinities, at every door (JSON, Avro, JSON Schema, Protobuf): a value
    holding one is refused, never changed. A JSON result cannot carry them, and writing null or a string
    instead would change the producer's value. `number` as the input wrote it (NaN, Infinity, nan, inf)."""
    return (
        f"{number} is not a JSON value: NaN and infinities are refused, never changed; use null or a string"
    )


def _float_in_range(literal: str) -> float:
    """A JSON number with a fraction or exponent as a float, unless a 64-bit float cannot hold it: `1e999`
    would become infinity (written as null in the result) and `1e-999` zero; those are refused instead."""
    value = float(literal)
    if math.isinf(value) or (value == 0.0 and literal.lower().partition("e")[0].strip("-+0.")):
        raise _NumberOutOfRangeError(literal)
    return value


# Stateless and reused: json.loads(..., parse_constant=...) would build a new decoder per call.
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_float_in_range)


def _type_name(value: object) -> str:
    """JSON name of a decoded value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _depth_exceeds(document: Any, max_depth: int) -> bool:
    """True if `document` nests arrays/objects more than `max_depth` levels (iterative, early exit)."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


_JSON_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEP: Final = [1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256)]


def json_depth(raw: bytes) -> int:
    """How many levels of arrays/objects the JSON text `raw` nests (the top-level object counting as 1),
    read from the bytes without parsing them: strings dropped, the brackets left counted up and down. Linear,
    iterative and C-speed (a regex, a translate, an accumulate), so a 5,000-level value is measured before
    anything walks it recursively. Brackets of an invalid text count as they stand."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0)


def _has_lone_surrogate(document: Any) -> bool:
    """True if any string (key or value) in `document` cannot be encoded as UTF-8."""
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def decode_review(
    value: bytes | None,
    *,
    input_format: InputFormat,
    max_value_bytes: int,
    max_text_chars: int,
    max_json_depth: int,
    default_id: str,
    text_field: str = "text",
    id_field: str = "id",
) -> Review | DecodeFailure:
    """Decode one record value.

    `input_format="json"`: a UTF-8 JSON object with a string `text`, an optional string or integer `id`
    (integers become decimal strings; absent or null means `default_id`) and any other fields, returned as
    `metadata`; the text and id are read from the fields named `text_field` and `id_field`.
    `input_format="text"`: the whole value is the text, the id is `default_id`, metadata is empty. Limits:
    `max_value_bytes` (bytes of the raw value), `max_text_chars` (characters of the text), `max_json_depth`
    (nesting levels of arrays/objects, the top-level object counting as 1; documents deeper than the
    interpreter's recursion limit, about 1,000, always fail the same way). A leading UTF-8 byte order mark is
    ignored. The text is returned exactly as given, or refused by the one rule for odd texts
    (`schemas.review_input.text_problem`: no visible character is `empty_text`, over `max_text_chars` is
    `text_too_long`). Values are kept exactly or refused, never changed: a number a 64-bit float cannot hold
    (`1e999`, `1e-999`) or an integer of more digits than the interpreter converts (4,300) is `invalid_json`.
    A key repeated in an object keeps its last value, at every level, as at the HTTP door.
    """
    if value is None:
        return DecodeFailure(
            DeadLetterKind.EMPTY_VALUE, f"value is null (a tombstone): {_EXAMPLE}; use a non-null value"
        )
    n_bytes = len(value)
    if n_bytes == 0:
        return DecodeFailure(DeadLetterKind.EMPTY_VALUE, f"value is empty (0 bytes): {_EXAMPLE}")
    if n_bytes > max_value_bytes:
        return DecodeFailure(
            DeadLetterKind.VALUE_TOO_LARGE,
            f"value is {n_bytes} bytes, more than the limit of {max_value_bytes} bytes: "
            "send shorter reviews (split long ones)",
        )
    try:
        decoded = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return DecodeFailure(
            DeadLetterKind.INVALID_UTF8,
            f"value is not valid UTF-8 at byte {exc.start}: {_EXAMPLE}",
        )
    if decoded.startswith(_BOM):
        decoded = decoded[1:]

    if input_format == "text":
        return checked_review(decoded, max_text_chars, default_id, {})
    if input_format != "json":
        raise ValueError(f"unknown input_format {input_format!r}; expected 'json' or 'text'")
    return _decode_json(value, decoded, max_text_chars, max_json_depth, default_id, text_field, id_field)


def _decode_json(
    raw: bytes,
    decoded: str,
    max_text_chars: int,
    max_json_depth: int,
    default_id: str,
    text_field: str,
    id_field: str,
) -> Review | DecodeFailure:
    document = _parsed(decoded)
    if isinstance(document, _JsonProblem):
        return DecodeFailure(DeadLetterKind.INVALID_JSON, document.reason or _too_deep(max_json_depth))

    if not isinstance(document, dict):
        return DecodeFailure(
            DeadLetterKind.NOT_AN_OBJECT,
            f"value is a JSON {_type_name(document)}, not an object: {_EXAMPLE}",
        )
    # Depth can only exceed the limit if there are more opening brackets than levels allowed: counting
    # bytes is C-speed and almost always lets us skip the walk.
    if (raw.count(b"{") + raw.count(b"[") > max_json_depth) and _depth_exceeds(document, max_json_depth):
        return DecodeFailure(DeadLetterKind.INVALID_JSON, _too_deep(max_json_depth))

    if _has_lone_surrogate_escape(raw, document):
        return DecodeFailure(DeadLetterKind.INVALID_JSON, _LONE_SURROGATE)

    if text_field not in document:
        return DecodeFailure(
            DeadLetterKind.MISSING_TEXT,
            f"JSON object has no {json.dumps(text_field)} field: {_example(text_field)}",
        )
    text = document.pop(text_field)
    if not isinstance(text, str):
        return DecodeFailure(
            DeadLetterKind.WRONG_TYPE,
            f"{json.dumps(text_field)} is a JSON {_type_name(text)}, expected a string: "
            + _example(text_field),
        )
    raw_id = document.pop(id_field, None)
    review_id = review_id_of(raw_id, default_id, id_field, lambda value: f"a JSON {_type_name(value)}")
    if isinstance(review_id, DecodeFailure):
        return review_id
    return checked_review(text, max_text_chars, review_id, document)


def review_id_of(
    raw_id: Any, default_id: str, id_field: str, described: Callable[[Any], str]
) -> str | DecodeFailure:
    """The one id rule of every input format: a string as it is, an integer as its decimal string, absent or
    null `default_id`; anything else is `wrong_type` (`described(value)` names its type in the reason)."""
    if raw_id is None:
        return default_id
    if isinstance(raw_id, str):
        return raw_id
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        return str(raw_id)
    return DecodeFailure(
        DeadLetterKind.WRONG_TYPE,
        f"{json.dumps(id_field)} is {described(raw_id)}, expected a string or an integer (or leave it out)",
    )


def checked_review(
    text: str, max_text_chars: int, review_id: str, metadata: dict[str, Any]
) -> Review | DecodeFailure:
    """The review, or its failure by the one rule for odd texts (`text_problem`), for every input format."""
    problem = text_problem(text, max_text_chars)
    if problem is None:
        return Review(id=review_id, text=text, metadata=metadata)
    fix = "send the review text" if problem.kind is DeadLetterKind.EMPTY_TEXT else "split long reviews"
    return DecodeFailure(problem.kind, f"{problem.reason}: {fix}")


def _example(text_field: str) -> str:
    return (
        _EXAMPLE
        if text_field == "text"
        else f'send UTF-8 encoded JSON like {{{json.dumps(text_field)}: "..."}}'
    )


def _shortened(literal: str, limit: int = 40) -> str:
    return literal if len(literal) <= limit else f"{literal[: limit - 3]}..."


def _too_deep(max_json_depth: int) -> str:
    return f"JSON is nested more than {max_json_depth} levels deep: {_EXAMPLE} with flat metadata"


_LONE_SURROGATE: Final = (
    "JSON contains an unpaired surrogate escape (\\ud800-\\udfff) that is not valid Unicode: "
    f"{_EXAMPLE} with valid characters"
)


@dataclass(frozen=True, slots=True)
class _JsonProblem:
    reason: str  # empty: nested deeper than the interpreter parses (the caller names its limit)


def _parsed(text: str) -> Any:
    """`text` parsed by the JSON door's rules, or the `_JsonProblem` saying why not: numbers kept exactly or
    refused (NaN and infinities by `non_finite_reason`, a float out of range, an integer too long)."""
    try:
        return _DECODER.decode(text)
    except RecursionError:
        return _JsonProblem("")
    except _NonStandardConstantError as exc:
        return _JsonProblem(f"value is not valid JSON ({non_finite_reason(str(exc))}): {_EXAMPLE}")
    except _NumberOutOfRangeError as exc:
        number = _shortened(str(exc))
        return _JsonProblem(
            f"JSON holds the number {number}, which a 64-bit float cannot hold (it would become "
            f'infinity or 0): send it as a string ("{number}") to have it kept exactly'
        )
    except json.JSONDecodeError as exc:
        return _JsonProblem(f"value is not valid JSON ({exc}): {_EXAMPLE}")
    except ValueError:  # the decoder's one other error: an integer literal too long to convert
        return _JsonProblem(
            f"JSON holds an integer of more than {sys.get_int_max_str_digits():,} digits: send it as a string"
        )


def _has_lone_surrogate_escape(raw: bytes, document: Any) -> bool:
    # An unpaired \ud800-\udfff escape parses fine but cannot be encoded to UTF-8 for the result; such
    # escapes are rare, so only then pay for a full check.
    return (b"\\ud" in raw or b"\\uD" in raw) and _has_lone_surrogate(document)


@dataclass(frozen=True, slots=True)
class JsonRefusal:
    """Why a JSON payload is refused by the JSON door's rules: the reason in words."""

    reason: str


def parse_json(raw: bytes, max_depth: int) -> Any:
    """A JSON payload of another door (a JSON Schema value) by the JSON door's rules: UTF-8, numbers kept
    exactly or refused, no unpaired surrogate, at most `max_depth` levels; or the `JsonRefusal` saying why
    not. The depth is measured from the bytes (`json_depth`) before anything is parsed, so no recursion ever
    meets a deeper value. Raises UnicodeDecodeError for bytes that are not UTF-8."""
    text = raw.decode("utf-8")
    if raw.count(b"{") + raw.count(b"[") > max_depth and json_depth(raw) > max_depth:
        return JsonRefusal(_too_deep(max_depth))
    document = _parsed(text)
    if isinstance(document, _JsonProblem):
        return JsonRefusal(document.reason or _too_deep(max_depth))
    if _has_lone_surrogate_escape(raw, document):
        return JsonRefusal(_LONE_SURROGATE)
    return document
