"""`.proto` text → descriptor, checked by building message classes from it and round-tripping messages."""

from __future__ import annotations

import pytest
from google.protobuf import json_format
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass

from schemas.proto_text import parse_proto
from schemas.registry_schemas import protobuf_result_file

SHOP = """
// a comment
syntax = "proto3";
package shop.v1;
option java_package = "com.example.shop";

/* a block
   comment */
message Order {
  enum Status { STATUS_UNSPECIFIED = 0; PAID = 1 [deprecated = true]; }
  message Line { string sku = 1; int32 quantity = 2; }
  string id = 1;
  repeated Line lines = 2;
  map<string, double> prices = 3;
  Status status = 4;
  optional int64 placed_at_ms = 5;
  oneof payment { string card = 6; Customer.Wallet wallet = 7; }
  reserved 8, 9;
  bytes raw = 10 [json_name = "raw"];
}
message Customer {
  message Wallet { string provider = 1; }
  string name = 1;
}
"""


def _class(text: str, name: str) -> type:
    pool = DescriptorPool()
    pool.Add(parse_proto(text))
    return GetMessageClass(pool.FindMessageTypeByName(name))  # type: ignore[no-any-return]


def test_messages_nested_types_enums_maps_oneofs_and_optional_fields_round_trip() -> None:
    order_class = _class(SHOP, "shop.v1.Order")
    document = {
        "id": "o-1",
        "lines": [{"sku": "A", "quantity": 2}],
        "prices": {"A": 9.5},
        "status": "PAID",
        "placed_at_ms": "1700000000000",
        "wallet": {"provider": "pay"},
        "raw": "AAE=",
    }
    order = json_format.ParseDict(document, order_class())
    again = order_class.FromString(order.SerializeToString())
    assert json_format.MessageToDict(again, preserving_proto_field_name=True) == document
    assert again.HasField("placed_at_ms") and again.WhichOneof("payment") == "wallet"


def test_the_result_file_reads_as_the_results_messages() -> None:
    file = protobuf_result_file()
    assert file.package == "sentiment" and file.syntax == "proto3"
    result = file.message_type[0]
    assert [(f.name, f.number) for f in result.field][:3] == [
        ("schema_name", 1),
        ("schema_version", 2),
        ("id", 3),
    ]
    source = next(m for m in result.nested_type if m.name == "SourceRef")
    timestamp = next(f for f in source.field if f.name == "timestamp_ms")
    assert timestamp.proto3_optional


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('syntax = "proto3"; import "other.proto"; message A { Other o = 1; }', "import"),
        ('syntax = "proto3"; message A { Missing m = 1; }', "'Missing'"),
        ('syntax = "proto3"; message A { string a = 1 }', "expected ';'"),
        ('syntax = "proto3"; message A { string a = 1;', "ends too early"),
    ],
)
def test_what_it_cannot_read_is_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_proto(text)
