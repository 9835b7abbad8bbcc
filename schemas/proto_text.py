"""A `.proto` file's text → its `FileDescriptorProto`, for the Protobuf schemas a registry holds as text.

Registries keep Protobuf schemas as `.proto` text (Confluent's API returns the serialized descriptor only on
request, and not every registry can); Python has no parser for that text without `protoc`. This one reads
the part of proto2/proto3 that message schemas use: `syntax`, `package`, `option` (skipped), messages
(nested), enums, scalar / message / enum fields, `repeated`, `optional`, `map<K, V>`, `oneof`, `reserved`.
`import` and `extend` are refused with a ValueError naming them: a schema with references needs them
resolved first. Bounded: at most `MAX_NESTING` levels of nested declarations (messages, oneofs; the parser
recurses once per level) and `MAX_TEXT_CHARS` characters.
"""

from __future__ import annotations

import re
from typing import Final

from google.protobuf import descriptor_pb2

_F = descriptor_pb2.FieldDescriptorProto

MAX_NESTING: Final = 32
"""Levels of declarations nested in one another (a message in a message, a oneof in a message)."""
MAX_TEXT_CHARS: Final = 1_048_576

SCALARS: Final = {
    "double": _F.TYPE_DOUBLE,
    "float": _F.TYPE_FLOAT,
    "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64,
    "int32": _F.TYPE_INT32,
    "fixed64": _F.TYPE_FIXED64,
    "fixed32": _F.TYPE_FIXED32,
    "bool": _F.TYPE_BOOL,
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
    "uint32": _F.TYPE_UINT32,
    "sfixed32": _F.TYPE_SFIXED32,
    "sfixed64": _F.TYPE_SFIXED64,
    "sint32": _F.TYPE_SINT32,
    "sint64": _F.TYPE_SINT64,
}

_TOKEN: Final = re.compile(
    r'\s+|//[^\n]*|/\*.*?\*/|(?P<tok>"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|[A-Za-z_][\w.]*|\.[\w.]+|-?\d[\w.+-]*|[{}\[\]()<>=;,:-])',
    re.S,
)


def _tokens(text: str) -> list[str]:
    tokens, at = [], 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            raise ValueError(f".proto text: unexpected character {text[at]!r} at {at}")
        if match.group("tok") is not None:
            tokens.append(match.group("tok"))
        at = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self._tokens = _tokens(text)
        self._at = 0
        # Fields whose type is a name: resolved once every message and enum is known.
        self._pending: list[
            tuple[descriptor_pb2.FieldDescriptorProto, str, str]
        ] = []  # (field, written type name, scope)
        self._kinds: dict[str, int] = {}  # full name (".pkg.Msg") -> TYPE_MESSAGE / TYPE_ENUM
        self._nesting = 0

    def _peek(self) -> str | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _next(self) -> str:
        token = self._peek()
        if token is None:
            raise ValueError(".proto text ends too early")
        self._at += 1
        return token

    def _expect(self, token: str) -> None:
        got = self._next()
        if got != token:
            raise ValueError(f".proto text: expected {token!r}, found {got!r}")

    def _skip_statement(self) -> None:
        """Skips to the end of a statement (`;`) or past a balanced block."""
        depth = 0
        while True:
            token = self._next()
            if token == "{":
                depth += 1
            elif token == "}":
                depth -= 1
                if depth == 0:
                    return
            elif token == ";" and depth == 0:
                return

    def _skip_field_options(self) -> None:
        if self._peek() == "[":
            while self._next() != "]":
                pass

    def file(self) -> descriptor_pb2.FileDescriptorProto:
        file = descriptor_pb2.FileDescriptorProto(name="schema.proto", syntax="proto2")
        while self._peek() is not None:
            token = self._next()
            if token == "syntax":
                self._expect("=")
                file.syntax = self._next().strip("\"'")
                self._expect(";")
            elif token == "package":
                file.package = self._next()
                self._expect(";")
            elif token == "option":
                self._skip_statement()
            elif token == "message":
                self._message(file.message_type.add(), f".{file.package}" if file.package else "")
            elif token == "enum":
                self._enum(file.enum_type.add(), f".{file.package}" if file.package else "")
            elif token in ("import", "extend", "service"):
                if token == "service":
                    self._skip_statement()
                    continue
                raise ValueError(f".proto text uses `{token}`: schemas with references are not read here")
            elif token == ";":
                continue
            else:
                raise ValueError(f".proto text: unexpected {token!r} at the top level")
        self._resolve()
        return file

    def _enum(self, enum: descriptor_pb2.EnumDescriptorProto, scope: str) -> None:
        enum.name = self._next()
        self._kinds[f"{scope}.{enum.name}"] = _F.TYPE_ENUM
        self._expect("{")
        while (token := self._next()) != "}":
            if token in ("option", "reserved"):
                self._skip_statement()
            elif token == ";":
                continue
            else:
                self._expect("=")
                enum.value.add(name=token, number=int(self._next(), 0))
                self._skip_field_options()
                self._expect(";")

    def _message(self, message: descriptor_pb2.DescriptorProto, scope: str) -> None:
        message.name = self._next()
        full = f"{scope}.{message.name}"
        self._kinds[full] = _F.TYPE_MESSAGE
        self._expect("{")
        self._body(message, full, oneof=None)
        for field in message.field:  # as protoc does: each proto3 `optional` field in a oneof of its own
            if field.proto3_optional:
                message.oneof_decl.add(name=f"_{field.name}")
                field.oneof_index = len(message.oneof_decl) - 1

    def _body(self, message: descriptor_pb2.DescriptorProto, full: str, oneof: int | None) -> None:
        self._nesting += 1
        if self._nesting > MAX_NESTING:
            raise ValueError(
                f".proto text nests declarations more than {MAX_NESTING} levels deep: declare the messages "
                "side by side"
            )
        self._body_items(message, full, oneof)
        self._nesting -= 1

    def _body_items(self, message: descriptor_pb2.DescriptorProto, full: str, oneof: int | None) -> None:
        while (token := self._next()) != "}":
            if token in ("option", "reserved", "extensions", "extend"):
                self._skip_statement()
            elif token == ";":
                continue
            elif token == "message":
                self._message(message.nested_type.add(), full)
            elif token == "enum":
                self._enum(message.enum_type.add(), full)
            elif token == "oneof":
                message.oneof_decl.add(name=self._next())
                self._expect("{")
                self._body(message, full, oneof=len(message.oneof_decl) - 1)
            elif token == "map":
                self._map(message, full)
            else:
                self._field(message, full, token, oneof)

    def _field(
        self, message: descriptor_pb2.DescriptorProto, scope: str, token: str, oneof: int | None
    ) -> None:
        label, proto3_optional = _F.LABEL_OPTIONAL, False
        if token in ("repeated", "optional", "required"):
            label = {
                "repeated": _F.LABEL_REPEATED,
                "optional": _F.LABEL_OPTIONAL,
                "required": _F.LABEL_REQUIRED,
            }[token]
            proto3_optional = token == "optional"
            token = self._next()
        name = self._next()
        self._expect("=")
        number = int(self._next(), 0)
        self._skip_field_options()
        self._expect(";")
        field = message.field.add(name=name, number=number, label=label, json_name=_json_name(name))
        self._typed(field, token, scope)
        if oneof is not None:
            field.oneof_index = oneof
        elif proto3_optional:
            field.proto3_optional = True  # its synthetic oneof comes after the real ones (`_message`)

    def _map(self, message: descriptor_pb2.DescriptorProto, scope: str) -> None:
        self._expect("<")
        key_type = self._next()
        self._expect(",")
        value_type = self._next()
        self._expect(">")
        name = self._next()
        self._expect("=")
        number = int(self._next(), 0)
        self._skip_field_options()
        self._expect(";")
        entry_name = "".join(part[:1].upper() + part[1:] for part in name.split("_")) + "Entry"
        entry = message.nested_type.add(name=entry_name)
        entry.options.map_entry = True
        full_entry = f"{scope}.{entry_name}"
        self._kinds[full_entry] = _F.TYPE_MESSAGE
        key = entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL, json_name="key")
        self._typed(key, key_type, full_entry)
        value = entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL, json_name="value")
        self._typed(value, value_type, full_entry)
        field = message.field.add(
            name=name, number=number, label=_F.LABEL_REPEATED, json_name=_json_name(name)
        )
        field.type = _F.TYPE_MESSAGE
        field.type_name = full_entry

    def _typed(self, field: descriptor_pb2.FieldDescriptorProto, type_name: str, scope: str) -> None:
        if type_name in SCALARS:
            field.type = SCALARS[type_name]
        else:
            self._pending.append((field, type_name, scope))

    def _resolve(self) -> None:
        """Names resolve as protoc does: innermost scope first, then outwards; a leading dot is absolute."""
        for field, written, scope in self._pending:
            if written.startswith("."):
                candidates = [written]
            else:
                parts = scope.split(".")
                candidates = [".".join(parts[:i] + [written]) for i in range(len(parts), 0, -1)]
                candidates = [c if c.startswith(".") else f".{c}" for c in candidates]
            for candidate in candidates:
                kind = self._kinds.get(candidate)
                if kind is not None:
                    field.type = kind  # type: ignore[assignment]  # an int of the enum
                    field.type_name = candidate
                    break
            else:
                raise ValueError(
                    f".proto text: type {written!r} of field {field.name!r} is not defined in it"
                )


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def parse_proto(text: str, name: str = "schema.proto") -> descriptor_pb2.FileDescriptorProto:
    """The descriptor of the `.proto` file `text` (named `name` in it). Raises ValueError saying what it
    cannot read."""
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f".proto text is {len(text):,} characters, more than {MAX_TEXT_CHARS:,}: split it")
    file = _Parser(text).file()
    file.name = name
    return file
