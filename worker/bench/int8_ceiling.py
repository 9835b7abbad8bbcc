"""`sentiment-worker int8-ceiling`: how much faster INT8 can be than float32 on this CPU, and why.

Issue 13 asks the best CPU backend to reach 2× Paddle Inference fp32 on the teacher, "or the note shows,
with numbers, why this CPU cannot". One run measures, on the same tokenized corpus batches:
1. where float32 ONNX Runtime spends its time (its profiler, by node): the share ``f`` of the weight
   matrix multiplications (MatMul/Gemm with an initializer input) and their bias additions (which the INT8
   graph folds into ``MatMulIntegerToFloat``), the work INT8 quantization speeds up;
2. the raw kernel speed-up ``r`` of INT8 over float32 matrix multiplication on this CPU, at the encoder's
   own shapes (batch tokens × hidden, hidden × FFN, ...): ``MatMulInteger`` on operands already in 8 bits
   against ``MatMul`` in float32 — no activation quantization, no rescaling, the most INT8 could give;
3. Amdahl's ceiling ``1 / ((1 − f) + f / r)`` over ORT float32, and the same over Paddle Inference fp32
   (× the measured ORT fp32 / Paddle fp32 ratio), beside the measured ORT INT8 speed-up.
Whole-model speeds are medians of ``repeats`` interleaved passes over the same batches.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from worker.bench.bench import review_texts
from worker.model.backend_choice import cpu_description
from worker.model.classifier import TextClassifierBase
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, load_classifier
from worker.model.onnx_backend import ONNX_FILE
from worker.training.quantize import token_batches

WEIGHT_GEMM_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul"})
PROFILE_SUFFIX = "_kernel_time"


@dataclass(frozen=True)
class CeilingOptions:
    """Sizes of one run: corpus reviews per pass, reviews per batch, timed passes, math threads."""

    texts: int = 512
    batch_size: int = 32
    repeats: int = 5
    kernel_repeats: int = 20
    cpu_threads: int = 2
    seed: int = 0


@dataclass(frozen=True)
class KernelTiming:
    """One matrix multiplication shape [m, k] × [k, n]: median ms in float32 and in INT8."""

    m: int
    k: int
    n: int
    count: int
    """How many of these one encoder layer does."""
    float32_ms: float
    int8_ms: float


@dataclass(frozen=True)
class CeilingReport:
    """What one run measured; speeds in reviews per second."""

    cpu_threads: int
    texts: int
    mean_batch_tokens: float
    cpu: str
    """The CPU model and the features that decide INT8 and bfloat16 (`cpu_description`)."""
    weight_gemm_share: float
    """f: share of float32 ORT kernel time in weight matrix multiplications and their bias additions."""
    op_shares: dict[str, float]
    """float32 ORT kernel time by op type (shares)."""
    int8_op_shares: dict[str, float]
    kernels: list[KernelTiming]
    paddle_fp32_per_s: float
    ort_fp32_per_s: float
    ort_int8_per_s: float

    @property
    def kernel_speedup(self) -> float:
        """r: INT8 over float32 for one encoder layer's weight multiplications, kernels alone."""
        fp32 = sum(k.count * k.float32_ms for k in self.kernels)
        int8 = sum(k.count * k.int8_ms for k in self.kernels)
        return fp32 / int8

    @property
    def ceiling_over_ort_fp32(self) -> float:
        f, r = self.weight_gemm_share, self.kernel_speedup
        return 1.0 / ((1.0 - f) + f / r)

    @property
    def ort_fp32_over_paddle_fp32(self) -> float:
        return self.ort_fp32_per_s / self.paddle_fp32_per_s

    @property
    def ceiling_over_paddle_fp32(self) -> float:
        return self.ceiling_over_ort_fp32 * self.ort_fp32_over_paddle_fp32

    @property
    def measured_int8_over_paddle_fp32(self) -> float:
        return self.ort_int8_per_s / self.paddle_fp32_per_s

    def as_json(self) -> dict[str, Any]:
        return {
            "cpu_threads": self.cpu_threads,
            "cpu": self.cpu,
            "texts": self.texts,
            "mean_batch_tokens": round(self.mean_batch_tokens, 1),
            "weight_gemm_share": round(self.weight_gemm_share, 4),
            "op_shares": {k: round(v, 4) for k, v in self.op_shares.items()},
            "int8_op_shares": {k: round(v, 4) for k, v in self.int8_op_shares.items()},
            "kernels": [k.__dict__ for k in self.kernels],
            "kernel_speedup": round(self.kernel_speedup, 3),
            "paddle_fp32_per_s": round(self.paddle_fp32_per_s, 1),
            "ort_fp32_per_s": round(self.ort_fp32_per_s, 1),
            "ort_int8_per_s": round(self.ort_int8_per_s, 1),
            "ceiling_over_ort_fp32": round(self.ceiling_over_ort_fp32, 3),
            "ceiling_over_paddle_fp32": round(self.ceiling_over_paddle_fp32, 3),
            "measured_int8_over_paddle_fp32": round(self.measured_int8_over_paddle_fp32, 3),
        }


def kernel_shares(
    model_file: Path, feeds: Sequence[dict[str, np.ndarray]], threads: int
) -> tuple[Counter[str], float]:
    """ORT's profile of ``model_file`` over ``feeds`` (one warm pass, one profiled pass): kernel time by op
    type, and the share of it in weight matrix multiplications (an initializer among the node's inputs) and
    the bias additions that follow them."""
    with tempfile.TemporaryDirectory(prefix="int8-ceiling-") as tmp:
        warm = _session(model_file, threads)
        for feed in feeds:
            warm.run(None, feed)
        options = _session_options(threads)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "profile")
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        session = ort.InferenceSession(
            str(model_file), sess_options=options, providers=["CPUExecutionProvider"]
        )
        for feed in feeds:
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text(encoding="utf-8"))
        optimized = onnx.load(str(Path(tmp) / "optimized.onnx"))
    weights = {init.name for init in optimized.graph.initializer}
    gemms = [n for n in optimized.graph.node if n.op_type in WEIGHT_GEMM_OPS and weights & set(n.input)]
    gemm_outputs = {out for node in gemms for out in node.output}
    # A weight multiplication's bias addition: the INT8 graph folds it into MatMulIntegerToFloat.
    bias_adds = [
        n
        for n in optimized.graph.node
        if n.op_type == "Add" and gemm_outputs & set(n.input) and weights & set(n.input)
    ]
    weight_nodes = {node.name for node in gemms + bias_adds}
    by_op: Counter[str] = Counter()
    weight_us = 0.0
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith(PROFILE_SUFFIX):
            continue
        node = event["name"].removesuffix(PROFILE_SUFFIX)
        by_op[event["args"]["op_name"]] += event["dur"]
        if node in weight_nodes:
            weight_us += event["dur"]
    total = sum(by_op.values())
    if total <= 0:
        raise RuntimeError(f"ONNX Runtime's profile of {model_file} holds no kernel times")
    return by_op, weight_us / total


def matmul_kernels(m: int, hidden: int, ffn: int, threads: int, repeats: int) -> list[KernelTiming]:
    """float32 MatMul vs INT8 MatMulInteger at an encoder layer's weight shapes (q, k, v, output: hidden ×
    hidden; FFN in: hidden × ffn; FFN out: ffn × hidden), ``m`` rows (tokens of one batch)."""
    rng = np.random.default_rng(0)
    out = []
    for k, n, count in ((hidden, hidden, 4), (hidden, ffn, 1), (ffn, hidden, 1)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        fp32 = _session_from(_matmul_graph(w), threads)
        int8 = _session_from(_matmul_integer_graph(rng.integers(-127, 128, (k, n), dtype=np.int8)), threads)
        xq = rng.integers(0, 256, (m, k), dtype=np.uint8)
        fp32_ms, int8_ms = _interleaved_medians(
            [partial(fp32.run, None, {"x": x}), partial(int8.run, None, {"x": xq})], repeats
        )
        out.append(KernelTiming(m, k, n, count, fp32_ms, int8_ms))
    return out


def int8_ceiling(
    onnx_dir: Path,
    int8_dir: Path,
    options: CeilingOptions,
    progress: Callable[[str], None] = lambda _: None,
) -> CeilingReport:
    """Measures the ceiling (see the module docstring) for the float32 export ``onnx_dir`` (which keeps its
    Paddle static export beside ``model.onnx``) and its quantization ``int8_dir``."""
    cpu = choose_device("cpu")
    static = InferenceOptions(backend="static", cpu_threads=options.cpu_threads)
    onnx_options = InferenceOptions(backend="onnx", cpu_threads=options.cpu_threads)
    forms = {
        "paddle-fp32": load_classifier(str(onnx_dir), cpu, options=static),
        "ort-fp32": load_classifier(str(onnx_dir), cpu, options=onnx_options),
        "ort-int8": load_classifier(str(int8_dir), cpu, options=onnx_options),
    }
    reference = forms["ort-fp32"]
    batches = token_batches(reference, review_texts(options.texts, options.seed), options.batch_size)
    feeds = [reference.padded_inputs(batch) for batch in batches]
    mean_tokens = float(np.mean([feed["input_ids"].size for feed in feeds]))
    progress(f"profiling float32 and INT8 ONNX Runtime over {len(feeds)} batches")
    fp32_ops, share = kernel_shares(onnx_dir / ONNX_FILE, feeds, options.cpu_threads)
    int8_ops, _ = kernel_shares(int8_dir / ONNX_FILE, feeds, options.cpu_threads)
    config = json.loads((onnx_dir / "config.json").read_text(encoding="utf-8"))
    progress(f"INT8 vs float32 kernels at {int(mean_tokens)} tokens per batch")
    kernels = matmul_kernels(
        int(round(mean_tokens)),
        int(config["hidden_size"]),
        int(config["intermediate_size"]),
        options.cpu_threads,
        options.kernel_repeats,
    )
    progress(f"whole models: {options.repeats} interleaved passes of {options.texts} reviews")
    passes = [(lambda form=form: _label_batches(form, batches)) for form in forms.values()]
    seconds = _interleaved_medians(passes, options.repeats)
    per_s = {name: options.texts / (ms / 1000) for name, ms in zip(forms, seconds, strict=True)}
    return CeilingReport(
        cpu_threads=options.cpu_threads,
        texts=options.texts,
        mean_batch_tokens=mean_tokens,
        cpu=cpu_description(),
        weight_gemm_share=share,
        op_shares=_shares(fp32_ops),
        int8_op_shares=_shares(int8_ops),
        kernels=kernels,
        paddle_fp32_per_s=per_s["paddle-fp32"],
        ort_fp32_per_s=per_s["ort-fp32"],
        ort_int8_per_s=per_s["ort-int8"],
    )


def format_ceiling(report: CeilingReport, target: float = 2.0) -> str:
    """The report as text: shares, kernels, the ceiling, the measured speed-ups."""
    top = ", ".join(f"{op} {share:.1%}" for op, share in list(report.op_shares.items())[:6])
    top8 = ", ".join(f"{op} {share:.1%}" for op, share in list(report.int8_op_shares.items())[:6])
    lines = [
        f"CPU: {report.cpu}",
        f"{report.texts} corpus reviews in batches of {report.mean_batch_tokens:.0f} padded tokens on "
        f"average, {report.cpu_threads} threads",
        f"float32 ORT kernel time: {top}",
        "  weight multiplications + their bias additions (what INT8 speeds up): "
        f"f = {report.weight_gemm_share:.1%}",
        f"INT8 ORT kernel time: {top8}",
        "",
        f"{'kernel [m×k]·[k×n]':<26}{'per layer':>10}{'fp32 ms':>10}{'int8 ms':>10}{'int8 speed-up':>15}",
    ]
    for k in report.kernels:
        shape = f"[{k.m}×{k.k}]·[{k.k}×{k.n}]"
        speedup = k.float32_ms / k.int8_ms
        lines.append(f"{shape:<26}{k.count:>10}{k.float32_ms:>10.3f}{k.int8_ms:>10.3f}{speedup:>14.2f}×")
    ceiling = report.ceiling_over_paddle_fp32
    lines += [
        f"  one layer's weight multiplications: r = {report.kernel_speedup:.2f}× (8-bit operands given, "
        "no quantization or rescaling)",
        "",
        "whole model (median of interleaved passes): Paddle Inference fp32 "
        f"{report.paddle_fp32_per_s:,.1f}/s, ORT fp32 {report.ort_fp32_per_s:,.1f}/s "
        f"({report.ort_fp32_over_paddle_fp32:.2f}×), ORT INT8 {report.ort_int8_per_s:,.1f}/s "
        f"({report.measured_int8_over_paddle_fp32:.2f}× Paddle fp32)",
        f"ceiling 1 / ((1 − f) + f / r) = {report.ceiling_over_ort_fp32:.2f}× ORT fp32 = {ceiling:.2f}× "
        f"Paddle Inference fp32: {target:g}× is {'within' if ceiling >= target else 'beyond'} what INT8 "
        "can give on this CPU",
    ]
    measured = report.measured_int8_over_paddle_fp32
    if measured > ceiling * 1.05:
        lines.append(
            f"  but the measured {measured:.2f}× is above this estimate, so it bounds nothing here: r is one "
            "sample of the kernels (on some machines it moves several-fold between runs; run again to see), "
            "and the measured whole-model speed-up is what counts"
        )
    return "\n".join(lines)


def _shares(by_op: Counter[str]) -> dict[str, float]:
    total = sum(by_op.values())
    return {op: us / total for op, us in by_op.most_common()}


def _label_batches(classifier: TextClassifierBase, batches: Sequence[Sequence[Sequence[int]]]) -> None:
    for batch in batches:
        classifier.predict_ids(batch)


def _interleaved_medians(calls: Sequence[Callable[[], Any]], repeats: int) -> list[float]:
    """Median milliseconds of each call, the calls taking turns (noise hits them alike); one warm-up each."""
    for call in calls:
        call()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(max(1, repeats)):
        for i, call in enumerate(calls):
            started = time.perf_counter()
            call()
            times[i].append((time.perf_counter() - started) * 1000)
    return [statistics.median(t) for t in times]


def _session_options(threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


def _session(model_file: Path, threads: int) -> ort.InferenceSession:
    return ort.InferenceSession(
        str(model_file), sess_options=_session_options(threads), providers=["CPUExecutionProvider"]
    )


def _session_from(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=_session_options(threads), providers=["CPUExecutionProvider"]
    )


def _matmul_graph(w: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "fp32_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", w.shape[1]])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _matmul_integer_graph(w: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["x", "w", "x_zero", "w_zero"], ["y"])],
        "int8_matmul",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, ["m", w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["m", w.shape[1]])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(128, dtype=np.uint8), "x_zero"),
            numpy_helper.from_array(np.array(0, dtype=np.int8), "w_zero"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
