"""A team's own Avro schema: `produce --format avro` maps the file's columns to the schema's fields by name
(`--map COLUMN=FIELD`; `--text-field`/`--id-field` name the schema's fields), says which columns it drops
and which worker settings read the values; `tail` shows what such a value holds."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cli import cli

pytestmark = pytest.mark.integration

SHOP_SCHEMA = {
    "type": "record",
    "name": "ShopReview",
    "namespace": "shop",
    "fields": [
        {"name": "review_id", "type": "string"},
        {"name": "content", "type": "string"},
        {"name": "shop", "type": ["null", "string"], "default": None},
    ],
}
CSV = "评论ID,评论内容,店铺,评分\nC001,外送很快，饭菜还是热的,川味小馆,5\nC002,太咸了,面馆,2\n"


def test_own_avro_schema_by_column_with_dropped_columns_and_worker_settings_named(
    kafka_bootstrap: str,
    create_topics: Any,
    unique_name: Callable[[str], str],
    schema_registry_url: str,
    tmp_path: Path,
) -> None:
    topic = create_topics(unique_name("own-avro"), partitions=1)[0]
    schema = tmp_path / "review_shop.avsc"
    schema.write_text(json.dumps(SHOP_SCHEMA), encoding="utf-8")
    path = tmp_path / "shop.csv"
    path.write_bytes(CSV.encode("gb18030"))
    env = {
        "SENTIMENT_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "SENTIMENT_INPUT_TOPIC": topic,
        "SENTIMENT_SCHEMA_REGISTRY_URL": schema_registry_url,
    }
    avro = ["produce", str(path), "--format", "avro", "--schema", str(schema)]
    unmapped = cli(*avro, "--text-field", "content", "--id-field", "review_id", env=env)
    assert unmapped.returncode == 2
    assert "no `content` column (found: 评论ID, 评论内容, 店铺, 评分)" in unmapped.stderr, unmapped.stderr

    mapped = ["--map", "评论ID=review_id", "--map", "评论内容=content", "--map", "店铺=shop"]
    produced = cli(*avro, *mapped, "--text-field", "content", "--id-field", "review_id", env=env)
    assert produced.returncode == 0, produced.stderr
    assert "read 2, sent 2, skipped 0, failed 0" in produced.stdout
    assert "note: 评分 is not a field of review_shop.avsc: not sent" in produced.stderr
    assert "run it with SENTIMENT_TEXT_FIELD=content SENTIMENT_ID_FIELD=review_id" in produced.stderr

    shown = cli("tail", "--topic", topic, "--idle-exit-s", "3", env=env)
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [r["metadata"] for r in rows] == [
        {"review_id": "C001", "content": "外送很快，饭菜还是热的", "shop": "川味小馆"},
        {"review_id": "C002", "content": "太咸了", "shop": "面馆"},
    ]
    told = {**env, "SENTIMENT_TEXT_FIELD": "content", "SENTIMENT_ID_FIELD": "review_id"}
    rows = [
        json.loads(line)
        for line in cli("tail", "--topic", topic, "--idle-exit-s", "3", env=told).stdout.splitlines()
    ]
    assert [(r["kind"], r["id"], r["text"], r["metadata"]) for r in rows] == [
        ("review", "C001", "外送很快，饭菜还是热的", {"shop": "川味小馆"}),
        ("review", "C002", "太咸了", {"shop": "面馆"}),
    ]

    missing = {**SHOP_SCHEMA, "fields": [*SHOP_SCHEMA["fields"], {"name": "stars", "type": "int"}]}  # type: ignore[list-item]
    schema.write_text(json.dumps({**missing, "name": "ShopReview2"}), encoding="utf-8")
    other = create_topics(unique_name("own-avro"), partitions=1)[0]
    refused = cli(
        *avro,
        *mapped,
        "--text-field",
        "content",
        "--id-field",
        "review_id",
        env={**env, "SENTIMENT_INPUT_TOPIC": other},
    )
    assert refused.returncode == 2
    assert "the schema's fields: review_id, content, shop, stars" in refused.stderr, refused.stderr
    assert "--map COLUMN=FIELD" in refused.stderr
