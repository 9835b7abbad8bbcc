"""`produce`'s registry formats: which one a --format / --schema pair means."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.errors import ConfigurationError
from worker.tools.registry_values import value_format


@pytest.mark.parametrize(
    ("declared", "schema", "fmt"),
    [
        ("auto", None, None),
        ("jsonl", None, None),
        ("avro", Path("r.avsc"), "avro"),
        ("auto", Path("r.avsc"), "avro"),
        ("csv", Path("r.json"), "json_schema"),
        ("auto", Path("r.proto"), "protobuf"),
        ("protobuf", Path("r.txt"), "protobuf"),
    ],
)
def test_the_values_format_comes_from_format_else_from_the_schema_files_name(
    declared: str, schema: Path | None, fmt: str | None
) -> None:
    assert value_format(declared, schema) == fmt


def test_a_registry_format_needs_a_schema_and_an_unknown_schema_file_a_format() -> None:
    with pytest.raises(ConfigurationError, match="--schema FILE"):
        value_format("avro", None)
    with pytest.raises(ConfigurationError, match="say which format"):
        value_format("auto", Path("review.yaml"))
