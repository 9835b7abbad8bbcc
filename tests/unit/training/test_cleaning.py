"""Label cleaning by cross-validated disagreement: the probe's arithmetic on synthetic features (pure logic),
and `train --clean-below` on the tiny pretrained model (which reviews were dropped, and that dev and test
were not touched)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from worker.training.cleaning import (
    FOLDS,
    clean,
    cross_validated_probabilities,
    fit_logistic,
    kept_by_earlier_cleaning,
)
from worker.training.options import CLEANING_FILE, TrainingError, TrainOptions
from worker.training.training import train


def two_clusters(n: int, flipped: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Unit-length features of two well-separated classes; the labels of `flipped` examples are wrong."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 2
    centers = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    features = centers[labels] + 0.15 * rng.standard_normal((n, 4))
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    wrong = sorted(int(i) for i in rng.choice(n, size=flipped, replace=False))
    noisy = labels.copy()
    noisy[wrong] = 1 - noisy[wrong]
    return features, noisy, wrong


def test_the_probe_separates_two_classes() -> None:
    features, labels, _ = two_clusters(200, flipped=0)
    w = fit_logistic(features, labels.astype(np.float64), l2=0.01)
    predicted = (np.hstack([features, np.ones((200, 1))]) @ w > 0).astype(int)
    assert (predicted == labels).all()


def test_exactly_the_wrong_labels_are_dropped() -> None:
    features, labels, wrong = two_clusters(400, flipped=12)
    result = clean(features, labels, num_labels=2, threshold=0.3, seed=42)
    assert result.dropped == wrong  # each wrong label is judged by probes that never saw it
    assert sorted(result.kept + result.dropped) == list(range(400))
    assert result.probe_accuracy == pytest.approx(1 - 12 / 400)
    assert result.summary() == {"threshold": 0.3, "folds": FOLDS, "dropped": 12, "kept": 388,
                                "probe_accuracy": 0.97}  # fmt: skip


def test_a_probe_never_sees_the_example_it_judges() -> None:
    # Without a held-back fold, a probe with a tiny penalty would fit a lone mislabelled point; cross-
    # validated, the point's own label gets a low probability.
    features, labels, wrong = two_clusters(100, flipped=1)
    probs = cross_validated_probabilities(features, labels, num_labels=2, seed=1)
    assert np.allclose(probs.sum(axis=1), 1.0)
    assert probs[wrong[0], labels[wrong[0]]] < 0.2
    same = cross_validated_probabilities(features, labels, num_labels=2, seed=1)
    assert np.array_equal(probs, same)  # the folds are a pure function of the seed


def test_too_few_examples_for_the_folds_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be cut into 5 folds"):
        cross_validated_probabilities(np.zeros((3, 2)), np.array([0, 1, 0]), num_labels=2, seed=0)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"clean_below": 1.0, "init": "some/model"}, "clean_below must be in"),
        ({"clean_below": 0.2}, "use it with a pretrained init"),  # init=scratch: no encoder to probe
    ],
)
def test_bad_clean_below_is_refused(tmp_path: Path, options: dict[str, object], reason: str) -> None:
    with pytest.raises(TrainingError, match=reason):
        TrainOptions(output_dir=tmp_path, **options).validate()  # type: ignore[arg-type]


def test_fine_tuning_with_clean_below_drops_train_reviews_only(tiny_model_dir: Path, tmp_path: Path) -> None:
    def options(name: str, clean_below: float = 0.0) -> TrainOptions:
        return TrainOptions(
            output_dir=tmp_path / name, init=str(tiny_model_dir), epochs=1, max_seq_len=64, device="cpu",
            batch_size=16, limit=300, split_seed=5, clean_below=clean_below,
        )  # fmt: skip

    lines: list[str] = []
    cleaned = train(options("cleaned", clean_below=0.5), lines.append)
    report = json.loads((tmp_path / "cleaned" / "label_cleaning.json").read_text(encoding="utf-8"))
    assert (
        report["dropped"] == len(report["dropped_reviews"]) >= 1
    )  # p < 0.5: every review the probe gets wrong
    assert report["kept"] + report["dropped"] == 240 and cleaned.train_size == report["kept"]
    assert (cleaned.dev_size, cleaned.test_size) == (30, 30)
    probabilities = [row["probability"] for row in report["dropped_reviews"]]
    assert probabilities == sorted(probabilities) and max(probabilities) < 0.5
    assert {row["label"] for row in report["dropped_reviews"]} <= {"negative", "positive"}
    assert any(f"dropped {report['dropped']} of 240 train reviews" in line for line in lines)
    card = (tmp_path / "cleaned" / "README.md").read_text(encoding="utf-8")
    assert "probability below 0.5 dropped before training (`label_cleaning.json`)" in card
    plain = train(options("plain"), lambda _: None)
    held_out = [
        (tmp_path / name / "heldout.jsonl").read_text(encoding="utf-8") for name in ("cleaned", "plain")
    ]
    assert held_out[0] == held_out[1] and plain.train_size == 240  # the same held-out reviews


def test_a_resumed_run_reads_the_cleaning_back_instead_of_embedding_again(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    common = {
        "init": str(tiny_model_dir), "epochs": 1, "max_seq_len": 64, "device": "cpu", "batch_size": 16,
        "limit": 300, "split_seed": 5, "clean_below": 0.5,
    }  # fmt: skip
    whole = train(TrainOptions(output_dir=tmp_path / "whole", **common), lambda _: None)  # type: ignore[arg-type]
    stopped = train(TrainOptions(output_dir=tmp_path / "cut", stop_after_steps=3, **common), lambda _: None)  # type: ignore[arg-type]
    assert stopped.interrupted
    written = json.loads((tmp_path / "cut" / CLEANING_FILE).read_text(encoding="utf-8"))
    assert written["train_size"] == 240 and all(
        isinstance(row["train_index"], int) for row in written["dropped_reviews"]
    )
    lines: list[str] = []
    resumed = train(TrainOptions(output_dir=tmp_path / "cut", resume=True, **common), lines.append)  # type: ignore[arg-type]
    assert not any("embedded" in line for line in lines), "the resumed run embedded the train split again"
    assert any(f"{written['dropped']} dropped train reviews read back from" in line for line in lines)
    assert resumed.train_size == whole.train_size == written["kept"]
    assert (tmp_path / "cut" / CLEANING_FILE).read_text(encoding="utf-8") == (
        tmp_path / "whole" / CLEANING_FILE
    ).read_text(encoding="utf-8")


def test_a_cleaning_file_for_another_threshold_or_split_is_not_reused(tmp_path: Path) -> None:
    path = tmp_path / CLEANING_FILE
    rows = [{"train_index": 1}, {"train_index": 3}]
    path.write_text(
        json.dumps({"threshold": 0.2, "train_size": 5, "dropped_reviews": rows}), encoding="utf-8"
    )
    assert kept_by_earlier_cleaning(path, 0.2, 5) == [0, 2, 4]
    assert kept_by_earlier_cleaning(path, 0.3, 5) is None  # another threshold
    assert kept_by_earlier_cleaning(path, 0.2, 6) is None  # another split
    assert kept_by_earlier_cleaning(tmp_path / "missing.json", 0.2, 5) is None
    path.write_text(json.dumps({"threshold": 0.2, "train_size": 5, "dropped_reviews": [{"text": "x"}]}))
    assert kept_by_earlier_cleaning(path, 0.2, 5) is None  # written before indices were kept
