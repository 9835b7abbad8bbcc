"""`train --teacher`: a narrower student on the teacher's vocabulary, learning from its soft targets."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import paddle
import pytest

from worker.cli import main
from worker.model.manifest import verify_model_dir, write_manifest
from worker.model.metadata import WEIGHTS_FILE
from worker.model.weights import build_classifier, read_weights, save_weights
from worker.training.options import METRICS_FILE, SOFT_TARGETS_FILE, TrainingError, TrainOptions
from worker.training.training import train


def test_a_student_distilled_from_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "student"
    lines: list[str] = []
    options = TrainOptions(
        output_dir=out, teacher=str(tiny_model_dir), num_layers=1, hidden_size=32, num_heads=2,
        intermediate_size=64, max_seq_len=64, epochs=2, learning_rate=2e-3, limit=1500, seed=7,
        augment_copies=1, synonym_copies=1, name="tiny-student",
    )  # fmt: skip
    report = train(options, progress=lines.append)
    # the student reads text exactly as its teacher does
    assert (out / "vocab.txt").read_text("utf-8") == (tiny_model_dir / "vocab.txt").read_text("utf-8")
    config = json.loads((out / "config.json").read_text("utf-8"))
    assert config["hidden_size"] == 32 and config["num_hidden_layers"] == 1
    text = "\n".join(lines)
    assert "embeddings projected from the teacher's" in text
    train_size = report.train_size
    copies = re.search(
        rf"distillation: {train_size} train \+ (\d+) augmented reviews \((\d+) with thesaurus", text
    )
    assert copies is not None
    # one altered copy and one synonym copy of (nearly) every train review
    assert 0.9 * train_size <= int(copies.group(2)) <= train_size
    assert int(copies.group(1)) - int(copies.group(2)) <= train_size
    assert f"teacher {tiny_model_dir} agrees with" in text
    metrics = json.loads((out / METRICS_FILE).read_text("utf-8"))
    assert metrics["test_accuracy"] == report.test_accuracy > 0.6  # learned something real
    card = (out / "README.md").read_text("utf-8")
    assert "ERNIE student: 1 layers" in card and f"distilled from `{tiny_model_dir}`" in card
    assert "1 augmented copies of the train split and 1 with thesaurus synonyms labelled by" in card
    # and it serves like any model
    assert main(["evaluate", "--model", str(out), "--heldout", "--no-static", "--json"]) == 0


def test_distillation_options_are_checked(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="names an empty directory"):
        TrainOptions(output_dir=tmp_path, teacher=f"{tiny_model_dir},").validate()
    with pytest.raises(TrainingError, match="augment_copies and synonym_copies need a teacher"):
        TrainOptions(output_dir=tmp_path, augment_copies=1).validate()
    with pytest.raises(TrainingError, match="soft_weight must be in"):
        TrainOptions(output_dir=tmp_path, teacher=str(tiny_model_dir), soft_weight=1.5).validate()


def _reordered_copy(model_dir: Path, out: Path) -> Path:
    """The same model with its vocabulary in another order (specials kept first): other token ids for the
    same texts, the same predictions."""
    shutil.copytree(model_dir, out)
    tokens = (model_dir / "vocab.txt").read_text("utf-8").splitlines()
    order = list(range(5)) + list(range(len(tokens) - 1, 4, -1))  # new id -> old id
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (out / "vocab.txt").write_text("".join(tokens[i] + "\n" for i in order), "utf-8")
    state = read_weights(model_dir / WEIGHTS_FILE)
    key = "ernie.embeddings.word_embeddings.weight"
    state[key] = state[key][order]
    save_weights(state, out)
    write_manifest(out)
    return out


def test_self_distillation_from_an_ensemble_whose_teachers_read_with_their_own_vocabularies(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    other = _reordered_copy(tiny_model_dir, tmp_path / "reordered")
    out = tmp_path / "born-again"
    lines: list[str] = []
    options = TrainOptions(
        output_dir=out, init=str(tiny_model_dir), teacher=f"{tiny_model_dir},{other}", max_seq_len=64,
        epochs=1, learning_rate=1e-3, limit=1500, seed=7, name="tiny-born-again",
    )  # fmt: skip
    report = train(options, progress=lines.append)
    text = "\n".join(lines)
    agreements = re.findall(r"teacher (\S+) agrees with ([\d.]+)% of the train labels", text)
    assert [Path(p) for p, _ in agreements] == [tiny_model_dir, other]
    # the reordered teacher got its own ids: it agrees with the gold labels as often as the original
    first, second = (float(a) for _, a in agreements)
    assert abs(first - second) <= 0.2 and first > 60
    mean = re.search(r"the 2 teachers' mean agrees with ([\d.]+)%", text)
    assert mean is not None and abs(float(mean.group(1)) - first) <= 0.2
    # the student is the init model, the teachers' shape and vocabulary
    config = json.loads((out / "config.json").read_text("utf-8"))
    teacher_config = json.loads((tiny_model_dir / "config.json").read_text("utf-8"))
    assert config["hidden_size"] == teacher_config["hidden_size"]
    assert config["num_hidden_layers"] == teacher_config["num_hidden_layers"]
    assert (out / "vocab.txt").read_text("utf-8") == (tiny_model_dir / "vocab.txt").read_text("utf-8")
    card = (out / "README.md").read_text("utf-8")
    assert "self-distillation" in card and "an ensemble" in card
    assert report.test_accuracy > 0.6


def _three_layer_classifier() -> object:
    from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification

    paddle.seed(11)
    config = ErnieConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return ErnieForSequenceClassification(config)


def test_keep_encoder_layers_keeps_the_chosen_layers_with_their_weights(tmp_path: Path) -> None:
    from worker.training.distill import keep_encoder_layers

    model = _three_layer_classifier()
    before = {k: np.asarray(v).copy() for k, v in model.state_dict().items()}  # type: ignore[attr-defined]
    keep_encoder_layers(model, [0, 2])
    after = {k: np.asarray(v) for k, v in model.state_dict().items()}  # type: ignore[attr-defined]
    layer_keys = sorted({k.split(".")[3] for k in after if k.startswith("ernie.encoder.layers.")})
    assert layer_keys == ["0", "1"]
    for name, value in after.items():
        source = name.replace("encoder.layers.1.", "encoder.layers.2.")  # new layer 1 is old layer 2
        np.testing.assert_array_equal(value, before[source], err_msg=name)
    # the shallower model saves and loads as a model of two layers, with the same outputs
    ids = paddle.to_tensor([[1, 5, 9, 2, 0]])
    model.eval()  # type: ignore[attr-defined]
    logits = np.asarray(model(ids))  # type: ignore[operator]
    model.config.save_pretrained(str(tmp_path))  # type: ignore[attr-defined]
    save_weights(model.state_dict(), tmp_path)  # type: ignore[attr-defined]
    config = json.loads((tmp_path / "config.json").read_text("utf-8"))
    assert config["num_hidden_layers"] == 2
    write_manifest(tmp_path)
    loaded = build_classifier(verify_model_dir(tmp_path))
    np.testing.assert_allclose(np.asarray(loaded(ids)), logits, atol=1e-6)
    with pytest.raises(ValueError, match="encoder with 2 layers"):
        keep_encoder_layers(model, [0, 2])


def test_a_student_initialised_from_the_teachers_layers(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "from-layers"
    lines: list[str] = []
    options = TrainOptions(
        output_dir=out, init=str(tiny_model_dir), keep_layers="0", teacher=str(tiny_model_dir),
        max_seq_len=64, epochs=1, learning_rate=1e-3, limit=1500, seed=7, name="tiny-from-layers",
    )  # fmt: skip
    report = train(options, progress=lines.append)
    assert "encoder layers 0 kept" in "\n".join(lines)
    card = (out / "README.md").read_text("utf-8")
    assert "only its encoder layers 0 kept (1 layers)" in card
    assert "a student initialised from the init's layers" in card and "self-distillation" not in card
    assert report.test_accuracy > 0.6
    # a layer the init does not have is a clear error, before any training
    with pytest.raises(
        TrainingError, match="--keep-layers: layers \\[1\\] asked of an encoder with 1 layers"
    ):
        train(replace(options, keep_layers="1", output_dir=tmp_path / "too-deep"), progress=lines.append)


@pytest.mark.parametrize(
    ("keep", "init", "message"),
    [
        ("0", "scratch", "use it with --init DIR"),
        ("a,b", "model-dir", "give 0-based layer numbers"),
        ("1,0", "model-dir", "distinct layer numbers >= 0 in increasing order"),
        ("0,0", "model-dir", "distinct layer numbers"),
        ("-1", "model-dir", "distinct layer numbers >= 0"),
    ],
)
def test_keep_layers_is_checked(keep: str, init: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match=message):
        TrainOptions(output_dir=tmp_path, init=init, keep_layers=keep).validate()
    assert TrainOptions(output_dir=tmp_path, init="model-dir", keep_layers="0,2").kept_layers() == [0, 2]


def test_a_resumed_distillation_reads_the_teachers_probabilities_back(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    common = {
        "teacher": str(tiny_model_dir), "num_layers": 1, "hidden_size": 32, "num_heads": 2,
        "intermediate_size": 64, "max_seq_len": 32, "batch_size": 16, "limit": 300, "epochs": 1, "seed": 3,
        "augment_copies": 1,
    }  # fmt: skip
    out = tmp_path / "cut"
    whole = train(TrainOptions(output_dir=tmp_path / "whole", **common), lambda _: None)  # type: ignore[arg-type]
    assert not (tmp_path / "whole" / SOFT_TARGETS_FILE).exists()  # a completed run leaves no cache behind
    stopped = train(TrainOptions(output_dir=out, stop_after_steps=3, **common), lambda _: None)  # type: ignore[arg-type]
    assert stopped.interrupted and (out / SOFT_TARGETS_FILE).is_file()
    lines: list[str] = []
    resumed = train(TrainOptions(output_dir=out, resume=True, **common), lines.append)  # type: ignore[arg-type]
    text = "\n".join(lines)
    assert "teachers' probabilities read back from" in text
    assert "agrees with" not in text and "teacher: exporting" not in text  # no teacher ran again
    # the same soft targets: the resumed run ends where the uninterrupted one did
    assert resumed.test_accuracy == whole.test_accuracy and resumed.steps == whole.steps
    assert not (out / SOFT_TARGETS_FILE).exists()


def test_soft_targets_kept_for_other_teachers_or_sequences_are_not_reused(tmp_path: Path) -> None:
    from worker.training.distill import load_soft_targets, save_soft_targets, soft_targets_key

    path = tmp_path / SOFT_TARGETS_FILE
    probs = np.array([[0.2, 0.8], [0.9, 0.1]], dtype=np.float32)
    key = soft_targets_key([Path("teacher")], [[2, 5, 3], [2, 3]])
    save_soft_targets(path, key, probs)
    np.testing.assert_array_equal(load_soft_targets(path, key), probs)
    assert load_soft_targets(path, soft_targets_key([Path("other")], [[2, 5, 3], [2, 3]])) is None
    assert load_soft_targets(path, soft_targets_key([Path("teacher")], [[2, 5], [3, 2, 3]])) is None
    path.write_bytes(b"not an npz")
    assert load_soft_targets(path, key) is None
    assert load_soft_targets(tmp_path / "missing.npz", key) is None
