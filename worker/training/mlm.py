"""Optional masked-LM pre-training of a from-scratch model on the train split's own texts (--mlm-epochs)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from worker.training.data import bucketed_batches, pad_batch
from worker.training.options import TrainOptions
from worker.training.vocab import SPECIAL_TOKENS


def mask_tokens(
    ids: np.ndarray,
    mask: np.ndarray,
    rng: np.random.Generator,
    mask_id: int,
    first_regular_id: int,
    vocab: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BERT masking of a padded batch: 15 % of the text tokens ([CLS]/[SEP]/padding excluded) are chosen;
    80 % of those become [MASK], 10 % a random regular token, 10 % stay. Returns the corrupted ids, the
    flat positions of the chosen tokens (into ids.reshape(-1)) and their original ids."""
    text = mask.astype(bool).copy()
    text[:, 0] = False
    lengths = mask.sum(axis=1)
    text[np.arange(len(ids)), lengths - 1] = False
    chosen = text & (rng.random(ids.shape) < 0.15)
    if not chosen.any():  # at least one target per batch
        rows, cols = np.nonzero(text)
        if len(rows):
            pick = int(rng.integers(len(rows)))
            chosen[rows[pick], cols[pick]] = True
    out = ids.copy()
    roll = rng.random(ids.shape)
    out[chosen & (roll < 0.8)] = mask_id
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    out[swap] = rng.integers(first_regular_id, vocab, size=int(swap.sum()))
    positions = np.flatnonzero(chosen.reshape(-1))
    return out, positions, ids.reshape(-1)[positions]


def mlm_pretrain(
    model: Any,
    tokenizer: Any,
    train_ids: Sequence[Sequence[int]],
    options: TrainOptions,
    say: Callable[[str], None],
) -> None:
    """Masked-LM pre-training of ``model.ernie`` on the training texts (labels unused)."""
    import paddle
    import paddle.nn.functional as F
    from paddlenlp.transformers import ErnieForMaskedLM
    from paddlenlp.transformers.optimization import LinearDecayWithWarmup

    mlm = ErnieForMaskedLM(model.config)
    mlm.ernie.set_state_dict(model.ernie.state_dict())
    lengths = [len(s) for s in train_ids]
    steps = math.ceil(len(train_ids) / options.batch_size) * options.mlm_epochs
    schedule = LinearDecayWithWarmup(options.mlm_learning_rate, steps, options.warmup_fraction)
    optimizer = paddle.optimizer.AdamW(
        learning_rate=schedule,
        parameters=mlm.parameters(),
        weight_decay=options.weight_decay,
        grad_clip=paddle.nn.ClipGradByGlobalNorm(options.max_grad_norm)
        if options.max_grad_norm > 0
        else None,
    )
    rng = np.random.default_rng(options.seed)
    pad_id, vocab = int(tokenizer.pad_token_id), int(model.config.vocab_size)
    started, seen = time.monotonic(), 0
    mlm.train()
    for epoch in range(1, options.mlm_epochs + 1):
        batches = bucketed_batches(lengths, options.batch_size, random.Random(options.seed * 7 + epoch))
        total = 0.0
        for idx in batches:
            ids, mask = pad_batch([train_ids[i] for i in idx], pad_id)
            corrupted, positions, targets = mask_tokens(
                ids, mask, rng, int(tokenizer.mask_token_id), len(SPECIAL_TOKENS), vocab
            )
            t_ids = paddle.to_tensor(corrupted)
            scores = mlm(
                t_ids,
                token_type_ids=paddle.zeros_like(t_ids),
                attention_mask=paddle.to_tensor(mask),
                masked_positions=paddle.to_tensor(positions),
            )
            scores = scores[0] if isinstance(scores, (tuple, list)) else scores
            loss = F.cross_entropy(scores.reshape((-1, vocab)), paddle.to_tensor(targets))
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.clear_grad()
            total += float(loss)
            seen += len(idx)
        rate = seen / (time.monotonic() - started)
        say(
            f"mlm epoch {epoch}/{options.mlm_epochs}: masked-LM loss {total / len(batches):.4f} "
            f"{rate:.0f} seq/s"
        )
    model.ernie.set_state_dict(mlm.ernie.state_dict())
