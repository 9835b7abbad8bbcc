"""A loaded ERNIE sequence classifier: tokenization to ids and batched, no-grad inference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from worker.model.device import DeviceChoice

DEFAULT_LABELS = ["negative", "positive"]


class SentimentClassifier:
    """Wraps a PaddleNLP ``ErnieForSequenceClassification`` and its tokenizer.

    ``labels[i]`` is the name of label id ``i``. Inputs are truncated to ``max_seq_len`` tokens including
    [CLS] and [SEP]. Probabilities come back as float32 arrays of shape [n, len(labels)].
    """

    def __init__(
        self,
        *,
        model: Any,
        tokenizer: Any,
        name: str,
        version: str,
        labels: Sequence[str],
        max_seq_len: int,
        device: DeviceChoice,
    ) -> None:
        if max_seq_len < 3:
            raise ValueError(f"max_seq_len must be at least 3 ([CLS] x [SEP]), got {max_seq_len}")
        self.name = name
        self.version = version
        self.labels = list(labels)
        self.max_seq_len = max_seq_len
        self.device = device
        self._model = model
        self._tokenizer = tokenizer
        self._cls_id = int(tokenizer.cls_token_id)
        self._sep_id = int(tokenizer.sep_token_id)
        self._pad_id = int(tokenizer.pad_token_id)
        self._unk_id = int(tokenizer.unk_token_id)
        self._model.eval()

    @property
    def pad_id(self) -> int:
        """The id used to pad batches."""
        return self._pad_id

    @property
    def tokenizer(self) -> Any:
        """The underlying PaddleNLP tokenizer (for tokenization strategies built on top)."""
        return self._tokenizer

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text: [CLS] + tokens + [SEP], tokens cut so the total is at most ``max_seq_len``."""
        tok = self._tokenizer
        keep = self.max_seq_len - 2
        out: list[list[int]] = []
        for text in texts:
            ids = tok.convert_tokens_to_ids(tok.tokenize(text))
            out.append([self._cls_id, *ids[:keep], self._sep_id])
        return out

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """Label probabilities for already-tokenized inputs, float32 [n, num_labels].

        Sequences are right-padded to the batch's longest with the pad id; padding is masked out, so a
        text's probabilities do not depend on what it is batched with.
        """
        import paddle

        n = len(batch)
        if n == 0:
            return np.zeros((0, len(self.labels)), dtype=np.float32)
        longest = max(len(seq) for seq in batch)
        if longest == 0:
            raise ValueError("empty token sequence in batch")
        if longest > self.max_seq_len:
            raise ValueError(f"sequence of {longest} tokens exceeds max_seq_len={self.max_seq_len}")
        ids = np.full((n, longest), self._pad_id, dtype=np.int64)
        mask = np.zeros((n, longest), dtype=np.int64)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        with paddle.no_grad():
            input_ids = paddle.to_tensor(ids)
            logits = self._model(
                input_ids,
                token_type_ids=paddle.zeros_like(input_ids),
                attention_mask=paddle.to_tensor(mask),
            )
            if isinstance(logits, (tuple, list)):
                logits = logits[0]
            probs = paddle.nn.functional.softmax(logits.astype("float32"), axis=-1).numpy()
        probs = np.asarray(probs, dtype=np.float32)
        assert probs.shape == (n, len(self.labels)), f"model returned {probs.shape} for {n} inputs"
        return probs

    def predict_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Tokenize and classify ``texts`` in one batch; float32 [n, num_labels] probabilities."""
        return self.predict_ids(self.token_ids(texts))

    def __repr__(self) -> str:
        return (
            f"SentimentClassifier(name={self.name!r}, version={self.version!r}, labels={self.labels}, "
            f"max_seq_len={self.max_seq_len}, device={self.device.paddle_device})"
        )
