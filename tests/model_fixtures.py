"""Pytest plugin: a tiny sentiment model trained once per test session (a few tens of seconds), and its
ONNX export and INT8 quantization (a few seconds more, only for the tests that ask for them).

Register with ``pytest_plugins = ["tests.model_fixtures"]`` in tests/conftest.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, load_classifier
from worker.training.export import PARITY_TOLERANCE
from worker.training.onnx_export import export_onnx
from worker.training.options import TrainOptions, TrainReport
from worker.training.quantize import quantize_model
from worker.training.training import train

# 1 layer, hidden 64, 4,000 examples, 3 epochs at seq len 64: ~15 s on 2 cores, ~0.75 held-out accuracy.
TINY_OPTIONS = {
    "num_layers": 1,
    "hidden_size": 64,
    "num_heads": 2,
    "intermediate_size": 128,
    "max_seq_len": 64,
    "epochs": 3,
    "batch_size": 32,
    "learning_rate": 2e-3,
    "limit": 4000,
    "seed": 7,
    "label_smoothing": 0.0,
    "truncation": "head",
}


# A very small model for the mechanics tests (accumulation, AMP, resume, R-Drop): ~1-2 s per run on 2 cores.
MICRO_OPTIONS = {
    "num_layers": 1,
    "hidden_size": 32,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_seq_len": 32,
    "batch_size": 16,
    "limit": 300,
    "seed": 3,
}


def tiny_train_options(output_dir: Path) -> TrainOptions:
    """The options the ``tiny_model_dir`` fixture trains with."""
    return TrainOptions(output_dir=output_dir, **TINY_OPTIONS)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TinyTraining:
    """The tiny model's TrainReport and the progress lines training printed."""

    report: TrainReport
    progress: list[str]


@pytest.fixture(scope="session")
def tiny_model_training(tmp_path_factory: pytest.TempPathFactory) -> TinyTraining:
    """Train the tiny model once per session."""
    out = tmp_path_factory.mktemp("tiny_model")
    lines: list[str] = []
    report = train(tiny_train_options(out), progress=lines.append)
    return TinyTraining(report=report, progress=lines)


@pytest.fixture(scope="session")
def tiny_model_report(tiny_model_training: TinyTraining) -> TrainReport:
    """The tiny model's TrainReport (accuracies, split sizes, seconds)."""
    return tiny_model_training.report


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_report: TrainReport) -> Path:
    """A tiny trained model directory: ``save_pretrained`` layout + sentiment_model.json, metrics.json."""
    return tiny_model_report.output_dir


@pytest.fixture(scope="module")
def tiny_dynamic(tiny_model_dir: Path) -> Any:
    """``tiny_model_dir`` loaded by the dynamic (dygraph) backend on CPU with the slow tokenizer: the
    reference the exported backends are compared with."""
    return load_classifier(
        str(tiny_model_dir), choose_device("cpu"), options=InferenceOptions(tokenizer="slow")
    )


@pytest.fixture(scope="session")
def tiny_onnx_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model exported with ``export --format onnx``: Paddle static files + float32 model.onnx."""
    out = tmp_path_factory.mktemp("onnx") / "tiny-onnx"
    report = export_onnx(tiny_model_dir, out)
    assert report.output_dir == out and report.onnx_max_abs_diff <= PARITY_TOLERANCE
    return out


TINY_HELDOUT_LIMIT = 200
"""Held-out reviews the tiny INT8 fixture measures its accuracy delta on (keeps the fixture at ~2 s)."""


@pytest.fixture(scope="session")
def tiny_int8_dir(tiny_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``quantize`` of ``tiny_onnx_dir`` by the default method, as ``make`` derives the served INT8 forms
    (ort-static; accuracy delta on the first 200 held-out)."""
    out = tmp_path_factory.mktemp("int8") / "tiny-int8"
    quantize_model(tiny_onnx_dir, out, heldout_limit=TINY_HELDOUT_LIMIT)
    return out
