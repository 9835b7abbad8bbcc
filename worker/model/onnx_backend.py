"""The ONNX Runtime backend: an ONNX export (``sentiment-worker export --format onnx``) or its INT8
quantization (``sentiment-worker quantize``) run by an ``onnxruntime.InferenceSession``.

CPU: the CPU execution provider with all graph optimizations, ``cpu_threads`` intra-op threads (they sleep
instead of spinning when ``OMP_WAIT_POLICY=PASSIVE``, the default of `run` and `serve`).
GPU: the CUDA provider (needs the ``onnxruntime-gpu`` build; refused loudly when it is missing). The graph
takes ``input_ids`` and ``attention_mask`` (int64 [batch, seq], both dims dynamic) and returns float32
probabilities [batch, labels] — the same computation as the other backends.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from worker.model.classifier import ExportedParts, TextClassifierBase
from worker.model.device import DeviceChoice

ONNX_FILE = "model.onnx"
PRECISIONS = ("float32", "int8")


def is_onnx_dir(directory: Path) -> bool:
    """True when ``directory`` holds an ONNX model made by ``export --format onnx`` or ``quantize``."""
    return (directory / ONNX_FILE).is_file()


@dataclass(frozen=True)
class OnnxOptions:
    """Session settings on CPU: `cpu_threads` in all, `threads_per_call` of them (the session's intra-op
    threads) in each model call, so ``parallel_calls`` calls run side by side."""

    cpu_threads: int = 1
    threads_per_call: int | None = 1
    """1, as the `cpu_threads_per_call` setting; None: all `cpu_threads` in one call at a time."""

    @property
    def intra_op_threads(self) -> int:
        return max(1, min(self.threads_per_call or self.cpu_threads, self.cpu_threads))

    @property
    def parallel_calls(self) -> int:
        return max(1, self.cpu_threads // self.intra_op_threads)


def providers_for(device: DeviceChoice) -> list[str]:
    """Execution providers for ``device``; raises RuntimeError when the GPU one is not installed."""
    if device.kind != "gpu":
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise RuntimeError(
            f"device is {device.paddle_device} but onnxruntime offers only {available}: install the "
            "onnxruntime-gpu build matching your CUDA, or set SENTIMENT_DEVICE=cpu"
        )
    device_id = int(device.paddle_device.split(":")[1]) if ":" in device.paddle_device else 0
    return [f"CUDAExecutionProvider:{device_id}", "CPUExecutionProvider"]


def make_session(path: Path, device: DeviceChoice, options: OnnxOptions) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``path`` on ``device``."""
    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session_options.intra_op_num_threads = options.intra_op_threads
    session_options.inter_op_num_threads = 1
    session_options.log_severity_level = 3  # errors only: ORT warns about every unused initializer
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        # The wait policy Paddle's OpenMP threads follow (`run` and `serve` set it): ORT's own intra-op
        # threads then sleep instead of spinning on the cores the poll loop needs, between the operators of a
        # batch too. Spinning inside a batch only (`session.force_spinning_stop`) labels a 256-review window
        # 1.4x as fast in isolation, but `serve` lost with it (2 alternated rounds, fast INT8 model, 2-core
        # Xeon: c=64 303/322 against 432/386 req/s, 5.0 against 3.6-4.0 ms of CPU a request), and the
        # drain moved within noise; kept off.
        session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers: list[Any] = []
    for name in providers_for(device):
        provider, _, device_id = name.partition(":")
        providers.append((provider, {"device_id": int(device_id)}) if device_id else provider)
    return ort.InferenceSession(str(path), sess_options=session_options, providers=providers)


ONNX_CPU_CALL_OVERHEAD_TOKENS = 32


class OnnxClassifier(TextClassifierBase):
    """An ONNX model behind an ONNX Runtime session; the same interface as the Paddle backends.

    ``precision`` is ``float32`` or ``int8`` (from the directory's metadata). ``predict_ids`` may be
    called from any thread (ORT sessions are thread-safe); at most ``parallel_calls`` run at once, each on
    the session's intra-op threads, so callers don't oversubscribe the cores.
    """

    backend = "onnx"

    def __init__(
        self,
        *,
        session: Any,
        parts: ExportedParts,
        device: DeviceChoice,
        options: OnnxOptions,
        precision: str = "float32",
    ) -> None:
        self._identify_export(parts, device, "ONNX graph", [i.name for i in session.get_inputs()])
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.options = options
        self.precision = precision
        # Measured on the fast model (ONNX Runtime INT8, 2 Xeon cores): a call costs ~0.25 ms + ~0.01 ms per
        # padded token, so one call is worth ~25-30 tokens. Cutting by it labelled 32-review windows 2.1x and
        # 256-review windows 1.06-1.10x as fast as the fewest batches, on both shipped models
        # (benchmarks/results/2026-12-03-batch-planner-cut-by-call-cost-xeon.md).
        self.call_overhead_tokens = ONNX_CPU_CALL_OVERHEAD_TOKENS if device.kind == "cpu" else None
        # Two single-threaded calls side by side labelled 1.2-1.4x the reviews/s of one call on two threads
        # (fast model, ORT INT8, 256-review windows, 2-core Xeon): small batches of short reviews split
        # poorly across threads, and sleeping intra-op threads wake once per operator.
        self.parallel_calls = options.parallel_calls if device.kind == "cpu" else 1
        self._session = session
        self._calls = threading.BoundedSemaphore(self.parallel_calls)
        self._output = session.get_outputs()[0].name

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """Label probabilities for already-tokenized inputs, float32 [n, num_labels] (padding masked)."""
        return self._predict_padded(batch, self._call_model)

    def _call_model(self, ids: np.ndarray, mask: np.ndarray) -> Any:
        with self._calls:
            (out,) = self._session.run([self._output], {"input_ids": ids, "attention_mask": mask})
        return out

    def __repr__(self) -> str:
        return (
            f"OnnxClassifier(name={self.name!r}, version={self.version!r}, labels={self.labels}, "
            f"precision={self.precision}, max_seq_len={self.max_seq_len}, "
            f"device={self.device.paddle_device}, "
            f"options={self.options}, tokenizer={self._encoder.tokenizer.kind}, long_text={self.long_text})"
        )
