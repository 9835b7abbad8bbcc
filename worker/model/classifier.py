"""A loaded ERNIE sequence classifier (dygraph backend): tokenization to ids, batched no-grad inference."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from worker.errors import OperationError
from worker.model.device import DeviceChoice
from worker.model.fast_tokenizer import SlowErnieTokenizer, SpecialIds
from worker.model.long_text import SequenceEncoder, flatten_chunks, merge_chunk_outputs

DEFAULT_LABELS = ["negative", "positive"]
INPUT_NAMES = ("input_ids", "attention_mask")
"""What an exported graph (static or ONNX) takes: int64 [batch, seq], both dims dynamic."""


class OutputWidthError(OperationError):
    """The model gave another shape of outputs than [texts, labels]: its label names do not fit it."""

    def __init__(self, shape: tuple[int, ...], n: int, labels: Sequence[str]) -> None:
        super().__init__(f"model returned {shape} for {n} inputs and {len(labels)} labels")
        self.width = shape[-1] if len(shape) == 2 else None
        """Outputs per text, when the model gave one row per text."""


class ExportedParts(NamedTuple):
    """What every exported directory gives its classifier, whatever runs the graph."""

    tokenizer: Any
    """PaddleNLP's ErnieTokenizer; None when the export's checked fast tokenizer serves (no PaddleNLP)."""
    encoder: SequenceEncoder
    pad_id: int
    max_seq_len: int
    name: str
    version: str
    labels: list[str]


class TextClassifierBase:
    """What both backends share: texts → ids through a ``SequenceEncoder`` (fast or slow tokenizer, a
    long-text layout), and ``predict_texts`` on top of the backend's ``predict_ids``."""

    name: str
    version: str
    labels: list[str]
    max_seq_len: int
    device: DeviceChoice
    _encoder: SequenceEncoder
    _tokenizer: Any | None
    _pad_id: int
    content_hash: str | None = None
    """sha256 (hex) of the model directory's manifest, which names and hashes each of its files (set by
    `load_classifier` after verifying them; None for a PaddleNLP hub name)."""
    call_overhead_tokens: int | None = None
    """The fixed cost of one model call, in padded tokens, for the batch planner (`plan_batches`): a
    window is cut into more, tighter batches while that saves more padding than this per extra call.
    None: pack as few batches as the bounds allow (Paddle's dynamic graph, and every GPU, whose calls are
    dear). Each backend sets its own from measurements on CPU."""
    parallel_calls: int = 1
    """How many ``predict_ids`` calls may run side by side to good effect: the engine (`label_ids`) runs a
    window's batches on that many threads. 1 for the Paddle backends (one call uses every thread)."""

    def _identify(
        self,
        *,
        name: str,
        version: str,
        labels: Sequence[str],
        max_seq_len: int,
        device: DeviceChoice,
        encoder: SequenceEncoder,
        tokenizer: Any | None,
        pad_id: int,
    ) -> None:
        """What every backend's constructor sets: the model's identity, device and encoding; raises
        ValueError when `encoder` does not lay out `max_seq_len` tokens."""
        if encoder.max_seq_len != max_seq_len:
            raise ValueError(f"encoder lays out {encoder.max_seq_len} tokens, model {max_seq_len}")
        self.name = name
        self.version = version
        self.labels = list(labels)
        self.max_seq_len = max_seq_len
        self.device = device
        self._encoder = encoder
        self._tokenizer = tokenizer
        self._pad_id = pad_id

    def _identify_export(
        self, parts: ExportedParts, device: DeviceChoice, graph: str, inputs: Sequence[str]
    ) -> None:
        """`_identify` for an exported backend from its directory's ``parts``; raises ValueError when the
        ``graph`` (what to call it in the message) takes other ``inputs`` than `INPUT_NAMES`."""
        self._identify(device=device, **parts._asdict())
        if sorted(inputs) != sorted(INPUT_NAMES):
            raise ValueError(f"{graph} takes {list(inputs)}, expected {list(INPUT_NAMES)}")

    @property
    def pad_id(self) -> int:
        """The id used to pad batches."""
        return self._pad_id

    @property
    def tokenizer(self) -> Any:
        """The underlying PaddleNLP tokenizer (the reference; ``encoder`` says which one encodes); None for
        an exported model served by the fast tokenizer its export checked and saved (PaddleNLP not loaded)."""
        return self._tokenizer

    @property
    def encoder(self) -> SequenceEncoder:
        """Tokenizer kind and long-text layout in use."""
        return self._encoder

    @property
    def long_text(self) -> str:
        """truncate | head_tail | chunk."""
        return self._encoder.mode

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """One sequence per text: [CLS] + tokens + [SEP], at most ``max_seq_len`` ids (long texts laid out
        by the long-text mode; chunk mode gives its head_tail view here)."""
        return self._encoder.token_ids(texts)

    def token_id_chunks(self, texts: Sequence[str]) -> list[list[list[int]]]:
        """Per text, the sequences whose probabilities are averaged into its result (several only in chunk
        mode for texts longer than ``max_seq_len``)."""
        return self._encoder.token_id_chunks(texts)

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        raise NotImplementedError

    def predict_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Tokenize and classify ``texts`` in one batch (chunks averaged); float32 [n, num_labels]."""
        flat, counts = flatten_chunks(self.token_id_chunks(texts))
        probs = self.predict_ids(flat)
        merged = merge_chunk_outputs(list(probs), counts)
        if not merged:
            return np.zeros((0, len(self.labels)), dtype=np.float32)
        return np.stack(merged).astype(np.float32, copy=False)

    def _predict_padded(
        self, batch: Sequence[Sequence[int]], run: Callable[[np.ndarray, np.ndarray], Any]
    ) -> np.ndarray:
        """What a model backend's ``predict_ids`` does around its model call ``run(ids, mask)`` (which
        returns the probabilities): nothing for an empty batch, else `_check_batch`'s padding, and the
        result as float32 checked by `_checked`."""
        n = len(batch)
        if n == 0:
            return np.zeros((0, len(self.labels)), dtype=np.float32)
        ids, mask = self._check_batch(batch)
        return self._checked(np.asarray(run(ids, mask), dtype=np.float32), n)

    def _checked(self, probs: np.ndarray, n: int) -> np.ndarray:
        """``probs`` if it is [n, len(labels)]; raises OutputWidthError otherwise."""
        if probs.shape != (n, len(self.labels)):
            raise OutputWidthError(probs.shape, n, self.labels)
        return probs

    def padded_inputs(self, batch: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
        """One batch as an exported graph takes it: ``input_ids`` right-padded to the longest sequence and
        ``attention_mask`` (int64 [n, longest])."""
        ids, mask = self._check_batch(batch)
        return {"input_ids": ids, "attention_mask": mask}

    def _check_batch(self, batch: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded int64 ids and attention mask [n, longest]; raises ValueError on bad lengths."""
        longest = max(len(seq) for seq in batch)
        if longest == 0:
            raise ValueError("empty token sequence in batch")
        if longest > self.max_seq_len:
            raise ValueError(f"sequence of {longest} tokens exceeds max_seq_len={self.max_seq_len}")
        ids = np.full((len(batch), longest), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        return ids, mask


class SentimentClassifier(TextClassifierBase):
    """Wraps a PaddleNLP ``ErnieForSequenceClassification`` (dygraph) and its tokenizer.

    ``labels[i]`` is the name of label id ``i``. Inputs are laid out in at most ``max_seq_len`` tokens
    including [CLS] and [SEP] (see worker.model.long_text). Probabilities come back as float32 arrays of
    shape [n, len(labels)]. Without an ``encoder``: the slow tokenizer and head_tail.
    """

    backend = "dynamic"

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
        encoder: SequenceEncoder | None = None,
    ) -> None:
        if max_seq_len < 3:
            raise ValueError(f"max_seq_len must be at least 3 ([CLS] x [SEP]), got {max_seq_len}")
        ids = SpecialIds.of(tokenizer)
        encoder = encoder or SequenceEncoder(
            SlowErnieTokenizer(tokenizer), cls_id=ids.cls, sep_id=ids.sep, max_seq_len=max_seq_len
        )
        self._identify(name=name, version=version, labels=labels, max_seq_len=max_seq_len, device=device,
                       encoder=encoder, tokenizer=tokenizer, pad_id=ids.pad)  # fmt: skip
        self._model = model
        self._model.eval()

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """Label probabilities for already-tokenized inputs, float32 [n, num_labels].

        Sequences are right-padded to the batch's longest with the pad id; padding is masked out, so a
        text's probabilities do not depend on what it is batched with.
        """
        return self._predict_padded(batch, self._call_model)

    def _call_model(self, ids: np.ndarray, mask: np.ndarray) -> Any:
        import paddle

        with paddle.no_grad():
            input_ids = paddle.to_tensor(ids)
            logits = self._model(
                input_ids,
                token_type_ids=paddle.zeros_like(input_ids),
                attention_mask=paddle.to_tensor(mask),
            )
            if isinstance(logits, (tuple, list)):
                logits = logits[0]
            return paddle.nn.functional.softmax(logits.astype("float32"), axis=-1).numpy()

    def __repr__(self) -> str:
        return (
            f"SentimentClassifier(name={self.name!r}, version={self.version!r}, labels={self.labels}, "
            f"max_seq_len={self.max_seq_len}, device={self.device.paddle_device}, "
            f"tokenizer={self._encoder.tokenizer.kind}, long_text={self.long_text})"
        )
