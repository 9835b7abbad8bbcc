"""Distillation: a small, fast student learns from a fine-tuned teacher.

- The student shares the teacher's tokenizer, so both see the very same token ids; its word, position and
  token-type embeddings start from the teacher's, projected onto their top principal components (the
  student is narrower), which carries the teacher's pre-trained lexical knowledge into a model that costs a
  fraction of the compute.
- Soft targets: the teacher's probabilities on every training sequence (and on augmented copies of the
  training reviews, which have no gold label), sharpened or softened by a temperature T. The student's loss
  is ``(1 − w)·CE(gold) + w·T²·CE(teacher_T, student_T)``, the hard term only where a gold label exists.
- Augmentation uses the training split's own texts only (crops, character drops, two reviews joined), so
  no outside data enters; the teacher labels them.
"""

from __future__ import annotations

import hashlib
import json
import random
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, load_classifier
from worker.model.manifest import verify_model_dir
from worker.model.static_backend import is_exported_dir
from worker.model.weights import load_tokenizer, read_verified_weights
from worker.training.export import export_model

EMBEDDING_KEYS = ("word_embeddings", "position_embeddings", "token_type_embeddings")


def teacher_probabilities(
    teacher: str | Path,
    sequences: Sequence[Sequence[int]],
    *,
    max_seq_len: int,
    batch_size: int = 64,
    progress: Callable[[str], None] = print,
) -> np.ndarray:
    """The teacher's probabilities [n, labels] for token-id `sequences` ([CLS] … [SEP], the teacher's
    vocabulary), in input order. `teacher` is a training or an exported directory (the static backend is
    several times faster on CPU)."""
    with tempfile.TemporaryDirectory(prefix="sentiment-teacher-") as tmp:
        source = Path(teacher)
        if not is_exported_dir(source):
            progress(f"teacher: exporting {source} for the static backend (several times dygraph's speed)")
            source = export_model(source, Path(tmp) / "exported").output_dir
        classifier = load_classifier(
            str(source),
            choose_device("cpu"),
            max_seq_len=max_seq_len,
            options=InferenceOptions(tokenizer="slow"),
        )
        return _predict_sorted(classifier, sequences, batch_size, progress)


def _predict_sorted(
    classifier: Any, sequences: Sequence[Sequence[int]], batch_size: int, progress: Callable[[str], None]
) -> np.ndarray:
    probs = np.zeros((len(sequences), len(classifier.labels)), dtype=np.float32)
    for idx in by_length(sequences, batch_size, "teacher", progress):
        probs[idx] = classifier.predict_ids([sequences[i] for i in idx])
    return probs


def by_length(
    sequences: Sequence[Sequence[int]], batch_size: int, what: str, progress: Callable[[str], None]
) -> Iterator[list[int]]:
    """The indices of `sequences` in batches of similar length (shortest first), with a progress line
    (`what`: done, rate, ETA) every 30 s and at the end."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    started = last = time.monotonic()
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]
        now = time.monotonic()
        if now - last >= 30 or start + batch_size >= len(order):
            done = min(start + batch_size, len(order))
            rate = done / max(now - started, 1e-9)
            progress(
                f"{what}: {done}/{len(order)} sequences, {rate:.0f} seq/s, "
                f"ETA {(len(order) - done) / rate:.0f}s"
            )
            last = now


def soft_targets_key(teachers: Sequence[Path], sequences: Sequence[Sequence[int]]) -> str:
    """What the teachers' probabilities depend on: the teacher directories and the student's token ids."""
    digest = hashlib.sha256(json.dumps([str(t) for t in teachers]).encode())
    for sequence in sequences:
        digest.update(np.asarray(sequence, dtype=np.int64).tobytes() + b"|")
    return digest.hexdigest()[:16]


def save_soft_targets(path: Path, key: str, probs: np.ndarray) -> None:
    """Keep the teachers' probabilities for a resumed or finished run of the same options."""
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, key=np.array(key), probs=probs)
    tmp.replace(path)


def load_soft_targets(path: Path, key: str) -> np.ndarray | None:
    """The probabilities an earlier start of this run kept at `path`, or None when there are none for
    these teachers and sequences."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as saved:
            return saved["probs"] if str(saved["key"]) == key else None
    except (OSError, ValueError, KeyError):
        return None


def soften(probs: np.ndarray, temperature: float) -> np.ndarray:
    """Probabilities at temperature T (softmax(logits / T)), computed from T=1 probabilities."""
    logp = np.log(np.clip(probs.astype(np.float64), 1e-12, 1.0)) / temperature
    logp -= logp.max(axis=1, keepdims=True)
    out = np.exp(logp)
    return (out / out.sum(axis=1, keepdims=True)).astype(np.float32)


def augment_texts(texts: Sequence[str], copies: int, seed: int) -> list[str]:
    """`copies` altered versions of each text (crop, character drop, or joined with another review's half),
    from `texts` alone; texts too short to alter are skipped."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(copies):
        for text in texts:
            if len(text) < 4:
                continue
            kind = rng.random()
            if kind < 0.4:  # a crop: 50–90 % of the text
                keep = max(2, int(len(text) * rng.uniform(0.5, 0.9)))
                start = rng.randrange(0, len(text) - keep + 1)
                out.append(text[start : start + keep])
            elif kind < 0.7:  # drop 10–20 % of the characters
                drop = rng.uniform(0.1, 0.2)
                kept = "".join(ch for ch in text if rng.random() >= drop)
                out.append(kept or text)
            else:  # two reviews joined: this one and half of another
                other = texts[rng.randrange(len(texts))]
                half = other[: max(1, len(other) // 2)] if rng.random() < 0.5 else other[len(other) // 2 :]
                out.append(text + half if rng.random() < 0.5 else half + text)
    return out


def principal_basis(weights: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean [d] and the top-`width` principal directions [d, width] of the rows of `weights` [n, d]."""
    if width > weights.shape[1]:
        raise ValueError(f"cannot project {weights.shape[1]} dimensions onto {width}")
    mean = weights.mean(axis=0)
    _, _, vt = np.linalg.svd(weights - mean, full_matrices=False)
    return mean, vt[:width].T


def projected_embeddings(
    teacher_state: dict[str, np.ndarray], width: int, max_positions: int
) -> dict[str, np.ndarray]:
    """Student embedding tables from the teacher's: word embeddings projected onto their top `width`
    principal directions (scaled to the teacher's per-row spread), position and token-type tables through
    the same basis; keyed by EMBEDDING_KEYS."""
    tables = {key: _find(teacher_state, key) for key in EMBEDDING_KEYS}
    mean, basis = principal_basis(tables["word_embeddings"], width)
    out: dict[str, np.ndarray] = {}
    for key, table in tables.items():
        centred = table - (mean if key == "word_embeddings" else table.mean(axis=0))
        projected = centred @ basis
        if key == "position_embeddings":
            projected = projected[:max_positions]
        out[key] = projected.astype(np.float32)
    # Keep the word embeddings' scale: the teacher's row norm spread, not the variance left after cutting.
    scale = np.linalg.norm(tables["word_embeddings"] - mean, axis=1).mean() / max(
        np.linalg.norm(out["word_embeddings"], axis=1).mean(), 1e-12
    )
    return {key: value * np.float32(scale) for key, value in out.items()}


def _find(state: dict[str, np.ndarray], key: str) -> np.ndarray:
    matches = [name for name in state if name.endswith(f"embeddings.{key}.weight")]
    if len(matches) != 1:
        raise KeyError(f"expected one *embeddings.{key}.weight in the teacher's weights, found {matches}")
    return np.asarray(state[matches[0]], dtype=np.float32)


def load_state(directory: Path) -> dict[str, np.ndarray]:
    """A training directory's weights (model.safetensors) as numpy arrays, the directory verified against
    its manifest first (UnverifiedModelError otherwise)."""
    return read_verified_weights(verify_model_dir(directory))


def teacher_tokenizer(teacher: Path) -> Any:
    """The tokenizer a teacher directory reads text with (the directory verified first)."""
    verify_model_dir(teacher)
    return load_tokenizer(teacher)


def build_student(
    teacher: Path,
    *,
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    intermediate_size: int,
    dropout: float,
    max_seq_len: int,
    num_labels: int,
    progress: Callable[[str], None] = print,
) -> tuple[Any, Any]:
    """A new, narrower ERNIE classifier on the teacher's tokenizer, its embeddings projected from the
    teacher's (`projected_embeddings`); the encoder layers start fresh. `teacher` is a training directory."""
    import paddle
    from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification

    tokenizer = teacher_tokenizer(teacher)
    config = ErnieConfig(
        vocab_size=len(tokenizer.vocab),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        max_position_embeddings=max_seq_len,
        type_vocab_size=2,
        pad_token_id=int(tokenizer.pad_token_id),
        num_labels=num_labels,
    )
    model = ErnieForSequenceClassification(config)
    tables = projected_embeddings(load_state(teacher), hidden_size, max_seq_len)
    embeddings = model.ernie.embeddings
    for key, table in tables.items():
        layer = getattr(embeddings, key)
        if tuple(layer.weight.shape) != table.shape:
            raise ValueError(f"student {key} {tuple(layer.weight.shape)} vs projected {table.shape}")
        layer.weight.set_value(paddle.to_tensor(table))
    params = sum(int(np.prod(p.shape)) for p in model.parameters())
    progress(
        f"student: {num_layers} layers x {hidden_size} hidden on {teacher.name}'s "
        f"{len(tokenizer.vocab):,}-token vocabulary, embeddings projected from the teacher's "
        f"({params:,} parameters)"
    )
    return model, tokenizer


def keep_encoder_layers(model: Any, layers: list[int]) -> None:
    """Cut an ERNIE classifier's encoder down to `layers` (0-based, in order), in place: the kept layers
    keep their weights, the config says the new depth, so `save_classifier` writes a loadable model."""
    import paddle

    encoder = model.ernie.encoder
    depth = len(encoder.layers)
    if max(layers) >= depth:
        raise ValueError(f"layers {layers} asked of an encoder with {depth} layers (0..{depth - 1})")
    encoder.layers = paddle.nn.LayerList([encoder.layers[i] for i in layers])
    encoder.num_layers = len(layers)
    model.config.num_hidden_layers = len(layers)


def distillation_loss(
    logits: Any, labels: np.ndarray, soft: np.ndarray, temperature: float, soft_weight: float
) -> Any:
    """``(1 − w)·CE(gold) + w·T²·CE(soft, softmax(logits / T))`` averaged over the batch; items whose label
    is -1 (augmented, no gold label) count in the soft term only."""
    import paddle
    import paddle.nn.functional as F

    logits = logits.astype("float32")
    log_p = F.log_softmax(logits / temperature, axis=-1)
    soft_term = -(paddle.to_tensor(soft) * log_p).sum(axis=-1).mean() * temperature**2
    gold = np.flatnonzero(labels >= 0)
    if len(gold) == 0:
        return soft_weight * soft_term
    picked = paddle.gather(logits, paddle.to_tensor(gold))
    hard_term = F.cross_entropy(picked, paddle.to_tensor(labels[gold])) * (len(gold) / len(labels))
    return (1.0 - soft_weight) * hard_term + soft_weight * soft_term
