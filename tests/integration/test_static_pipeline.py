"""train (tiny) → export → worker with backend=static on the real broker: N inputs → N results, labels
(and probabilities, within 1e-4) equal to the dynamic model's; long reviews with long_text=chunk."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from schemas.sentiment_result import SentimentResult
from tests.integration.helpers import assert_partition_order, make_settings, run_worker, sample_reviews
from tests.integration.kafka_io import produce, read_topic, results_of, review_records
from worker.cli import main
from worker.labelling.loading import load_model
from worker.model.static_backend import StaticClassifier

pytestmark = pytest.mark.integration

LONG_REVIEWS = [
    "包装很好，发货也快。"
    + "说明书写得很详细，" * 12
    + "但是用了三天就坏了，客服不理人，非常失望，不推荐购买！",
    "刚开始觉得一般。" + "后来慢慢发现这个东西做工精细，" * 10 + "总之非常满意，物超所值，五星好评！",
    "房间很大，" * 30 + "早餐难吃，隔音太差，晚上根本睡不着。",
]


@pytest.fixture(scope="module")
def exported_by_cli(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("static") / "model"
    assert main(["export", "--model", str(tiny_model_dir), "--output-dir", str(out)]) == 0
    return out


def _reviews(n: int) -> list[dict[str, Any]]:
    reviews = sample_reviews(n)
    for i, text in enumerate(LONG_REVIEWS):
        reviews[i * 7]["text"] = text  # spread over partitions
    return reviews


def _label_on_the_broker(
    bootstrap: str, names: dict[str, str], model_dir: Path, reviews: list[dict[str, Any]], **extra: Any
) -> tuple[Any, Any, list[Any]]:
    """Produces `reviews`, loads the exported model as the worker would (CPU, settings `extra`) and runs the
    worker over them: the classifier, its model ref and the results, checked to be one per review (no dead
    letters) in each partition's input order."""
    produce(bootstrap, names["reviews"], review_records(reviews))
    settings = make_settings(bootstrap, names, model=str(model_dir), device="cpu", **extra)
    classifier, model_ref, _ = load_model(settings.sections.model, settings.sections.batching)
    assert isinstance(classifier, StaticClassifier)

    summary = run_worker(settings, classifier, max_messages=len(reviews))

    n = len(reviews)
    assert (summary.consumed, summary.results, summary.dead_letters) == (n, n, 0)
    out = read_topic(bootstrap, names["results"], expected=n)
    assert_partition_order(out)
    return classifier, model_ref, out


def test_static_worker_labels_like_the_dynamic_model(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any, exported_by_cli: Path
) -> None:
    reviews = _reviews(75)
    classifier, model_ref, out = _label_on_the_broker(
        kafka_bootstrap,
        topics(),
        exported_by_cli,
        reviews,
        backend="static",
        cpu_threads=2,
        max_batch_size=8,
        max_window_messages=30,
    )

    assert (model_ref.name, model_ref.version) == (tiny_classifier.name, tiny_classifier.version)
    results = results_of(out)
    assert sorted(r["id"] for r in results) == sorted(r["id"] for r in reviews)  # each id exactly once
    by_id = {r["id"]: r for r in results}
    dynamic = tiny_classifier.predict_texts([r["text"] for r in reviews])
    for review, probs in zip(reviews, dynamic, strict=True):
        got = by_id[review["id"]]
        SentimentResult.model_validate(got)
        assert got["label"] == tiny_classifier.labels[int(np.argmax(probs))]
        static_probs = [got["probabilities"][label] for label in tiny_classifier.labels]
        np.testing.assert_allclose(static_probs, probs, atol=1e-4)
        assert got["model"] == {"name": tiny_classifier.name, "version": tiny_classifier.version}


def test_static_worker_with_chunked_long_reviews(
    kafka_bootstrap: str, topics: Any, exported_by_cli: Path
) -> None:
    reviews = _reviews(30)
    # backend=auto on an exported directory: static
    classifier, _, out = _label_on_the_broker(
        kafka_bootstrap,
        topics(input_partitions=2, output_partitions=2),
        exported_by_cli,
        reviews,
        long_text="chunk",
        chunk_stride_tokens=20,
        max_batch_size=4,
        max_window_messages=12,
    )

    assert classifier.long_text == "chunk" and len(reviews) == 30
    chunks = classifier.token_id_chunks([r["text"] for r in reviews])
    assert sorted(i for i, c in enumerate(chunks) if len(c) > 1) == [0, 7, 14]  # the long ones
    by_id = {r["id"]: r for r in results_of(out)}
    assert len(by_id) == 30
    for review, per_text in zip(reviews, chunks, strict=True):
        expected = classifier.predict_ids(per_text).mean(axis=0)  # the windows' average
        got = [by_id[review["id"]]["probabilities"][label] for label in classifier.labels]
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_predict_command_uses_the_static_backend_and_long_text(
    exported_by_cli: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ["物流很快，质量很好", "太差了，退货", LONG_REVIEWS[0], "一般般"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    argv = ["predict", "--model", str(exported_by_cli), "--device", "cpu", "--long-text", "chunk"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["line"] for row in rows] == [1, 2, 3, 4]
    settings = make_settings("unused:9092", {k: k for k in ("reviews", "results", "dlq", "group")})
    chunked = settings.model_copy(update={"model": str(exported_by_cli), "long_text": "chunk"}).sections
    classifier, _, _ = load_model(chunked.model, chunked.batching)
    expected = classifier.predict_texts(lines[:3])
    for row, probs in zip(rows[:3], expected, strict=True):
        assert row["label"] == classifier.labels[int(np.argmax(probs))]
        assert row["confidence"] == pytest.approx(float(np.max(probs)), abs=1e-5)
