"""Reviews longer than the model's window: token layouts (truncate, head_tail, chunk) and chunk averaging.

A layout is [CLS] + content ids + [SEP], at most ``max_seq_len`` ids, so ``max_seq_len - 2`` content ids.

- ``truncate``: the first content ids.
- ``head_tail``: the first quarter and the last three quarters of the budget. Sun, Qiu, Xu & Huang, "How to
  Fine-Tune BERT for Text Classification?" (CCL 2019, arXiv:1905.05583, §5.3.1) found head+tail (128 head
  + 382 tail tokens of 510) best among truncation methods on IMDb reviews and on Sogou News (Chinese), and
  better than hierarchical chunk pooling; reviews tend to end with the verdict ("总之…不推荐"). We found no
  study specific to Chinese product reviews that contradicts it, so we keep their 1:3 ratio.
- ``chunk``: overlapping windows of ``max_seq_len - 2`` content ids whose starts are ``stride`` ids apart
  (the last window is aligned to the end, so no tail is left short); the model labels each window and the
  probabilities are averaged — one result per input, at the cost of more inference per long review.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeVar

import numpy as np

from worker.model.fast_tokenizer import ContentTokenizer

LongTextMode = Literal["truncate", "head_tail", "chunk"]
LONG_TEXT_MODES: tuple[LongTextMode, ...] = ("truncate", "head_tail", "chunk")
HEAD_SHARE = 0.25  # of the content budget; the rest is the tail (Sun et al. 2019: 128 of 510)

F = TypeVar("F")


def head_tail_sizes(budget: int) -> tuple[int, int]:
    """(head, tail) content ids kept from a too-long text for a content ``budget`` (≥ 0)."""
    head = int(budget * HEAD_SHARE)
    return head, budget - head


def single_layout(
    content: Sequence[int], *, cls_id: int, sep_id: int, max_seq_len: int, mode: str
) -> list[int]:
    """One sequence for a text: truncate keeps the head, head_tail (and chunk's single view) head + tail."""
    budget = max_seq_len - 2
    if len(content) <= budget:
        kept = list(content)
    elif mode == "truncate":
        kept = list(content[:budget])
    else:
        head, tail = head_tail_sizes(budget)
        kept = [*content[:head], *content[len(content) - tail :]] if tail else list(content[:head])
    return [cls_id, *kept, sep_id]


def chunk_starts(length: int, window: int, stride: int) -> list[int]:
    """Start offsets of the windows covering ``length`` ids: 0, stride, ..., and one ending at the end."""
    if window < 1 or not 1 <= stride <= window:
        raise ValueError(f"need 1 <= stride <= window, got stride={stride} window={window}")
    if length <= window:
        return [0]
    starts = list(range(0, length - window, stride))
    starts.append(length - window)
    return starts


def chunk_layouts(
    content: Sequence[int], *, cls_id: int, sep_id: int, max_seq_len: int, stride: int
) -> list[list[int]]:
    """[CLS] + window + [SEP] for every window of the text (one window when it fits)."""
    window = max_seq_len - 2
    return [
        [cls_id, *content[start : start + window], sep_id]
        for start in chunk_starts(len(content), window, stride)
    ]


def default_stride(max_seq_len: int) -> int:
    """Half a window: every content id is seen by up to two windows."""
    return max(1, (max_seq_len - 2) // 2)


class SequenceEncoder:
    """Texts → model inputs for one long-text mode: ``token_ids`` (one sequence per text) and
    ``token_id_chunks`` (per text its sequences: several only in chunk mode)."""

    def __init__(
        self,
        tokenizer: ContentTokenizer,
        *,
        cls_id: int,
        sep_id: int,
        max_seq_len: int,
        mode: LongTextMode = "head_tail",
        stride: int | None = None,
    ) -> None:
        if mode not in LONG_TEXT_MODES:
            raise ValueError(f"long_text must be one of {', '.join(LONG_TEXT_MODES)}; got {mode!r}")
        if max_seq_len < 3:
            raise ValueError(f"max_seq_len must be at least 3 ([CLS] x [SEP]), got {max_seq_len}")
        window = max_seq_len - 2
        chosen = default_stride(max_seq_len) if stride is None else stride
        if not 1 <= chosen <= window:
            raise ValueError(
                f"chunk_stride_tokens must be between 1 and max_seq_len - 2 = {window} (else windows leave "
                f"gaps), got {chosen}"
            )
        self.tokenizer = tokenizer
        self.mode: LongTextMode = mode
        self.max_seq_len = max_seq_len
        self.stride = chosen
        self._cls_id = cls_id
        self._sep_id = sep_id

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """One sequence per text (chunk mode: the head_tail view, for callers that need one)."""
        return [
            single_layout(
                c, cls_id=self._cls_id, sep_id=self._sep_id, max_seq_len=self.max_seq_len, mode=self.mode
            )
            for c in self.tokenizer.encode_batch(texts)
        ]

    def token_id_chunks(self, texts: Sequence[str]) -> list[list[list[int]]]:
        """Per text, the sequences to label and average: one, or in chunk mode one per window."""
        if self.mode != "chunk":
            return [[row] for row in self.token_ids(texts)]
        return [
            chunk_layouts(
                c, cls_id=self._cls_id, sep_id=self._sep_id, max_seq_len=self.max_seq_len, stride=self.stride
            )
            for c in self.tokenizer.encode_batch(texts)
        ]


def flatten_chunks(chunks: Sequence[Sequence[list[int]]]) -> tuple[list[list[int]], list[int]]:
    """(all sequences in text order, number of sequences per text)."""
    flat = [row for per_text in chunks for row in per_text]
    return flat, [len(per_text) for per_text in chunks]


def merge_chunk_outputs(outputs: Sequence[np.ndarray | F], counts: Sequence[int]) -> list[np.ndarray | F]:
    """One output per text from per-sequence outputs laid out as ``flatten_chunks`` made them.

    Probabilities of a text's sequences are averaged (a single sequence's row is returned as is); if any of
    its sequences failed, the text gets the first failure, so it is dead-lettered rather than half-labelled.
    """
    if sum(counts) != len(outputs):
        raise ValueError(f"{len(outputs)} outputs for {sum(counts)} sequences")
    merged: list[np.ndarray | F] = []
    position = 0
    for count in counts:
        if count < 1:
            raise ValueError("every text has at least one sequence")
        rows = outputs[position : position + count]
        position += count
        arrays = [row for row in rows if isinstance(row, np.ndarray)]
        if len(arrays) < count:
            merged.append(next(row for row in rows if not isinstance(row, np.ndarray)))
        elif count == 1:
            merged.append(arrays[0])
        else:
            merged.append(np.mean(np.stack(arrays), axis=0, dtype=np.float64).astype(np.float32))
    return merged
