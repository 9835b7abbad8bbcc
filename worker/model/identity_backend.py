"""The identity backend: a model directory's real tokenizer and long-text layout, and no model at all. Its
`predict_ids` returns fixed probabilities at once, so a worker serving it measures what the host path costs
apart from inference (polling, decoding, tokenization, batching, publishing, committing), as the identity
backend Triton ships serves its perf analyzer. `bench --host-ceiling` runs it.

It is an instrument, never a service: `backend=auto` never picks it, loading refuses it unless
`allow_identity_model` is set, and every result names the model `identity` (its version names the directory
whose tokenizer it used). The label is meaningless by design: label `len(sequence) % len(labels)` gets
2/(k+1) and every other label 1/(k+1) (k labels), a function of the input alone, so tests can check that
each output stays with its input.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from worker.model.classifier import TextClassifierBase
from worker.model.device import DeviceChoice
from worker.model.long_text import SequenceEncoder
from worker.model.onnx_backend import ONNX_CPU_CALL_OVERHEAD_TOKENS, OnnxOptions

IDENTITY_MODEL_NAME = "identity"
"""The model name every result of the identity backend carries."""


def identity_version(source_name: str, source_version: str) -> str:
    """The identity model's version: the directory whose tokenizer it uses (results of two tokenizers
    differ in their token counts and so in their meaningless labels)."""
    return f"tokenizer-of-{source_name}@{source_version}"


class IdentityClassifier(TextClassifierBase):
    """Tokenizes as the directory's model would, then answers without inference (see the module docstring).

    Shaped like the served default on CPU (ONNX Runtime): the same call overhead for the batch planner and
    the same number of calls side by side (`cpu_threads // threads_per_call`), so the engine cuts and
    spreads batches as it would for the real model.
    """

    backend = "identity"

    def __init__(
        self,
        *,
        encoder: SequenceEncoder,
        pad_id: int,
        source_name: str,
        source_version: str,
        labels: Sequence[str],
        max_seq_len: int,
        device: DeviceChoice,
        options: OnnxOptions,
    ) -> None:
        self._identify(name=IDENTITY_MODEL_NAME, version=identity_version(source_name, source_version),
                       labels=labels, max_seq_len=max_seq_len, device=device, encoder=encoder, tokenizer=None,
                       pad_id=pad_id)  # fmt: skip
        if not labels:
            raise ValueError("the identity model needs at least one label name")
        self.source_name = source_name
        self.call_overhead_tokens = ONNX_CPU_CALL_OVERHEAD_TOKENS if device.kind == "cpu" else None
        self.parallel_calls = options.parallel_calls if device.kind == "cpu" else 1

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """Fixed probabilities, float32 [n, labels]: 2/(k+1) for label `len(sequence) % k`, 1/(k+1) for the
        others. No padding, no model."""
        n, k = len(batch), len(self.labels)
        probs = np.full((n, k), 1.0 / (k + 1), dtype=np.float32)
        if n:
            lengths = np.fromiter((len(seq) for seq in batch), dtype=np.int64, count=n)
            probs[np.arange(n), lengths % k] += np.float32(1.0 / (k + 1))
        return probs

    def __repr__(self) -> str:
        return (
            f"IdentityClassifier(name={self.name!r}, version={self.version!r}, labels={self.labels}, "
            f"max_seq_len={self.max_seq_len}, parallel_calls={self.parallel_calls}, "
            f"tokenizer={self._encoder.tokenizer.kind}, long_text={self.long_text}: NO INFERENCE)"
        )
