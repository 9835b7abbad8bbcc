"""What the tuner measures with: device-memory probes (GPU) and throughput probes (the real model)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from worker.inference.classifier import Classifier


class MemoryProbe(Protocol):
    """Measures the device memory the real model needs for one batch shape."""

    def peak_bytes(self, batch_size: int, seq_len: int) -> int:
        """Peak allocated device bytes while running a [batch_size, seq_len] batch (stats reset first).

        Raises the framework's out-of-memory error when the batch does not fit.
        """
        ...

    def device_total_bytes(self) -> int:
        """The device's total memory in bytes."""
        ...


class ThroughputProbe(Protocol):
    """Times the real model on one batch shape."""

    parallel_calls: int
    """Calls timed side by side (the classifier's `parallel_calls`): the model labels that many batches
    in the seconds `batch_seconds` reports."""

    def batch_seconds(self, batch_size: int, seq_len: int) -> float:
        """Seconds of one inference call on a [batch_size, seq_len] batch (warm), with `parallel_calls`
        such calls running side by side."""
        ...


def synthetic_batch(classifier: Classifier, batch_size: int, seq_len: int) -> list[list[int]]:
    """`batch_size` copies of a real-token sequence of exactly `seq_len` ids ([CLS] … [SEP])."""
    if seq_len < 3:
        raise ValueError(f"seq_len must be at least 3, got {seq_len}")
    empty = classifier.token_ids([""])[0]
    cls_id, sep_id = empty[0], empty[-1]
    word = classifier.token_ids(["好"])[0]
    filler = word[1] if len(word) == 3 else sep_id
    row = [cls_id, *([filler] * (seq_len - 2)), sep_id]
    return [row] * batch_size


PADDLE_BACKENDS = frozenset({"dynamic", "static"})
"""The backends whose device memory `PaddleCudaMemoryProbe` sees (ONNX Runtime allocates its own)."""


def memory_is_measured(classifier: Classifier | object) -> bool:
    """True when the real GPU probe sees the classifier's device memory: a Paddle backend."""
    return getattr(classifier, "backend", "dynamic") in PADDLE_BACKENDS


class PaddleCudaMemoryProbe:
    """The real GPU probe: Paddle's CUDA allocator statistics around one `predict_ids` call."""

    def __init__(self, classifier: Classifier, device_index: int = 0) -> None:
        self._classifier = classifier
        self._index = device_index

    def peak_bytes(self, batch_size: int, seq_len: int) -> int:
        import paddle

        cuda = paddle.device.cuda
        batch = synthetic_batch(self._classifier, batch_size, seq_len)
        cuda.synchronize(self._index)
        cuda.empty_cache()
        cuda.reset_max_memory_allocated(self._index)
        try:
            self._classifier.predict_ids(batch)
            cuda.synchronize(self._index)
        except Exception:
            cuda.empty_cache()  # give back what the failed attempt cached before the next probe
            raise
        return int(cuda.max_memory_allocated(self._index))

    def device_total_bytes(self) -> int:
        import paddle

        return int(paddle.device.cuda.get_device_properties(self._index).total_memory)


class ClassifierThroughputProbe:
    """The real CPU probe: best of `repeats` timed rounds of `parallel_calls` side-by-side `predict_ids`
    calls (as the engine runs a window's batches), after one warm-up round."""

    def __init__(
        self, classifier: Classifier, *, repeats: int = 2, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._classifier = classifier
        self._repeats = max(1, repeats)
        self._clock = clock
        self.parallel_calls = max(1, classifier.parallel_calls)

    def batch_seconds(self, batch_size: int, seq_len: int) -> float:
        batch = synthetic_batch(self._classifier, batch_size, seq_len)
        with ThreadPoolExecutor(max_workers=self.parallel_calls) as lanes:

            def one_round() -> None:
                calls = [
                    lanes.submit(self._classifier.predict_ids, batch) for _ in range(self.parallel_calls)
                ]
                for call in calls:
                    call.result()

            one_round()
            best = math.inf
            for _ in range(self._repeats):
                started = self._clock()
                one_round()
                best = min(best, self._clock() - started)
        return best
