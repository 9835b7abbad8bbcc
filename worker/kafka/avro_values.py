"""Avro values of one writer's schema, read within the limits.

fastavro reads a value in C, recursing once per nested record, array or map and never checking a limit: a
recursive record 5,000 levels deep ran the C stack out (SIGSEGV); an array of 2^60 nulls costs a 6-byte
value and loops forever; a 1 MB decimal took 197 s to convert. So the schema is looked at once: when none
of these can happen (no recursion, no deeper than the limit, no array of items that take no bytes, no
`bytes` decimal), fastavro reads the value straight away (the usual case: a record of strings and numbers).
Otherwise the value's bytes are first walked with a stack of our own, which refuses it before fastavro
reads it: deeper than the limit, more items than its bytes allow, a decimal of more than 128 bytes.
"""

from __future__ import annotations

import io
from typing import Any, Final

import fastavro

from worker.kafka.registry_limits import SchemaRefused, ValueRefused, reason_of, schema_document
from worker.kafka.wire_format import HEADER_BYTES

MAX_DECIMAL_BYTES: Final = 128
"""Bytes of one decimal (about 300 digits): converting a longer one costs time quadratic in its length."""
_FREE_ITEMS: Final = 1024  # array items beyond one per byte of the value (nulls, empty records)
_PRIMITIVES: Final = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_FIXED_WIDTH: Final = {"null": 0, "boolean": 1, "float": 4, "double": 8}
_RECORDS: Final = frozenset({"record", "error"})

# What a task on the walk's stack does (op, schema, depth, count).
_READ, _ARRAY_BLOCK, _MAP_BLOCK, _ARRAY_ITEMS, _MAP_ITEMS = range(5)


class AvroValues:
    """Reads the values of one Avro schema (`schema_str`, as the registry holds it) as Python values,
    refusing any nested more than `max_depth` levels. Raises `SchemaRefused` for a schema it cannot read."""

    def __init__(self, schema_str: str, *, max_depth: int) -> None:
        document = schema_document(schema_str, "Avro schema")
        self._named: dict[str, Any] = {}
        try:
            self._schema = fastavro.parse_schema(document, named_schemas=self._named)
        except Exception as exc:  # noqa: BLE001 - whatever fastavro says, the schema is at fault
            raise SchemaRefused(f"not a valid Avro schema ({reason_of(exc)})") from None
        self._max_depth = max_depth
        self._walk = _needs_walk(self._schema, self._named, max_depth)

    def read(self, value: bytes) -> Any:
        """The value (header included) as Python values. Raises `ValueRefused`, or what fastavro raises
        for bytes that do not fit the schema (EOFError, ValueError, ...)."""
        payload = value[HEADER_BYTES:]
        if self._walk:
            _check(payload, self._schema, self._named, self._max_depth)
        return fastavro.schemaless_reader(io.BytesIO(payload), self._schema, None)


def _resolve(node: Any, named: dict[str, Any]) -> Any:
    """A named type's reference (its full name, or a dict whose type is the name) → its definition."""
    if isinstance(node, str):
        return named.get(node, node)
    if isinstance(node, dict):
        inner = node.get("type")
        if isinstance(inner, (dict, list)) or (isinstance(inner, str) and inner in named):
            return _resolve(inner, named)  # at most two steps: a type's type is a definition or a name
    return node


def _children(node: Any) -> list[Any]:
    if isinstance(node, list):
        return node
    if not isinstance(node, dict):
        return []
    kind = node.get("type")
    if kind in _RECORDS:
        return [field["type"] for field in node.get("fields", [])]
    if kind == "array":
        return [node["items"]]
    if kind == "map":
        return [node["values"]]
    return []


def _needs_walk(schema: Any, named: dict[str, Any], max_depth: int) -> bool:
    """True unless every value of the schema is, by the schema alone, no deeper than `max_depth`, has no
    array of items that take no bytes, and no decimal longer than `MAX_DECIMAL_BYTES` (an iterative
    depth-first pass over the type graph; a type reached again on its own path is recursion)."""
    depth: dict[int, int] = {}  # a type's levels
    empty: dict[int, bool] = {}  # its values may take 0 bytes
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(_resolve(schema, named), False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = [_resolve(child, named) for child in _children(node)]
        if not done:
            if key in depth:
                continue
            on_path.add(key)
            stack.append((node, True))
            for child in children:
                if id(child) in on_path:
                    return True  # recursive: values as deep as their bytes allow
                if id(child) not in depth:
                    stack.append((child, False))
            continue
        on_path.discard(key)
        kind = node.get("type") if isinstance(node, dict) else node if isinstance(node, str) else "union"
        below = max((depth[id(child)] for child in children), default=0)
        depth[key] = below + (1 if kind in _RECORDS or kind in ("array", "map") else 0)
        empty[key] = _takes_no_bytes(node, kind, [empty[id(child)] for child in children])
        if _is_big_decimal(node, kind) or (kind == "array" and empty[id(children[0])]):
            return True
    return depth[id(_resolve(schema, named))] > max_depth


def _takes_no_bytes(node: Any, kind: Any, children_empty: list[bool]) -> bool:
    if kind in _RECORDS:
        return all(children_empty)
    if kind == "fixed":
        return bool(node.get("size", 1) == 0)
    return kind == "null"


def _is_big_decimal(node: Any, kind: Any) -> bool:
    if not isinstance(node, dict) or node.get("logicalType") != "decimal":
        return False
    return kind == "bytes" or (kind == "fixed" and node.get("size", 0) > MAX_DECIMAL_BYTES)


def _check(data: bytes, schema: Any, named: dict[str, Any], max_depth: int) -> None:
    """Walks an Avro value's bytes (iteratively) as fastavro would read them, refusing it when it nests
    more than `max_depth` levels, holds more array and map items than its bytes allow, or a decimal longer
    than `MAX_DECIMAL_BYTES`. Raises `ValueRefused`, or EOFError/ValueError for bytes that do not fit."""
    pos, items_left = 0, len(data) + _FREE_ITEMS
    stack: list[tuple[int, Any, int, int]] = [(_READ, schema, 1, 0)]
    while stack:
        op, node, depth, count = stack.pop()
        if op == _READ:
            pos = _read(data, pos, _resolve(node, named), depth, max_depth, stack)
            continue
        if op in (_ARRAY_ITEMS, _MAP_ITEMS):
            if count > 1:
                stack.append((op, node, depth, count - 1))
            if op == _MAP_ITEMS:
                pos = _skip_sized(data, pos)  # the key
            stack.append((_READ, node, depth, 0))
            continue
        count, pos = _long(data, pos)  # a block of an array or map: its item count, 0 at the end
        if count == 0:
            continue
        if count < 0:  # a negative count is followed by the block's size in bytes
            count = -count
            _, pos = _long(data, pos)
        items_left -= count
        if items_left < 0:
            raise ValueRefused(
                f"the value's arrays and maps hold more items than its {len(data):,} bytes can carry "
                "(items that take no bytes, such as nulls): send the items themselves"
            )
        stack.append((op, node, depth, 0))
        stack.append((_ARRAY_ITEMS if op == _ARRAY_BLOCK else _MAP_ITEMS, node, depth, count))


def _read(data: bytes, pos: int, node: Any, depth: int, max_depth: int, stack: list[Any]) -> int:
    """Reads (skips) one datum of type `node` at `pos`, pushing what it contains; returns the new `pos`."""
    if isinstance(node, list):  # a union: the branch's index, then the datum
        index, pos = _long(data, pos)
        if not 0 <= index < len(node):
            raise ValueError(f"union branch {index} of {len(node)}")
        stack.append((_READ, node[index], depth, 0))
        return pos
    kind = node.get("type") if isinstance(node, dict) else node
    if kind in _RECORDS or kind in ("array", "map"):
        if depth > max_depth:
            raise ValueRefused(
                f"the value is nested more than {max_depth} levels deep (records, maps, arrays; "
                "SENTIMENT_MAX_JSON_DEPTH, at most 64 for registry formats): send flatter records"
            )
        if kind == "array":
            stack.append((_ARRAY_BLOCK, node["items"], depth + 1, 0))
        elif kind == "map":
            stack.append((_MAP_BLOCK, node["values"], depth + 1, 0))
        else:
            stack.extend((_READ, field["type"], depth + 1, 0) for field in reversed(node["fields"]))
        return pos
    if kind in ("int", "long", "enum"):
        return _long(data, pos)[1]
    if kind in ("bytes", "string"):
        decimal = isinstance(node, dict) and node.get("logicalType") == "decimal"
        return _skip_sized(data, pos, MAX_DECIMAL_BYTES if decimal else None)
    if kind == "fixed":
        size = int(node["size"])
        if node.get("logicalType") == "decimal" and size > MAX_DECIMAL_BYTES:
            raise ValueRefused(_big_decimal(size))
        return _advanced(data, pos, size)
    if kind in _FIXED_WIDTH:
        return _advanced(data, pos, _FIXED_WIDTH[kind])
    raise ValueError(f"unknown Avro type {kind!r}")


def _long(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint (Avro int and long) at `pos`: its value and the position after it."""
    result, shift = 0, 0
    while True:
        if pos >= len(data):
            raise EOFError("the value ends inside a number")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def _skip_sized(data: bytes, pos: int, limit: int | None = None) -> int:
    size, pos = _long(data, pos)
    if size < 0:
        raise ValueError(f"a negative length {size}")
    if limit is not None and size > limit:
        raise ValueRefused(_big_decimal(size))
    return _advanced(data, pos, size)


def _advanced(data: bytes, pos: int, size: int) -> int:
    if pos + size > len(data):
        raise EOFError(f"the value ends before its {size} bytes at byte {pos}")
    return pos + size


def _big_decimal(size: int) -> str:
    return (
        f"the value holds a decimal of {size:,} bytes, more than {MAX_DECIMAL_BYTES} (about 300 digits): "
        "send it as a string"
    )
