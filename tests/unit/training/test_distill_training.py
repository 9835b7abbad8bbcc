"""`train --teacher`: a narrower student on the teacher's vocabulary, learning from its soft targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.cli import main
from worker.training.options import METRICS_FILE, TrainingError, TrainOptions
from worker.training.training import train


def test_a_student_distilled_from_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "student"
    lines: list[str] = []
    options = TrainOptions(
        output_dir=out, teacher=str(tiny_model_dir), num_layers=1, hidden_size=32, num_heads=2,
        intermediate_size=64, max_seq_len=64, epochs=2, learning_rate=2e-3, limit=1500, seed=7,
        augment_copies=1, name="tiny-student",
    )  # fmt: skip
    report = train(options, progress=lines.append)
    # the student reads text exactly as its teacher does
    assert (out / "vocab.txt").read_text("utf-8") == (tiny_model_dir / "vocab.txt").read_text("utf-8")
    config = json.loads((out / "config.json").read_text("utf-8"))
    assert config["hidden_size"] == 32 and config["num_hidden_layers"] == 1
    text = "\n".join(lines)
    assert "embeddings projected from the teacher's" in text
    train_size = report.train_size
    assert f"distillation: {train_size} train + " in text and "augmented reviews labelled by" in text
    assert "teacher agrees with" in text
    metrics = json.loads((out / METRICS_FILE).read_text("utf-8"))
    assert metrics["test_accuracy"] == report.test_accuracy > 0.6  # learned something real
    assert "student of" in (out / "README.md").read_text("utf-8")
    # and it serves like any model
    assert main(["evaluate", "--model", str(out), "--heldout", "--no-static", "--json"]) == 0


def test_distillation_options_are_checked(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="use it with init=scratch"):
        TrainOptions(output_dir=tmp_path, teacher=str(tiny_model_dir), init="some/model").validate()
    with pytest.raises(TrainingError, match="augment_copies needs a teacher"):
        TrainOptions(output_dir=tmp_path, augment_copies=1).validate()
    with pytest.raises(TrainingError, match="soft_weight must be in"):
        TrainOptions(output_dir=tmp_path, teacher=str(tiny_model_dir), soft_weight=1.5).validate()
