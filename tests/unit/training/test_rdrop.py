"""R-Drop (`train --rdrop`): the loss against numpy, the wiring into the training loop, refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import paddle
import pytest

from tests.model_fixtures import MICRO_OPTIONS
from worker.model.metadata import WEIGHTS_FILE
from worker.model.weights import read_weights
from worker.training.data import rdrop_loss, smoothed_cross_entropy
from worker.training.options import MODEL_CARD_FILE, TrainingError, TrainOptions
from worker.training.training import train

MICRO = {**MICRO_OPTIONS, "epochs": 1, "device": "cpu"}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_rdrop_loss_is_the_mean_cross_entropy_plus_the_weighted_symmetric_kl() -> None:
    rng = np.random.default_rng(0)
    first, second = rng.normal(size=(5, 2)).astype(np.float32), rng.normal(size=(5, 2)).astype(np.float32)
    labels = np.array([0, 1, 1, 0, 1])
    loss = float(
        rdrop_loss(paddle.to_tensor(np.concatenate([first, second])), paddle.to_tensor(labels), 0.0, 2.0)
    )
    log_a, log_b = _log_softmax(first), _log_softmax(second)
    cross_entropy = -0.5 * (log_a[np.arange(5), labels].mean() + log_b[np.arange(5), labels].mean())
    kl_ab = (np.exp(log_a) * (log_a - log_b)).sum(axis=-1).mean()
    kl_ba = (np.exp(log_b) * (log_b - log_a)).sum(axis=-1).mean()
    assert kl_ab + kl_ba > 0.1  # the two halves disagree, so the KL term matters here
    assert loss == pytest.approx(cross_entropy + 2.0 * 0.5 * (kl_ab + kl_ba), rel=1e-5)


def test_rdrop_loss_of_two_identical_passes_is_the_plain_loss() -> None:
    logits = np.random.default_rng(1).normal(size=(4, 2)).astype(np.float32)
    labels = paddle.to_tensor(np.array([1, 0, 0, 1]))
    stacked = paddle.to_tensor(np.concatenate([logits, logits]))
    plain = float(smoothed_cross_entropy(paddle.to_tensor(logits), labels, 0.1))
    assert float(rdrop_loss(stacked, labels, 0.1, 5.0)) == pytest.approx(plain, rel=1e-6)


def _weights(path: Path) -> dict[str, np.ndarray]:
    return read_weights(path)


def test_without_dropout_rdrop_trains_exactly_the_plain_run(tmp_path: Path) -> None:
    """Both passes see the same network when dropout is 0: the doubled batch changes nothing."""
    plain = train(TrainOptions(output_dir=tmp_path / "plain", dropout=0.0, **MICRO), lambda _: None)  # type: ignore[arg-type]
    rdrop = train(
        TrainOptions(output_dir=tmp_path / "rdrop", dropout=0.0, rdrop=1.0, **MICRO), lambda _: None
    )  # type: ignore[arg-type]
    a, b = (
        _weights(tmp_path / "plain" / WEIGHTS_FILE),
        _weights(tmp_path / "rdrop" / WEIGHTS_FILE),
    )
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-5, err_msg=name)
    assert plain.steps == rdrop.steps


def test_with_dropout_the_kl_term_changes_the_run_and_the_card_says_so(tmp_path: Path) -> None:
    train(TrainOptions(output_dir=tmp_path / "plain", dropout=0.1, **MICRO), lambda _: None)  # type: ignore[arg-type]
    train(TrainOptions(output_dir=tmp_path / "rdrop", dropout=0.1, rdrop=1.0, **MICRO), lambda _: None)  # type: ignore[arg-type]
    a, b = (
        _weights(tmp_path / "plain" / WEIGHTS_FILE),
        _weights(tmp_path / "rdrop" / WEIGHTS_FILE),
    )
    assert any(not np.allclose(a[k], b[k], rtol=0, atol=1e-5) for k in a)
    card = (tmp_path / "rdrop" / MODEL_CARD_FILE).read_text(encoding="utf-8")
    assert "R-Drop (two dropout passes per batch, symmetric KL weight 1.0)" in card
    assert "R-Drop" not in (tmp_path / "plain" / MODEL_CARD_FILE).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"rdrop": -0.5}, "rdrop must be >= 0"),
        ({"rdrop": 1.0, "teacher": "models/default"}, "rdrop regularises fine-tuning on gold labels"),
    ],
)
def test_bad_rdrop_settings_are_refused_with_the_reason(tmp_path: Path, extra: dict, reason: str) -> None:
    with pytest.raises(TrainingError, match=reason):
        TrainOptions(output_dir=tmp_path, **extra).validate()
