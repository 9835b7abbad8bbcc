"""The static backend: an exported model (``sentiment-worker export``) run by a Paddle Inference Predictor.

CPU: oneDNN kernels and fused passes (``enable_mkldnn``), ``cpu_threads`` math threads. GPU: the CUDA
predictor, optionally FP16 and TensorRT (dynamic shapes from 1×1 to max_batch_size×max_seq_len).
The exported graph takes ``input_ids`` and ``attention_mask`` (int64 [batch, seq], both dims dynamic) and
returns float32 probabilities [batch, labels] — the same computation as the dygraph backend.
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.classifier import TextClassifierBase
from worker.model.device import DeviceChoice
from worker.model.long_text import SequenceEncoder

MODEL_PREFIX = "inference"
PARAMS_FILE = f"{MODEL_PREFIX}.pdiparams"
GRAPH_FILES = (f"{MODEL_PREFIX}.json", f"{MODEL_PREFIX}.pdmodel")  # PIR (Paddle 3), legacy program
INPUT_NAMES = ("input_ids", "attention_mask")
# oneDNN caches kernels per input shape; the worker's batches vary in both dims, so keep the cache bounded.
ONEDNN_CACHE_SHAPES = 32


def graph_file(directory: Path) -> Path | None:
    """The exported graph file of ``directory`` (PIR JSON or legacy program), or None."""
    for name in GRAPH_FILES:
        if (directory / name).is_file():
            return directory / name
    return None


def is_exported_dir(directory: Path) -> bool:
    """True when ``directory`` holds an exported inference model (graph + parameters)."""
    return graph_file(directory) is not None and (directory / PARAMS_FILE).is_file()


@dataclass(frozen=True)
class StaticOptions:
    """Predictor settings: CPU math threads; on GPU FP16, TensorRT and the largest batch shape."""

    cpu_threads: int = 1
    use_onednn: bool = True
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
    return config


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
        tokenizer: Any,
        encoder: SequenceEncoder,
        name: str,
        version: str,
        labels: Sequence[str],
        max_seq_len: int,
        device: DeviceChoice,
        options: StaticOptions,
    ) -> None:
        if encoder.max_seq_len != max_seq_len:
            raise ValueError(f"encoder lays out {encoder.max_seq_len} tokens, model {max_seq_len}")
        self.name = name
        self.version = version
        self.labels = list(labels)
        self.max_seq_len = max_seq_len
        self.device = device
        self.options = options
        self._predictor = predictor
        self._tokenizer = tokenizer
        self._encoder = encoder
        self._pad_id = int(tokenizer.pad_token_id)
        self._lock = threading.Lock()
        names = list(predictor.get_input_names())
        if sorted(names) != sorted(INPUT_NAMES):
            raise ValueError(f"exported graph takes {names}, expected {list(INPUT_NAMES)}")
        self._inputs = {name: predictor.get_input_handle(name) for name in names}
        self._output = predictor.get_output_handle(predictor.get_output_names()[0])

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """Label probabilities for already-tokenized inputs, float32 [n, num_labels] (padding masked)."""
        n = len(batch)
        if n == 0:
            return np.zeros((0, len(self.labels)), dtype=np.float32)
        ids, mask = self._check_batch(batch)
        with self._lock:
            for name, array in (("input_ids", ids), ("attention_mask", mask)):
                handle = self._inputs[name]
                handle.reshape(list(array.shape))
                handle.copy_from_cpu(array)
            self._predictor.run()
            probs = np.asarray(self._output.copy_to_cpu(), dtype=np.float32)
        if probs.shape != (n, len(self.labels)):
            raise RuntimeError(f"model returned {probs.shape} for {n} inputs")
        return probs

    def __repr__(self) -> str:
        return (
            f"StaticClassifier(name={self.name!r}, version={self.version!r}, labels={self.labels}, "
            f"max_seq_len={self.max_seq_len}, device={self.device.paddle_device}, options={self.options}, "
            f"tokenizer={self._encoder.tokenizer.kind}, long_text={self.long_text})"
        )


# ----- speed -----
@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs: layers, hidden and feed-forward sizes."""

    num_layers: int
    hidden_size: int
    intermediate_size: int


def encoder_flops(shape: ModelShape, seq_len: int) -> float:
    """Multiply-add FLOPs (×2) of one sequence through the encoder: Q/K/V/O projections, attention scores
    and weighted sum, feed-forward; embeddings, layer norms, softmax and the classifier head are ignored."""
    h, i, n = shape.hidden_size, shape.intermediate_size, seq_len
    per_layer = 2 * (4 * n * h * h + 2 * n * n * h + 2 * n * h * i)
    return float(shape.num_layers * per_layer)


def sgemm_flops_per_s(size: int = 1024, repeats: int = 5) -> float:
    """numpy float32 matrix multiply speed (best of ``repeats`` size×size products), FLOP/s."""
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    a @ b  # warm-up: thread pool start
    best = math.inf
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2.0 * size**3 / best


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    """Best wall time of ``repeats`` calls after one warm-up call."""
    run()
    best = math.inf
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


@dataclass(frozen=True)
class BackendSpeed:
    """Sequences/s of each backend on one [batch_size, seq_len] batch, and FLOP efficiency vs sgemm."""

    batch_size: int
    seq_len: int
    cpu_threads: int
    model_gflop_per_seq: float
    sgemm_gflop_per_s: float
    seq_per_s: dict[str, float]
    efficiency: dict[str, float]
    """Model FLOP/s ÷ numpy sgemm FLOP/s measured in the same run, per backend."""
    static_over_dynamic: float | None
    """static seq/s ÷ dynamic seq/s (None unless both ran)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly values."""
        return asdict(self)


def measure_classifiers_speed(
    classifiers: dict[str, Any],
    shape: ModelShape,
    *,
    batch_size: int = 32,
    seq_len: int = 128,
    repeats: int = 3,
    cpu_threads: int = 0,
) -> BackendSpeed:
    """Times ``predict_ids`` of each classifier (name → classifier: "dynamic", "static") on the same
    synthetic [batch_size, seq_len] batch, measures numpy sgemm in the same run, and reports seq/s and
    efficiency. ``seq_len`` must not exceed the classifiers' max_seq_len."""
    rng = np.random.default_rng(0)
    first = next(iter(classifiers.values()))
    cls_sep = first.token_ids([""])[0]
    body = rng.integers(5, 100, size=(batch_size, seq_len - 2)).tolist()  # ids present in any vocab
    batch = [[cls_sep[0], *row, cls_sep[-1]] for row in body]
    sgemm = sgemm_flops_per_s()
    flops = encoder_flops(shape, seq_len)
    rates: dict[str, float] = {}
    efficiency: dict[str, float] = {}
    for name, classifier in classifiers.items():
        seconds = best_seconds(functools.partial(classifier.predict_ids, batch), repeats)
        rates[name] = batch_size / seconds
        efficiency[name] = rates[name] * flops / sgemm
    ratio = rates["static"] / rates["dynamic"] if {"static", "dynamic"} <= rates.keys() else None
    return BackendSpeed(batch_size, seq_len, cpu_threads, flops / 1e9, sgemm / 1e9, rates, efficiency, ratio)


def measure_backend_speed(
    model_dir: str | Path,
    *,
    exported_dir: str | Path | None = None,
    batch_size: int = 32,
    seq_len: int = 128,
    repeats: int = 3,
    cpu_threads: int | None = None,
) -> BackendSpeed:
    """Dynamic vs static seq/s on CPU for a model directory (for `evaluate`'s throughput report).

    ``model_dir`` is a training directory (exported to a temporary directory unless ``exported_dir`` is
    given) or an exported one (then static only). ``seq_len`` is capped by the model's position
    embeddings. Raises ModelLoadError / ExportError when a model can't be loaded or exported.
    """
    import os
    import tempfile

    from worker.model.device import choose_device
    from worker.model.loading import InferenceOptions, load_classifier
    from worker.model.metadata import CONFIG_FILES, find_weights

    source = Path(model_dir).expanduser()
    config_path = next((source / n for n in CONFIG_FILES if (source / n).is_file()), None)
    if config_path is None:
        raise FileNotFoundError(f"no {' or '.join(CONFIG_FILES)} in {source}")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    seq_len = min(seq_len, int(config.get("max_position_embeddings") or seq_len))
    threads = cpu_threads or os.cpu_count() or 1
    cpu = choose_device("cpu")
    static_options = InferenceOptions(backend="static", tokenizer="slow", cpu_threads=threads)
    with tempfile.TemporaryDirectory(prefix="sentiment-export-") as tmp:
        classifiers: dict[str, Any] = {}
        if find_weights(source) is not None:
            dynamic_options = InferenceOptions(backend="dynamic", tokenizer="slow")
            classifiers["dynamic"] = load_classifier(
                str(source), cpu, max_seq_len=seq_len, options=dynamic_options
            )
            if exported_dir is None and not is_exported_dir(source):
                from worker.model.export import export_model

                exported_dir = export_model(source, Path(tmp) / "exported").output_dir
        static_dir = exported_dir if exported_dir is not None else source
        classifiers["static"] = load_classifier(
            str(static_dir), cpu, max_seq_len=seq_len, options=static_options
        )
        return measure_classifiers_speed(
            classifiers,
            model_shape(config),
            batch_size=batch_size,
            seq_len=seq_len,
            repeats=repeats,
            cpu_threads=threads,
        )


def model_shape(config: dict[str, Any]) -> ModelShape:
    """The shape fields of a PaddleNLP ``config.json``."""
    return ModelShape(
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
    )
