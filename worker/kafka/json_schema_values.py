"""JSON Schema values of one writer's schema, parsed and validated within the limits.

The payload is parsed by the JSON door's rules (`decode.parse_json`: numbers kept exactly or refused, NaN
and infinities refused, depth measured from the bytes before parsing). jsonschema validates recursively,
about 2 frames per keyword applied, and without a bound on its work; so the schema is analysed once:
- its `$ref`s must resolve inside it (a pointer, an anchor or an `$id` of its own), and the longest chain of
  keywords that apply to the same value (`$ref`, `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else`,
  `dependentSchemas`) must be finite (a `$ref` loop that never descends recurses forever) and short;
- a value is validated only when its depth times that chain stays within `VALIDATION_FRAMES`, and each
  validation may apply at most `10,000 + 8 per payload byte` keywords (an `anyOf` over a recursive `$ref`
  can take time exponential in the depth); `uniqueItems` is checked in n log n, not jsonschema's n².
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final
from urllib.parse import unquote, urljoin

import jsonschema
from jsonschema.validators import Draft202012Validator, extend, validator_for

from schemas.review_decode import JsonRefusal, json_depth, parse_json
from worker.kafka.registry_limits import (
    MAX_REF_CHAIN,
    SchemaRefused,
    ValueRefused,
    reason_of,
    schema_document,
)
from worker.kafka.wire_format import HEADER_BYTES

VALIDATION_FRAMES: Final = 400
"""Frames validation may recurse: about 2 per keyword on the path from the top to the deepest value."""
_FREE_STEPS: Final = 10_000
_STEPS_PER_BYTE: Final = 8

_IN_PLACE_ONE: Final = ("not", "if", "then", "else")
_IN_PLACE_LISTS: Final = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAPS: Final = ("dependentSchemas", "dependencies")
_REFS: Final = ("$ref", "$dynamicRef", "$recursiveRef")
_DESCEND_ONE: Final = (
    "additionalProperties",
    "additionalItems",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "items",
)
_DESCEND_LISTS: Final = ("items", "prefixItems")
_DESCEND_MAPS: Final = ("properties", "patternProperties", "$defs", "definitions")
# (applies to the same value, keywords holding one subschema, a list of them, a map of them)
_SUBSCHEMA_KEYWORDS: Final = (
    (True, _IN_PLACE_ONE, _IN_PLACE_LISTS, _IN_PLACE_MAPS),
    (False, _DESCEND_ONE, _DESCEND_LISTS, _DESCEND_MAPS),
)


class JsonSchemaValues:
    """Reads the values of one JSON Schema (`schema_str`, as the registry holds it): parsed, at most
    `max_depth` levels, validated. Raises `SchemaRefused` when the schema cannot be used."""

    def __init__(self, schema_str: str, *, max_depth: int) -> None:
        document = schema_document(schema_str, "JSON Schema")
        self._chain = _longest_chain(document)
        base = validator_for(document, default=Draft202012Validator)
        try:
            base.check_schema(document)
        except jsonschema.SchemaError as exc:
            raise SchemaRefused(f"not a valid JSON Schema ({exc.message[:300]})") from None
        self._steps_left = 0
        keywords = {name: self._counted(keyword) for name, keyword in base.VALIDATORS.items()}
        keywords["uniqueItems"] = self._counted(_unique_items)
        self._validator = extend(base, keywords)(document)
        self._max_depth = max_depth

    def read(self, value: bytes) -> Any:
        """The value (header included) parsed and validated. Raises `ValueRefused`, UnicodeDecodeError
        or `jsonschema.ValidationError`."""
        payload = value[HEADER_BYTES:]
        document = parse_json(payload, self._max_depth)
        if isinstance(document, JsonRefusal):
            raise ValueRefused(document.reason)
        if _frames(payload.count(b"{") + payload.count(b"["), self._chain) > VALIDATION_FRAMES:
            depth = json_depth(payload)
            if _frames(depth, self._chain) > VALIDATION_FRAMES:
                raise ValueRefused(
                    f"the value is nested {depth} levels deep and its schema's $ref/allOf/anyOf chains are "
                    f"{self._chain} long: validating it would recurse too deep (depth x chain at most about "
                    f"{VALIDATION_FRAMES // 2}): send flatter values or simplify the schema"
                )
        self._steps_left = _FREE_STEPS + _STEPS_PER_BYTE * len(payload)
        error = next(self._validator.iter_errors(document), None)
        if error is not None:
            raise error
        return document

    def _counted(self, keyword: Callable[..., Any]) -> Callable[..., Any]:
        def counted(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
            self._steps_left -= 1
            if self._steps_left < 0:
                raise ValueRefused(
                    "validating the value against its schema takes more than 10,000 + 8 per byte keyword "
                    "steps (nested anyOf/oneOf over a recursive $ref): simplify the schema"
                )
            return keyword(validator, value, instance, schema)

        return counted


def _frames(depth: int, chain: int) -> int:
    return 2 * (depth + 1) * (chain + 1)


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """`uniqueItems` by hashing each item's canonical form (jsonschema compares every pair of objects)."""
    if not unique or not validator.is_type(instance, "array"):
        return
    keys = [_canonical(item) for item in instance]
    if len(set(keys)) != len(keys):
        shown = repr(instance)
        shown = shown if len(shown) <= 200 else f"{shown[:197]}..."
        yield jsonschema.ValidationError(f"{shown} has non-unique elements")


def _canonical(item: Any) -> Any:
    """A hashable form equal for items JSON Schema calls equal (1 and 1.0 alike, true and 1 not); recursion
    bounded by the value's depth, checked before."""
    if isinstance(item, bool):
        return ("bool", item)
    if isinstance(item, dict):
        return ("object", frozenset((key, _canonical(value)) for key, value in item.items()))
    if isinstance(item, list):
        return ("array", tuple(_canonical(value) for value in item))
    return ("value", item)


def _subschemas(node: dict[str, Any]) -> Iterator[tuple[Any, bool]]:
    """A schema's direct subschemas, each with True when it applies to the same value (in place)."""
    for same, ones, lists, maps in _SUBSCHEMA_KEYWORDS:
        for name in ones:
            if isinstance(node.get(name), (dict, bool)):
                yield node[name], same
        for name in lists:
            if isinstance(node.get(name), list):
                yield from ((item, same) for item in node[name])
        for name in maps:
            if isinstance(node.get(name), dict):
                yield from ((item, same) for item in node[name].values() if isinstance(item, (dict, bool)))


def _longest_chain(root: Any) -> int:
    """The most keywords that apply one after another to the same value (in place, `$ref`s followed),
    over the whole schema. Raises `SchemaRefused` for a `$ref` that does not resolve inside the schema, a
    loop of them, or a chain longer than `MAX_REF_CHAIN`. Iterative."""
    if not isinstance(root, dict):
        return 0
    nodes, anchors = _collect(root)
    in_place: dict[int, list[dict[str, Any]]] = {}

    def targets(node: dict[str, Any]) -> list[dict[str, Any]]:
        found = in_place.get(id(node))
        if found is None:
            found = [child for child, same in _subschemas(node) if same and isinstance(child, dict)]
            refs = (_resolve(node[name], root, anchors) for name in _REFS if isinstance(node.get(name), str))
            found.extend(target for target in refs if target is not None)
            in_place[id(node)] = found
        return found

    longest: dict[int, int] = {}
    for start in nodes.values():
        on_path: set[int] = set()
        stack: list[tuple[dict[str, Any], bool]] = [(start, False)]
        while stack:
            node, done = stack.pop()
            key = id(node)
            if done:
                on_path.discard(key)
                longest[key] = max((longest[id(t)] + 1 for t in targets(node)), default=0)
                if longest[key] > MAX_REF_CHAIN:
                    raise SchemaRefused(
                        f"its $ref/allOf/anyOf/oneOf/not chains are more than {MAX_REF_CHAIN} long: "
                        "simplify it"
                    )
                continue
            if key in longest:
                continue
            on_path.add(key)
            stack.append((node, True))
            for target in targets(node):
                if id(target) in on_path:
                    raise SchemaRefused(
                        "its $ref/allOf/anyOf/oneOf chain loops back to itself without descending into the "
                        "value (validation would recurse forever): break the loop"
                    )
                if id(target) not in longest:
                    stack.append((target, False))
    return max(longest.values(), default=0)


def _collect(root: dict[str, Any]) -> tuple[dict[int, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every object subschema (by id) and every name a `$ref` may use for one: `$anchor`/`$dynamicAnchor`
    as "#name", `$id`/`id` as written."""
    nodes: dict[int, dict[str, Any]] = {}
    anchors: dict[str, dict[str, Any]] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in nodes:
            continue
        nodes[id(node)] = node
        for name in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(name), str):
                anchors[f"#{node[name]}"] = node
        for name in ("$id", "id"):
            if isinstance(node.get(name), str) and node is not root:
                anchors[node[name].rstrip("#")] = node
                anchors[urljoin(_root_id(root), node[name]).rstrip("#")] = node
        stack.extend(child for child, _ in _subschemas(node) if isinstance(child, dict))
    return nodes, anchors


def _resolve(ref: str, root: dict[str, Any], anchors: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The object subschema `ref` names inside the schema; None for a boolean schema."""
    base, _, fragment = ref.partition("#")
    node: Any = root
    if base:  # a URI: the schema's own `$id`, or one of its subschemas' (relative to the schema's)
        root_id = _root_id(root)
        absolute = urljoin(root_id, base)
        if root_id and absolute == root_id:
            node = root
        elif base in anchors or absolute in anchors:
            node = anchors.get(base, anchors.get(absolute))
        else:
            raise SchemaRefused(
                f"its $ref {ref[:100]!r} points outside the schema: register it self-contained "
                "(schemas with references are not read)"
            )
    if fragment and not fragment.startswith("/"):
        node = anchors.get(f"#{fragment}")
    else:
        for part in fragment.split("/")[1:]:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            try:
                node = node[int(part)] if isinstance(node, list) else node[part]
            except (KeyError, IndexError, ValueError, TypeError):
                node = None
                break
    if not isinstance(node, dict):
        if isinstance(node, bool):
            return None
        raise SchemaRefused(f"its $ref {ref[:100]!r} does not resolve inside the schema")
    return node


def _root_id(root: dict[str, Any]) -> str:
    given = root.get("$id", root.get("id"))
    return given.rstrip("#") if isinstance(given, str) else ""


def schema_error_reason(exc: BaseException) -> str:
    """A validation error as words for a dead letter's reason."""
    if isinstance(exc, jsonschema.ValidationError):
        path = "/".join(str(part) for part in exc.absolute_path)
        return f"at /{path}: {exc.message[:300]}" if path else exc.message[:300]
    return reason_of(exc)
