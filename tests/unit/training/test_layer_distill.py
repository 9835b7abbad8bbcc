"""`train --layer-weight`: intermediate-layer distillation, the student's [CLS] state after each layer taught
the teacher's at the same relative depth."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import paddle
import pytest

from worker.model.manifest import write_manifest
from worker.training.layer_distill import (
    forward_with_layers,
    layer_loss,
    layer_map,
    principal_targets,
    teacher_cls_states,
)
from worker.training.options import TrainingError, TrainOptions
from worker.training.training import train


def test_each_student_layer_follows_the_teacher_layer_at_the_same_relative_depth() -> None:
    assert layer_map(3, 4) == [1, 3, 4]
    assert layer_map(2, 4) == [2, 4]
    assert layer_map(1, 4) == [4]
    assert layer_map(4, 4) == [1, 2, 3, 4]
    assert layer_map(3, 12) == [4, 8, 12]
    with pytest.raises(ValueError, match="cannot follow a teacher of 4 layer"):
        layer_map(5, 4)
    with pytest.raises(ValueError):
        layer_map(0, 4)


def test_the_targets_are_unit_length_on_the_directions_of_most_variance() -> None:
    rng = np.random.default_rng(3)
    n, width = 400, 8
    # layer 0 varies mostly along axis 5, then axis 2; layer 1 along axis 0 only (plus noise)
    scales = np.full(width, 0.01)
    scales[5], scales[2] = 10.0, 3.0
    first = rng.normal(size=(n, width)) * scales + 7.0  # an offset: centring removes it
    second = np.outer(rng.normal(size=n), np.eye(width)[0]) + rng.normal(size=(n, width)) * 0.01
    states = np.stack([first, second], axis=1).astype(np.float32)
    targets = principal_targets(states, 2)
    assert targets.shape == (n, 2, 2) and targets.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(targets, axis=-1), 1.0, atol=1e-5)
    # the first coordinate of layer 0 is the axis-5 deviation (up to sign), scaled to unit length
    direction = (states[:, 0, 5] - states[:, 0, 5].mean()) / np.linalg.norm(
        states[:, 0, [5, 2]] - states[:, 0, [5, 2]].mean(axis=0), axis=1
    )
    assert abs(np.corrcoef(targets[:, 0, 0], direction)[0, 1]) > 0.99
    # layer 1 has one direction: its first coordinate is ±1 for almost every sequence
    assert np.mean(np.abs(targets[:, 1, 0]) > 0.9) > 0.9
    with pytest.raises(ValueError, match="wider than the teacher's 8"):
        principal_targets(states, 9)


def test_the_layer_loss_measures_direction_only() -> None:
    targets = np.array([[[0.6, 0.8], [1.0, 0.0]]], dtype=np.float32)
    same_direction = paddle.to_tensor(targets * np.array([[[3.0], [0.5]]], dtype=np.float32))
    assert float(layer_loss(same_direction, targets)) == pytest.approx(0.0, abs=1e-6)
    assert float(layer_loss(paddle.to_tensor(-targets), targets)) == pytest.approx(4.0, abs=1e-5)
    orthogonal = paddle.to_tensor(np.array([[[-0.8, 0.6], [0.0, 2.0]]], dtype=np.float32))
    assert float(layer_loss(orthogonal, targets)) == pytest.approx(2.0, abs=1e-5)


def test_the_student_forward_gives_the_logits_and_one_cls_state_per_layer(tiny_model_dir: Path) -> None:
    from worker.model.manifest import verify_model_dir
    from worker.model.weights import build_classifier
    from worker.training.data import forward, pad_batch

    model = build_classifier(verify_model_dir(tiny_model_dir))
    ids, mask = pad_batch([[2, 10, 11, 3], [2, 12, 3]], 0)
    with paddle.no_grad():
        logits, cls = forward_with_layers(model, ids, mask, int(model.config.num_hidden_layers))
        plain = forward(model, ids, mask)
    assert tuple(cls.shape) == (2, model.config.num_hidden_layers, model.config.hidden_size)
    np.testing.assert_allclose(logits.numpy(), plain.numpy(), atol=1e-6)
    # the teacher side reads the same states, sequence by sequence, in input order
    states = teacher_cls_states(tiny_model_dir, [[2, 12, 3], [2, 10, 11, 3]], 1, progress=lambda _: None)
    np.testing.assert_allclose(states[0, 0], cls.numpy()[1, -1], atol=1e-5)
    np.testing.assert_allclose(states[1, 0], cls.numpy()[0, -1], atol=1e-5)


def _student(tiny_model_dir: Path, out: Path, layer_weight: float) -> TrainOptions:
    return TrainOptions(
        output_dir=out, teacher=str(tiny_model_dir), num_layers=1, hidden_size=32, num_heads=2,
        intermediate_size=64, max_seq_len=64, epochs=1, learning_rate=2e-3, limit=1000, seed=7,
        layer_weight=layer_weight, name="tiny-student",
    )  # fmt: skip


def test_a_student_taught_layer_by_layer_moves_its_states_toward_the_teachers(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    lines: list[str] = []
    options = replace(_student(tiny_model_dir, tmp_path / "taught", 1.0), epochs=4)
    report = train(options, progress=lines.append)
    text = "\n".join(lines)
    assert "layer targets: the teacher's layers [1] for the student's 1..1" in text
    card = (report.output_dir / "README.md").read_text("utf-8")
    assert "intermediate-layer distillation, weight 1.0" in card
    config = json.loads((report.output_dir / "config.json").read_text("utf-8"))
    assert (
        config["hidden_size"] == 32
    )  # the teacher's 64-wide states were brought down to the student's width
    terms = [float(t) for t in re.findall(r"\(layer term ([\d.]+)\)", text)]
    assert len(terms) >= 4
    # the student's [CLS] states turn toward the teacher's: the term falls well below its start (2: unrelated)
    assert np.mean(terms[-3:]) < 0.7 * np.mean(terms[:3])
    assert report.test_accuracy > 0.6  # and it still labels


def test_layer_distillation_needs_a_teacher_read_with_the_students_vocabulary(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(TrainingError, match="layer_weight must be >= 0"):
        TrainOptions(output_dir=tmp_path, teacher=str(tiny_model_dir), layer_weight=-1).validate()
    with pytest.raises(TrainingError, match="layer_weight matches a teacher's layers: give --teacher"):
        TrainOptions(output_dir=tmp_path, layer_weight=1).validate()
    other = tmp_path / "other-vocabulary"
    shutil.copytree(tiny_model_dir, other)
    tokens = (other / "vocab.txt").read_text("utf-8").splitlines()
    (other / "vocab.txt").write_text("\n".join(tokens[:5] + tokens[5:][::-1]) + "\n", "utf-8")
    write_manifest(other)  # the init is loaded only when its files match their manifest
    options = TrainOptions(
        output_dir=tmp_path / "out", init=str(other), teacher=str(tiny_model_dir), max_seq_len=64, epochs=1,
        limit=200, layer_weight=1.0,
    )  # fmt: skip
    with pytest.raises(TrainingError, match="another vocabulary than .* drop --layer-weight"):
        train(options, progress=lambda _: None)
