"""Model wrappers for fault tests: the real tiny model, failing or stalling on reviews that carry a marker.

They wrap a `Classifier` (token_ids + predict_ids) and recognise a marked review by its token ids (the
model sees ids, not text): `token_ids` remembers the ids of every text containing the marker, and
`predict_ids` misbehaves for any batch holding one of them. Everything else goes to the real model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

OOM_MARKER = "内存不足测试"
SLOW_MARKER = "慢速窗口测试"


class _Marked:
    def __init__(self, inner: Any, marker: str) -> None:
        self._inner, self._marker = inner, marker
        self._marked: set[tuple[int, ...]] = set()
        self._lock = threading.Lock()
        self.labels, self.name, self.version = inner.labels, inner.name, inner.version
        self.call_overhead_tokens = inner.call_overhead_tokens
        self.parallel_calls = inner.parallel_calls
        self.device = getattr(inner, "device", None)

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        ids = list(self._inner.token_ids(texts))
        with self._lock:
            self._marked.update(
                tuple(row) for text, row in zip(texts, ids, strict=True) if self._marker in text
            )
        return ids

    def _holds_marked(self, batch: Sequence[Sequence[int]]) -> bool:
        with self._lock:
            return any(tuple(row) in self._marked for row in batch)


def paddle_out_of_memory() -> MemoryError:
    """The error Paddle itself raises when an allocation fails: a `MemoryError` (Paddle maps its
    ResourceExhausted status to it) with Paddle's message, obtained by asking Paddle's CPU allocator for
    1 TiB. Where the OS would grant that (overcommit_memory=1), Paddle's CUDA allocator's message instead
    (paddle/phi/core/memory/allocation/cuda_allocator.cc)."""
    import paddle

    try:
        paddle.empty([2**38], dtype="float32")
    except MemoryError as exc:  # "(ResourceExhausted) Fail to alloc memory of 1099511627776 size, ..."
        return exc
    return MemoryError(
        "(ResourceExhausted) \n\nOut of memory error on GPU 0. Cannot allocate 1.000000TB memory on GPU 0, "
        "7.500000GB memory has been allocated and available memory is only 512.000000MB.\n\n"
        "Please check whether there is any other process using GPU 0.\n"
        "1. If yes, please stop them, or start PaddlePaddle on another GPU.\n"
        "2. If no, please decrease the batch size of your model. \n\n"
        " (at /paddle/paddle/phi/core/memory/allocation/cuda_allocator.cc:86)"
    )


class OutOfMemoryOn(_Marked):
    """Raises Paddle's own out-of-memory error for every batch holding a review with `OOM_MARKER`."""

    def __init__(self, inner: Any, marker: str = OOM_MARKER) -> None:
        super().__init__(inner, marker)
        self.raised = 0

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        if self._holds_marked(batch):
            self.raised += 1
            raise paddle_out_of_memory()
        return np.asarray(self._inner.predict_ids(batch))


class StallOn(_Marked):
    """Takes `stall_s` seconds (sleeping) for every batch holding a review with `SLOW_MARKER`."""

    def __init__(
        self,
        inner: Any,
        stall_s: float,
        marker: str = SLOW_MARKER,
        on_stall: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(inner, marker)
        self.stall_s = stall_s
        self._on_stall = on_stall

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        if self._holds_marked(batch):
            self._on_stall()
            time.sleep(self.stall_s)
        return np.asarray(self._inner.predict_ids(batch))
