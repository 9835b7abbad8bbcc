"""`int8-ceiling`: Amdahl's arithmetic on fixed numbers, and one real run on the tiny exported model
(its profile, kernel shapes and whole-model passes; structure and consistency, never speeds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.bench.int8_ceiling import (
    CeilingOptions,
    CeilingReport,
    KernelTiming,
    format_ceiling,
    int8_ceiling,
)
from worker.model.backend_choice import cpu_description


def made_up_report(share: float, fp32_ms: float, int8_ms: float, paddle: float, ort: float) -> CeilingReport:
    """Numbers chosen by the test (a clearly fake measurement) to check the arithmetic."""
    return CeilingReport(
        cpu_threads=2,
        texts=10,
        mean_batch_tokens=100.0,
        cpu="a test CPU x2: AVX2, FMA",
        weight_gemm_share=share,
        op_shares={"MatMul": share, "Add": 1 - share},
        int8_op_shares={"MatMulInteger": 1.0},
        kernels=[
            KernelTiming(100, 8, 8, 4, fp32_ms, int8_ms),
            KernelTiming(100, 8, 32, 1, 4 * fp32_ms, 4 * int8_ms),
        ],
        paddle_fp32_per_s=paddle,
        ort_fp32_per_s=ort,
        ort_int8_per_s=1.5 * ort,
    )


def test_the_ceiling_is_amdahls_law_over_the_weight_multiplications() -> None:
    report = made_up_report(share=0.8, fp32_ms=2.0, int8_ms=1.0, paddle=100.0, ort=120.0)
    assert report.kernel_speedup == pytest.approx(2.0)
    assert report.ceiling_over_ort_fp32 == pytest.approx(1 / (0.2 + 0.4))  # 1.667
    assert report.ceiling_over_paddle_fp32 == pytest.approx(1.2 / 0.6)  # exactly 2.0
    assert report.measured_int8_over_paddle_fp32 == pytest.approx(1.8)
    assert "2× is within" in format_ceiling(report)
    # Only a quarter of the time in multiplications: even infinitely fast INT8 kernels give < 1.34×.
    slow = made_up_report(share=0.25, fp32_ms=1000.0, int8_ms=1.0, paddle=100.0, ort=100.0)
    assert slow.ceiling_over_ort_fp32 == pytest.approx(1 / (0.75 + 0.25 / 1000))
    assert "2× is beyond" in format_ceiling(slow)
    assert "above this estimate" not in format_ceiling(report)
    # A measured speed-up above the estimate (the kernel timings moved): said, not hidden.
    above = made_up_report(share=0.5, fp32_ms=2.0, int8_ms=1.0, paddle=100.0, ort=100.0)  # ceiling 1.33×
    assert above.measured_int8_over_paddle_fp32 == pytest.approx(1.5)
    assert "the measured 1.50× is above this estimate" in format_ceiling(above)


def test_a_run_on_the_tiny_model_measures_its_own_shapes(tiny_onnx_dir: Path, tiny_int8_dir: Path) -> None:
    report = int8_ceiling(tiny_onnx_dir, tiny_int8_dir, CeilingOptions(texts=64, repeats=1, kernel_repeats=2))
    config = json.loads((tiny_onnx_dir / "config.json").read_text(encoding="utf-8"))
    hidden, ffn = config["hidden_size"], config["intermediate_size"]
    assert [(k.k, k.n, k.count) for k in report.kernels] == [
        (hidden, hidden, 4),
        (hidden, ffn, 1),
        (ffn, hidden, 1),
    ]
    assert all(k.m == round(report.mean_batch_tokens) for k in report.kernels)
    # The profile found the weight multiplications, and they are a share of all kernel time.
    assert 0.0 < report.weight_gemm_share < 1.0
    # Found in the profile; not compared with weight_gemm_share, which is timed separately (kernel runs):
    # with another process on the 2 cores the two timings drifted apart (MatMul 0.086 against f 0.304).
    assert report.op_shares["MatMul"] > 0.0
    # f counts the weight multiplications and their bias additions, nothing else.
    assert report.weight_gemm_share <= sum(report.op_shares.get(op, 0.0) for op in ("MatMul", "Gemm", "Add"))
    assert sum(report.op_shares.values()) == pytest.approx(1.0)
    # The INT8 graph runs integer multiplications in place of the float ones.
    assert any("Integer" in op or "Quantize" in op for op in report.int8_op_shares)
    assert min(report.paddle_fp32_per_s, report.ort_fp32_per_s, report.ort_int8_per_s) > 0
    data = report.as_json()
    assert data["ceiling_over_paddle_fp32"] == round(
        report.ceiling_over_ort_fp32 * report.ort_fp32_per_s / report.paddle_fp32_per_s, 3
    )
    # The report names the CPU it ran on and the features that decide what INT8 can do there.
    assert data["cpu"] == cpu_description()
    assert format_ceiling(report).splitlines()[0] == f"CPU: {data['cpu']}"
