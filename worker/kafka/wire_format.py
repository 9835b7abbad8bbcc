"""The Schema Registry wire format's header: magic byte 0, then the schema id as 4 bytes big-endian.

Pure functions, no registry: what a value's header says, what a failure to decode one means for it.
"""

from __future__ import annotations

import struct
from typing import Final

MAGIC_BYTE: Final = 0
HEADER_BYTES: Final = 5
_HEADER: Final = struct.Struct(">bI")


def schema_id_of(value: bytes) -> int | None:
    """The schema id in `value`'s header, or None when `value` does not start with the wire format's header
    (too short to hold one and a payload, or a first byte other than 0)."""
    if len(value) <= HEADER_BYTES or value[0] != MAGIC_BYTE:
        return None
    return int(_HEADER.unpack_from(value)[1])


def wire_header(schema_id: int) -> bytes:
    """The 5 bytes that start a value written with schema `schema_id`."""
    return _HEADER.pack(MAGIC_BYTE, schema_id)


def not_wire_format_reason(value: bytes, input_format: str) -> str:
    """Why `value` (for which `schema_id_of` said None) is not in the wire format, and what to do."""
    fix = (
        f"produce it with a Schema Registry {input_format} serializer, or set SENTIMENT_INPUT_FORMAT "
        "to what the topic holds (json, text)"
    )
    if len(value) <= HEADER_BYTES:
        return (
            f"value is {len(value)} bytes, too short for the wire format (magic byte 0, a 4-byte schema id, "
            f"then the {input_format} payload): {fix}"
        )
    return f"value starts with byte {value[0]:#04x}, not the wire format's magic byte 0x00: {fix}"
