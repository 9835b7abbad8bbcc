"""The static backend: an exported model (``sentiment-worker export``) run by a Paddle Inference Predictor.

CPU: oneDNN kernels and fused passes (``enable_mkldnn``), ``cpu_threads`` math threads, optionally bfloat16
(``use_bf16``: oneDNN's bf16 kernels, refused on CPUs without native bf16 support). GPU: the CUDA
predictor, optionally FP16 and TensorRT (dynamic shapes from 1×1 to max_batch_size×max_seq_len).
The exported graph takes ``input_ids`` and ``attention_mask`` (int64 [batch, seq], both dims dynamic) and
returns float32 probabilities [batch, labels] — the same computation as the dygraph backend.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.classifier import INPUT_NAMES, ExportedParts, TextClassifierBase
from worker.model.device import DeviceChoice

MODEL_PREFIX = "inference"
PARAMS_FILE = f"{MODEL_PREFIX}.pdiparams"
GRAPH_FILES = (f"{MODEL_PREFIX}.json", f"{MODEL_PREFIX}.pdmodel")  # PIR (Paddle 3), legacy program
# oneDNN caches kernels per input shape; the worker's batches vary in both dims, so keep the cache bounded.
ONEDNN_CACHE_SHAPES = 32


def graph_file(directory: Path) -> Path | None:
    """The exported graph file of ``directory`` (PIR JSON or legacy program), or None."""
    for name in GRAPH_FILES:
        if (directory / name).is_file():
            return directory / name
    return None


def cpu_has_bf16() -> bool:
    """True when Paddle's oneDNN runs bfloat16 natively on this CPU (AVX512-BF16 or AMX)."""
    from paddle.base import core

    return bool(core.supports_bfloat16_fast_performance())


def is_exported_dir(directory: Path) -> bool:
    """True when ``directory`` holds an exported inference model (graph + parameters)."""
    return graph_file(directory) is not None and (directory / PARAMS_FILE).is_file()


@dataclass(frozen=True)
class StaticOptions:
    """Predictor settings: CPU threads and bfloat16; on GPU FP16, TensorRT and the largest batch shape."""

    cpu_threads: int = 1
    use_onednn: bool = True
    use_bf16: bool = False
    use_fp16: bool = False
    use_tensorrt: bool = False
    max_batch_size: int = 32
    gpu_memory_pool_mb: int = 256


def make_config(directory: Path, device: DeviceChoice, options: StaticOptions, max_seq_len: int) -> Any:
    """The ``paddle.inference.Config`` for an exported directory on ``device``."""
    from paddle import inference

    graph = graph_file(directory)
    if graph is None:
        raise FileNotFoundError(f"no {' or '.join(GRAPH_FILES)} in {directory}")
    config = inference.Config(str(graph), str(directory / PARAMS_FILE))
    config.disable_glog_info()
    config.switch_ir_optim(True)
    # No enable_memory_optim(): with PIR graphs Paddle 3.3 fails to create the predictor with it on.
    if device.kind == "gpu":
        device_id = int(device.paddle_device.split(":")[1]) if ":" in device.paddle_device else 0
        precision = inference.PrecisionType.Half if options.use_fp16 else inference.PrecisionType.Float32
        config.enable_use_gpu(options.gpu_memory_pool_mb, device_id, precision)
        if options.use_tensorrt:
            config.enable_tensorrt_engine(
                workspace_size=1 << 30,
                max_batch_size=options.max_batch_size,
                min_subgraph_size=3,
                precision_mode=precision,
                use_static=False,
                use_calib_mode=False,
            )
            shape_min = {name: [1, 1] for name in INPUT_NAMES}
            shape_max = {name: [options.max_batch_size, max_seq_len] for name in INPUT_NAMES}
            shape_opt = {name: [options.max_batch_size, max(1, max_seq_len // 2)] for name in INPUT_NAMES}
            config.set_trt_dynamic_shape_info(shape_min, shape_max, shape_opt)
    else:
        config.disable_gpu()
        config.set_cpu_math_library_num_threads(max(1, options.cpu_threads))
        if options.use_onednn:
            config.enable_mkldnn()
            config.set_mkldnn_cache_capacity(ONEDNN_CACHE_SHAPES)
        if options.use_bf16:
            if not (options.use_onednn and cpu_has_bf16()):
                raise ValueError(
                    "use_bf16 needs oneDNN and a CPU with native bfloat16 (AVX512-BF16 or AMX); this one has "
                    "none: unset SENTIMENT_USE_BF16"
                )
            config.enable_mkldnn_bfloat16()
    return config


STATIC_CPU_CALL_OVERHEAD_TOKENS = 320


class StaticClassifier(TextClassifierBase):
    """An exported model behind a Paddle Inference Predictor; the same interface as SentimentClassifier.

    ``predict_ids`` may be called from any thread, one call at a time (a lock serializes the predictor,
    which is not re-entrant).
    """

    backend = "static"

    def __init__(
        self,
        *,
        predictor: Any,
        parts: ExportedParts,
        device: DeviceChoice,
        options: StaticOptions,
    ) -> None:
        names = list(predictor.get_input_names())
        self._identify_export(parts, device, "exported graph", names)
        self.options = options
        self.precision = "bfloat16" if options.use_bf16 else "float16" if options.use_fp16 else "float32"
        # Measured on the fast model (Paddle Inference fp32, 2 Xeon cores): ~2.5 ms per call + ~0.007 ms per
        # padded token, so one call is worth ~300-350 tokens.
        self.call_overhead_tokens = STATIC_CPU_CALL_OVERHEAD_TOKENS if device.kind == "cpu" else None
        self._predictor = predictor
        self._lock = threading.Lock()
        self._inputs = {name: predictor.get_input_handle(name) for name in names}
        self._output = predictor.get_output_handle(predictor.get_output_names()[0])

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """Label probabilities for already-tokenized inputs, float32 [n, num_labels] (padding masked)."""
        return self._predict_padded(batch, self._call_model)

    def _call_model(self, ids: np.ndarray, mask: np.ndarray) -> Any:
        with self._lock:
            for name, array in (("input_ids", ids), ("attention_mask", mask)):
                handle = self._inputs[name]
                handle.reshape(list(array.shape))
                handle.copy_from_cpu(array)
            self._predictor.run()
            return self._output.copy_to_cpu()

    def __repr__(self) -> str:
        return (
            f"StaticClassifier(name={self.name!r}, version={self.version!r}, labels={self.labels}, "
            f"max_seq_len={self.max_seq_len}, device={self.device.paddle_device}, options={self.options}, "
            f"tokenizer={self._encoder.tokenizer.kind}, long_text={self.long_text})"
        )
