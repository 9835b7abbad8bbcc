"""Distillation helpers: temperature, augmentation from the corpus alone, embeddings projected from a
teacher onto a narrower student."""

from __future__ import annotations

import numpy as np
import pytest

from worker.training.distill import augment_texts, principal_basis, projected_embeddings, soften


def test_soften_keeps_the_argmax_and_flattens_with_temperature() -> None:
    probs = np.array([[0.9, 0.1], [0.2, 0.8]], dtype=np.float32)
    same = soften(probs, 1.0)
    assert np.allclose(same, probs, atol=1e-6)
    soft = soften(probs, 4.0)
    assert (soft.argmax(axis=1) == probs.argmax(axis=1)).all()
    assert soft[0, 0] < 0.9 and soft[0, 0] > 0.5
    assert np.allclose(soft.sum(axis=1), 1.0)


def test_augmented_texts_come_from_the_given_texts_only() -> None:
    texts = ["这家店的菜很好吃，服务也周到", "物流太慢了，包装还破了", "好"]
    out = augment_texts(texts, copies=3, seed=7)
    assert len(out) == 3 * 2  # "好" is too short to alter
    alphabet = set("".join(texts))
    assert all(text and set(text) <= alphabet for text in out)
    assert out == augment_texts(texts, copies=3, seed=7)  # seeded
    assert out != augment_texts(texts, copies=3, seed=8)


def test_principal_basis_is_orthonormal_and_captures_the_main_direction() -> None:
    rng = np.random.default_rng(0)
    direction = np.array([3.0, 4.0, 0.0, 0.0]) / 5.0
    rows = rng.normal(size=(500, 1)) * 10 * direction + rng.normal(size=(500, 4)) * 0.1
    mean, basis = principal_basis(rows.astype(np.float32), 2)
    assert basis.shape == (4, 2)
    assert np.allclose(basis.T @ basis, np.eye(2), atol=1e-5)
    assert abs(abs(basis[:, 0] @ direction) - 1.0) < 1e-3
    with pytest.raises(ValueError, match="cannot project 4 dimensions onto 5"):
        principal_basis(rows, 5)


def test_projected_embeddings_have_the_student_shape() -> None:
    rng = np.random.default_rng(1)
    state = {
        "ernie.embeddings.word_embeddings.weight": rng.normal(size=(50, 16)).astype(np.float32),
        "ernie.embeddings.position_embeddings.weight": rng.normal(size=(32, 16)).astype(np.float32),
        "ernie.embeddings.token_type_embeddings.weight": rng.normal(size=(2, 16)).astype(np.float32),
        "ernie.encoder.layers.0.linear1.weight": rng.normal(size=(16, 64)).astype(np.float32),
    }
    tables = projected_embeddings(state, width=8, max_positions=10)
    assert tables["word_embeddings"].shape == (50, 8)
    assert tables["position_embeddings"].shape == (10, 8)
    assert tables["token_type_embeddings"].shape == (2, 8)
    # similar words stay similar: nearest neighbours in the projection mostly agree with the teacher's
    teacher = state["ernie.embeddings.word_embeddings.weight"]
    assert np.linalg.norm(tables["word_embeddings"], axis=1).mean() == pytest.approx(
        np.linalg.norm(teacher - teacher.mean(axis=0), axis=1).mean(), rel=1e-4
    )
    with pytest.raises(KeyError, match="position_embeddings"):
        projected_embeddings({k: v for k, v in state.items() if "position" not in k}, 8, 10)


def test_distillation_loss_is_cross_entropy_at_its_extremes() -> None:
    import paddle
    import paddle.nn.functional as F

    from worker.training.distill import distillation_loss

    logits = paddle.to_tensor(np.array([[2.0, -1.0], [0.5, 0.3], [-1.0, 1.0]], dtype=np.float32))
    labels = np.array([0, 1, -1])
    soft = np.array([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7]], dtype=np.float32)
    # soft weight 0: the gold labels only, and the unlabelled (augmented) row does not count
    hard = float(distillation_loss(logits, labels, soft, 2.0, 0.0))
    expected = float(F.cross_entropy(logits[:2], paddle.to_tensor(labels[:2]))) * 2 / 3
    assert hard == pytest.approx(expected, rel=1e-5)
    # soft weight 1 at T=1: cross-entropy against the teacher's probabilities
    soft_only = float(distillation_loss(logits, labels, soft, 1.0, 1.0))
    log_p = np.log(F.softmax(logits, axis=-1).numpy())
    assert soft_only == pytest.approx(float(-(soft * log_p).sum(axis=1).mean()), rel=1e-5)
    # all rows unlabelled: the soft term alone, no NaN
    assert np.isfinite(float(distillation_loss(logits, np.array([-1, -1, -1]), soft, 2.0, 0.5)))
