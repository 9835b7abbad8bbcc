"""The limits of the registry formats: what a schema may be before it is parsed, and the one rule that turns a
decoded Avro / JSON Schema / Protobuf value into the plain JSON values a result carries (bounded depth, no
NaN or infinity). Nothing here recurses: a value or schema nested 5,000 levels deep is measured and refused
iteratively, so it never meets Python's recursion limit or a C parser's stack.

A schema past these limits makes its values `invalid_schema` dead letters (`SchemaRefused`); a value past
them is an `invalid_payload` dead letter (`ValueRefused`). docs/schema-registry.md states the numbers.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import math
import uuid
from typing import Any, Final

from schemas.review_decode import JsonRefusal, non_finite_reason, parse_json
from worker.errors import OperationError

MAX_SCHEMA_CHARS: Final = 1_048_576
"""Characters of a schema (Avro or JSON Schema document, `.proto` text); the registry's answer may be up
to 4 times as many bytes (escaped)."""
MAX_SCHEMA_DEPTH: Final = 64
"""Nesting levels of an Avro or JSON Schema document as JSON (about 20 levels of records, 30 of objects).
Parsing a schema recurses once or a few times per level: 64 keeps it far below the recursion limit."""
MAX_VALUE_DEPTH: Final = 64
"""The registry formats' cap on `max_json_depth` (levels of records, maps, arrays and messages, the top
level counting as 1): their decoders recurse per level, 3 to 4 frames each."""
MAX_REF_CHAIN: Final = 16
"""JSON Schema: steps of `$ref`, `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else` one after another
without descending into the value."""


class SchemaRefused(OperationError, ValueError):
    """A schema its values cannot be read with: not valid, or past the limits. `str()` is the reason,
    naming what to change in the schema; its values become `invalid_schema` dead letters."""


class ValueRefused(OperationError, ValueError):
    """A value past the limits (nested too deep, NaN or an infinity, an array of millions of nothing, too
    costly to validate); `str()` is the reason. It becomes an `invalid_payload` dead letter."""


def value_depth(max_json_depth: int) -> int:
    """The depth limit of registry values: the JSON door's `max_json_depth`, at most `MAX_VALUE_DEPTH`."""
    return min(max_json_depth, MAX_VALUE_DEPTH)


def schema_document(schema_str: str, what: str) -> Any:
    """An Avro or JSON Schema schema's text as a JSON document, size and depth checked before it is parsed
    (`what` names it in the reason: "Avro schema", "JSON Schema"). Raises `SchemaRefused`."""
    if len(schema_str) > MAX_SCHEMA_CHARS:
        raise SchemaRefused(
            f"the {what} is {len(schema_str):,} characters, more than {MAX_SCHEMA_CHARS:,}: split it"
        )
    try:
        document = parse_json(schema_str.encode("utf-8", "surrogatepass"), MAX_SCHEMA_DEPTH)
    except UnicodeDecodeError:
        raise SchemaRefused(f"the {what} holds an unpaired surrogate") from None
    if isinstance(document, JsonRefusal):
        reason = document.reason.replace("JSON is nested", "it is nested").partition(": send")[0]
        raise SchemaRefused(f"the {what} is not JSON the worker reads ({reason})")
    return document


def plain_json(value: Any, max_depth: int) -> Any:
    """A decoded value as plain JSON values, for a result's metadata: bytes as base64 text, decimals, UUIDs
    and dates as their text, tuples and sets as lists, keys as strings. Walked with a stack, not recursion;
    raises `ValueRefused` for a value nested more than `max_depth` levels (dicts and lists; the top level is
    1) or holding NaN or an infinity (the one number rule of every door, `non_finite_reason`)."""
    if type(value) is dict:  # the usual record: strings, integers, finite floats, nothing nested
        for item in value.values():
            kind = type(item)
            if kind not in _FLAT and not (kind is float and item - item == 0.0):  # inf - inf is NaN
                break
        else:
            return {str(key): item for key, item in value.items()}
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 1)]
    while stack:
        item, parent, key, depth = stack.pop()
        kind = type(item)
        if kind in _FLAT:
            parent[key] = item
        elif kind is float:
            if not math.isfinite(item):
                raise ValueRefused(non_finite_reason(_NON_FINITE_NAMES.get(str(item), str(item))))
            parent[key] = item
        elif isinstance(item, dict):
            if depth > max_depth:
                raise ValueRefused(_too_deep(max_depth))
            out = dict.fromkeys(str(name) for name in item)
            parent[key] = out
            stack.extend((child, out, str(name), depth + 1) for name, child in item.items())
        elif isinstance(item, (list, tuple, set, frozenset)):
            if depth > max_depth:
                raise ValueRefused(_too_deep(max_depth))
            items = list(item)
            out_list: list[Any] = [None] * len(items)
            parent[key] = out_list
            stack.extend((child, out_list, index, depth + 1) for index, child in enumerate(items))
        else:
            parent[key] = _as_text(item)
    return root[0]


_FLAT: Final = frozenset({str, int, bool, type(None)})
_NON_FINITE_NAMES: Final = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}  # as JSON input writes them


def _as_text(item: Any) -> Any:
    if isinstance(item, float):  # a float subclass
        return plain_json(float(item), 1)
    if isinstance(item, (str, int)):
        return item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(item)).decode("ascii")
    if isinstance(item, (datetime.datetime, datetime.date, datetime.time)):
        return item.isoformat()
    if isinstance(item, (decimal.Decimal, uuid.UUID)):
        return str(item)
    return str(item)


def _too_deep(max_depth: int) -> str:
    return (
        f"the value is nested more than {max_depth} levels deep (records, maps, arrays and messages; "
        "SENTIMENT_MAX_JSON_DEPTH, at most 64 for registry formats): send flatter metadata"
    )


def reason_of(exc: BaseException, limit: int = 300) -> str:
    """An exception as a reason's words: its type and message, shortened."""
    text = str(exc).strip()
    text = text if len(text) <= limit else f"{text[: limit - 3]}..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
