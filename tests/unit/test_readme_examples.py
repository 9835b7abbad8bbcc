"""The README's result and HTTP examples are what `make readme-examples` (docs/readme_examples.py) writes:
valid against their schemas with every field, consistent with the README's input example and curl request,
and naming the shipped model as models/default/sentiment_model.json names it (read here, at test time: the
model may be replaced). No model is loaded: the generator runs the real one, this test checks its output."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.http_api import SentimentResponse
from schemas.sentiment_result import SentimentResult
from tests.kafka_fixtures import load_script
from worker.model.metadata import ModelMetadata

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SHIPPED = ModelMetadata.read(ROOT / "models" / "default" / "sentiment_model.json")
STALE_HINT = "run `make readme-examples`"


gen = load_script("readme_examples", ROOT / "docs" / "readme_examples.py")


def test_the_result_example_is_the_workers_result_for_the_input_example() -> None:
    body = gen.block(README, gen.RESULT_MARKER)
    example = json.loads(body)
    result = SentimentResult.model_validate(example)
    assert result.model_dump(mode="json") == example  # every field of the schema, and nothing else
    assert (result.model.name, result.model.version) == (SHIPPED.name, SHIPPED.version), STALE_HINT
    assert list(result.probabilities) == SHIPPED.labels
    assert result.label == SHIPPED.labels[result.label_id]
    assert result.confidence == max(result.probabilities.values())
    given = json.loads(gen.block(README, gen.INPUT_MARKER))
    passed_through = {k: v for k, v in given.items() if k not in ("id", "text")}
    assert result.id == given["id"] and result.metadata == passed_through
    assert result.source.model_dump() == {
        "topic": gen.SOURCE.topic,
        "partition": gen.SOURCE.partition,
        "offset": gen.SOURCE.offset,
        "timestamp_ms": gen.SOURCE.timestamp_ms,
    }
    assert body == gen.pack(example) + "\n", STALE_HINT  # as the generator writes it, not edited by hand


def test_the_http_example_is_serves_answer_to_the_curl_command() -> None:
    body = gen.block(README, gen.HTTP_MARKER)
    example = gen.http_response_json(body)
    response = SentimentResponse.model_validate(example)
    assert response.model_dump(mode="json") == example
    assert (response.model.name, response.model.version) == (SHIPPED.name, SHIPPED.version), STALE_HINT
    assert [r.id for r in response.results] == gen.HTTP_REQUEST["ids"]
    for item in response.results:
        assert item.error is None and item.probabilities is not None and item.label_id is not None
        assert list(item.probabilities) == SHIPPED.labels and item.label == SHIPPED.labels[item.label_id]
    assert response.timing.batch_texts >= len(gen.HTTP_REQUEST["texts"])
    assert body == gen.http_block(example), STALE_HINT  # the curl command is the request that was sent


def test_the_packer_keeps_the_json_and_the_line_width() -> None:
    value = {"a": "x" * 60, "b": [{"c": "y" * 70, "d": list(range(30))}, {"e": None}], "f": {"g": 1.5}}
    packed = gen.pack(value)
    assert json.loads(packed) == value
    assert max(len(line) for line in packed.splitlines()) <= gen.WIDTH
    assert len(packed.splitlines()) > 1
