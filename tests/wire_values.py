"""Hand-made pieces of registry-format values for tests: Protobuf's base-128 varints, Avro's zig-zag ones,
and the recursive Avro schema the depth limits are tested with."""

from __future__ import annotations

from typing import Any

NODE_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Node",
    "fields": [
        {"name": "text", "type": "string"},
        {"name": "child", "type": ["null", "Node"], "default": None},
    ],
}


def varint(number: int) -> bytes:
    """`number` (>= 0) as a base-128 varint, least significant group first."""
    out = bytearray()
    while True:
        byte, number = number & 0x7F, number >> 7
        if not number:
            return bytes([*out, byte])
        out.append(byte | 0x80)


def zigzag(number: int) -> bytes:
    """`number` as Avro writes an int or long: zig-zag, then a varint."""
    return varint((number << 1) ^ (number >> 63))
