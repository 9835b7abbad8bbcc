"""The shape of inference batches for the device the model runs on (pure logic), and the mean text length the
Kafka door's window shape (`worker.kafka.window_shape`) reads.

On CPU the measured defaults hold: a batch has at most `max_batch_size` texts within the token budget, a
window at most `max_window_messages` messages. On a GPU a count is the wrong bound (measured with this model
on an H200: batches capped at 32 texts and 4,096 tokens label ~5,900 reviews/s, batches bounded only by a
budget of 65,536 tokens ~42,000/s), so there, unless the user sets them:
- a batch is bounded by the token budget alone (`batch_size_cap` is None; with TensorRT it stays
  `max_batch_size`, the largest batch its engine is built for);
- a Kafka window grows to about one batch's worth of texts (`worker.kafka.window_shape.WindowShape`): the
  token budget over the mean tokens per text labelled so far, at least `max_window_messages`;
  `max_wait_ms` still bounds how long its first message waits, so a trickle leaves as before and a backlog
  fills GPU-sized batches.
"""

from __future__ import annotations

from worker.config import BatchingSettings, ModelSettings
from worker.inference.classifier import Classifier

LENGTH_MEMORY_TEXTS = 20_000
"""`TextLengths` weighs about the last this many texts (older ones fade by halves)."""


def on_gpu(classifier: Classifier | object) -> bool:
    """True when the classifier's device (`classifier.device.kind`) is a GPU; anything else is CPU."""
    return getattr(getattr(classifier, "device", None), "kind", "cpu") == "gpu"


def batch_size_cap(
    batching: BatchingSettings, model: ModelSettings, classifier: Classifier | object
) -> int | None:
    """Most texts in one inference batch: `max_batch_size` on CPU; on a GPU None (the token budget alone
    bounds a batch) unless `max_batch_size` is set or TensorRT is on (its engine takes batches up to
    `max_batch_size`)."""
    if not on_gpu(classifier) or batching.max_batch_size_given or model.use_tensorrt:
        return batching.max_batch_size
    return None


class TextLengths:
    """The mean tokens per text of what was labelled, weighing about the last `memory_texts` texts (a
    text's tokens: all its sequences', [CLS] and [SEP] included). Not thread-safe: the caller locks."""

    def __init__(self, memory_texts: int = LENGTH_MEMORY_TEXTS) -> None:
        if memory_texts < 1:
            raise ValueError(f"memory_texts must be >= 1, got {memory_texts}")
        self._memory_texts = memory_texts
        self._texts = 0.0
        self._tokens = 0.0

    def observe(self, texts: int, tokens: int) -> None:
        """`texts` more texts, `tokens` tokens in all."""
        self._texts += texts
        self._tokens += tokens
        while self._texts > self._memory_texts:
            self._texts /= 2
            self._tokens /= 2

    @property
    def mean(self) -> float | None:
        """Tokens per text; None before anything was observed."""
        return self._tokens / self._texts if self._texts else None
