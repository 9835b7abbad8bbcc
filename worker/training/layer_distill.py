"""Intermediate-layer distillation: the student's [CLS] state after each of its layers learns the teacher's
at the same relative depth (as in "Patient Knowledge Distillation", Sun et al. 2019), besides the teacher's
probabilities (`distill.py`).

- Layer map: student layer i (1-based, of k) follows teacher layer round(i·K/k) of K; 3 of 4 → 1, 3, 4.
- The targets are the teacher's [CLS] states projected onto their own top principal directions, as many as
  the student is wide, then scaled to unit length. A fixed projection (computed once from the teacher's
  states on the transfer set) needs no learned matrix, so a checkpoint holds nothing beyond the student.
- Only the [CLS] position is kept (one vector per layer and sequence, not one per token), so the targets of
  55,000 sequences fit in memory.
- The loss term: the squared distance between the unit-length student state and its target, averaged over
  the batch and the layers (0: the same direction; 4: opposite).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.manifest import verify_model_dir
from worker.model.weights import build_classifier
from worker.training.data import pad_batch
from worker.training.distill import by_length


def layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """The teacher layer (1-based) each student layer 1..k follows: round(i·K/k), halves rounded up."""
    if not 1 <= student_layers <= teacher_layers:
        raise ValueError(
            f"a student of {student_layers} layers cannot follow a teacher of {teacher_layers} layer by layer"
        )
    return [int(i * teacher_layers / student_layers + 0.5) for i in range(1, student_layers + 1)]


def teacher_cls_states(
    teacher: Path,
    sequences: Sequence[Sequence[int]],
    student_layers: int,
    *,
    batch_size: int = 64,
    progress: Callable[[str], None] = print,
) -> np.ndarray:
    """The teacher's [CLS] state after each layer `layer_map` gives, for token-id `sequences` (the teacher's
    vocabulary): float32 [n, student_layers, teacher width], in input order. `teacher` is a training
    directory (dygraph: the hidden states are not outputs of an exported model)."""
    import paddle

    model = build_classifier(verify_model_dir(teacher))  # float32, whatever the file stores
    picked = layer_map(student_layers, int(model.config.num_hidden_layers))
    pad_id = int(model.config.pad_token_id or 0)
    progress(f"layer targets: the teacher's layers {picked} for the student's 1..{student_layers}")
    states = np.zeros((len(sequences), student_layers, int(model.config.hidden_size)), dtype=np.float32)
    with paddle.no_grad():
        for idx in by_length(sequences, batch_size, "layer targets", progress):
            ids, mask = pad_batch([sequences[i] for i in idx], pad_id)
            hidden = _outputs(model, ids, mask).hidden_states
            states[idx] = np.stack([hidden[layer][:, 0, :].numpy() for layer in picked], axis=1)
    return states


def _outputs(model: Any, ids: np.ndarray, mask: np.ndarray) -> Any:
    """The model's logits and hidden states: the embeddings' output and each encoder layer's, [batch, tokens,
    width] each (`hidden_states[0]`: the embeddings)."""
    import paddle

    t_ids = paddle.to_tensor(ids)
    return model(
        t_ids,
        token_type_ids=paddle.zeros_like(t_ids),
        attention_mask=paddle.to_tensor(mask),
        output_hidden_states=True,
        return_dict=True,
    )


def principal_targets(states: np.ndarray, width: int) -> np.ndarray:
    """`states` [n, layers, teacher width] projected, layer by layer, onto that layer's top `width`
    principal directions (centred), then scaled to unit length: float32 [n, layers, width]."""
    n, layers, teacher_width = states.shape
    if width > teacher_width:
        raise ValueError(f"a student {width} wide is wider than the teacher's {teacher_width}")
    out = np.zeros((n, layers, width), dtype=np.float32)
    for layer in range(layers):
        x = states[:, layer, :].astype(np.float64)
        x -= x.mean(axis=0)
        _, vectors = np.linalg.eigh(x.T @ x)  # ascending eigenvalues
        projected = x @ vectors[:, ::-1][:, :width]
        out[:, layer, :] = projected / np.maximum(np.linalg.norm(projected, axis=1, keepdims=True), 1e-12)
    return out


def forward_with_layers(model: Any, ids: np.ndarray, mask: np.ndarray, layers: int) -> tuple[Any, Any]:
    """The student's logits and its [CLS] state after each of its `layers` layers, [batch, layers, width]."""
    import paddle

    out = _outputs(model, ids, mask)
    cls = paddle.stack([out.hidden_states[i][:, 0, :] for i in range(1, layers + 1)], axis=1)
    return out.logits, cls


def layer_loss(cls_states: Any, targets: np.ndarray) -> Any:
    """Mean squared distance between the unit-length student states [batch, layers, width] and the
    targets (unit length already), averaged over the batch and the layers."""
    import paddle
    import paddle.nn.functional as F

    unit = F.normalize(cls_states.astype("float32"), axis=-1)
    return ((unit - paddle.to_tensor(targets)) ** 2).sum(axis=-1).mean()
