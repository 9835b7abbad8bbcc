"""SENTIMENT_BACKEND=auto by measurement: the fastest backend without accuracy loss, only when measured on
this CPU and servable from the directory; the rule by directory kind otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.model.backend_choice import (
    MEASUREMENT_FILE,
    SAFE_ACCURACY_LOSS,
    BackendMeasurement,
    BackendResult,
    compression_outlook,
    cpu_description,
    cpu_features,
    cpu_identity,
    measured_choice,
)
from worker.model.loading import available_backends, resolve_backend


@pytest.fixture()
def both_forms(tmp_path: Path) -> Path:
    """A directory holding (empty stand-ins of) a Paddle export and an ONNX model."""
    for name in ("inference.json", "inference.pdiparams", "model.onnx"):
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def measurement(
    static: float, onnx: float, onnx_accuracy: float = 0.85, cpu: str | None = None
) -> BackendMeasurement:
    return BackendMeasurement(
        cpu=cpu or cpu_identity(),
        backends={"static": BackendResult(static, 0.85), "onnx": BackendResult(onnx, onnx_accuracy)},
    )


def test_fastest_safe_backend() -> None:
    assert measurement(100.0, 250.0).fastest_safe({"static", "onnx"}) == "onnx"
    assert measurement(300.0, 250.0).fastest_safe({"static", "onnx"}) == "static"
    assert measurement(100.0, 250.0).fastest_safe({"static"}) == "static"  # onnx files absent
    assert measurement(100.0, 250.0).fastest_safe({"dynamic"}) is None
    # faster but less accurate than allowed: not chosen; within the allowance: chosen
    assert (
        measurement(100.0, 250.0, 0.85 - 2 * SAFE_ACCURACY_LOSS).fastest_safe({"static", "onnx"}) == "static"
    )
    assert measurement(100.0, 250.0, 0.85 - SAFE_ACCURACY_LOSS / 2).fastest_safe({"static", "onnx"}) == "onnx"


def test_auto_follows_a_measurement_made_on_this_cpu(both_forms: Path) -> None:
    assert available_backends(both_forms) == {"static", "onnx"}
    assert resolve_backend(both_forms, "auto") == "static"  # no measurement: the rule by directory kind
    measurement(100.0, 250.0).write(both_forms)
    assert resolve_backend(both_forms, "auto") == "onnx"
    choice, why = measured_choice(both_forms, {"static", "onnx"})
    assert choice == "onnx" and "250.0 reviews/s" in why
    assert resolve_backend(both_forms, "static") == "static"  # an explicit choice is never overridden


def test_a_measurement_from_another_machine_or_unreadable_is_ignored(both_forms: Path) -> None:
    measurement(100.0, 250.0, cpu="Some Other CPU x64").write(both_forms)
    choice, why = measured_choice(both_forms, {"static", "onnx"})
    assert choice is None and "Some Other CPU x64" in why
    assert resolve_backend(both_forms, "auto") == "static"
    (both_forms / MEASUREMENT_FILE).write_text("{not json", encoding="utf-8")
    assert BackendMeasurement.read(both_forms) is None
    assert resolve_backend(both_forms, "auto") == "static"


def test_measurement_round_trips(tmp_path: Path) -> None:
    written = measurement(12.5, 30.0)
    written.write(tmp_path)
    assert BackendMeasurement.read(tmp_path) == written
    assert BackendMeasurement.read(tmp_path / "missing") is None


AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx fma avx2 bmi2\n"
VNNI_BF16 = (
    "processor\t: 0\nflags\t\t: fpu avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 avx_vnni\n"
    "processor\t: 1\nflags\t\t: fpu\n"
)


def test_cpu_features_read_the_first_processors_flags() -> None:
    assert cpu_features(AVX2_ONLY) == ["AVX2", "FMA"]
    assert cpu_features(VNNI_BF16) == ["AVX2", "FMA", "AVX-512", "AVX-512 VNNI", "AVX-VNNI", "AVX-512 BF16"]
    assert cpu_features("processor\t: 0\n") == []
    assert cpu_description().startswith(cpu_identity() + ": ")


def test_the_outlook_says_which_compressed_form_can_pay() -> None:
    avx2 = compression_outlook(cpu_features(AVX2_ONLY))
    assert "no VNNI" in avx2 and "SENTIMENT_USE_BF16 is refused" in avx2
    vnni = compression_outlook(cpu_features(VNNI_BF16))
    assert "VNNI" in vnni and "no VNNI" not in vnni and "bfloat16 native" in vnni
