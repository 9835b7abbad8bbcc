"""The identity backend (no inference, for `bench --host-ceiling`): the directory's real tokenizer, fixed
probabilities that stay with their inputs, a model name that says identity, never chosen by auto, refused
unless allowed (a clean exit 2 from `run`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from worker.bench.worker_process import WorkerProcess, child_env
from worker.config import WorkerSettings
from worker.errors import ConfigurationError
from worker.labelling.loading import load_model
from worker.model.backend_choice import BackendMeasurement, BackendResult, cpu_identity
from worker.model.device import choose_device
from worker.model.identity_backend import IDENTITY_MODEL_NAME, IdentityClassifier
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier, resolve_backend
from worker.model.metadata import ModelMetadata

TEXTS = [
    "这个商品很好，物流也快！",
    "差",
    "质量太差了。。。再也不买了!!!",
    "Hello World, iPhone 15 真的很香 👍",
]


def _identity(directory: Path, **options: object) -> IdentityClassifier:
    chosen = InferenceOptions(backend="identity", allow_identity=True, **options)  # type: ignore[arg-type]
    classifier = load_classifier(str(directory), choose_device("cpu"), options=chosen)
    assert isinstance(classifier, IdentityClassifier)
    return classifier


def test_it_tokenizes_as_the_real_model_and_names_itself_identity(tiny_int8_dir: Path) -> None:
    real = load_classifier(str(tiny_int8_dir), choose_device("cpu"))
    identity = _identity(tiny_int8_dir)
    assert identity.token_ids(TEXTS) == real.token_ids(TEXTS)  # the same saved fast tokenizer and layout
    assert identity.encoder.tokenizer.kind == "fast" and identity.max_seq_len == real.max_seq_len
    meta = ModelMetadata.read(tiny_int8_dir / "sentiment_model.json")
    assert identity.name == IDENTITY_MODEL_NAME == "identity"
    assert identity.version == f"tokenizer-of-{meta.name}@{meta.version}"
    assert identity.labels == real.labels
    # Shaped like the ONNX backend on CPU, so the engine plans and spreads batches as for the real model.
    assert (identity.call_overhead_tokens, identity.parallel_calls) == (real.call_overhead_tokens, 2)
    assert _identity(tiny_int8_dir, cpu_threads=2, cpu_threads_per_call=2).parallel_calls == 1


def test_a_training_directory_serves_its_tokenizer_too(tiny_model_dir: Path) -> None:
    identity = _identity(tiny_model_dir)
    real = load_classifier(str(tiny_model_dir), choose_device("cpu"))
    assert identity.token_ids(TEXTS) == real.token_ids(TEXTS)
    assert identity.name == "identity" and identity.version.startswith("tokenizer-of-")


def test_probabilities_are_fixed_by_length_and_stay_in_input_order(tiny_int8_dir: Path) -> None:
    identity = _identity(tiny_int8_dir)
    batch = [[1] * 5, [1] * 2, [1] * 7, [1] * 4]
    probs = identity.predict_ids(batch)
    assert probs.dtype == np.float32 and probs.shape == (4, 2)
    high, low = 2 / 3, 1 / 3  # label len % 2 gets 2/(k+1), the other 1/(k+1)
    np.testing.assert_allclose(probs, [[low, high], [high, low], [low, high], [high, low]], rtol=1e-6)
    np.testing.assert_allclose(identity.predict_ids(batch[::-1]), probs[::-1], rtol=1e-6)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    assert identity.predict_ids([]).shape == (0, 2)
    texts = identity.predict_texts(TEXTS)
    assert [int(row.argmax()) for row in texts] == [len(ids) % 2 for ids in identity.token_ids(TEXTS)]


def test_three_labels_sum_to_one(tiny_int8_dir: Path) -> None:
    identity = _identity(tiny_int8_dir)
    identity.labels = ["a", "b", "c"]
    probs = identity.predict_ids([[1] * 3, [1] * 4, [1] * 5])
    np.testing.assert_allclose(probs, [[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]], rtol=1e-6)


def test_it_is_refused_unless_allowed(tiny_int8_dir: Path) -> None:
    options = InferenceOptions(backend="identity")
    with pytest.raises(ModelLoadError, match="SENTIMENT_ALLOW_IDENTITY_MODEL=true") as caught:
        load_classifier(str(tiny_int8_dir), choose_device("cpu"), options=options)
    assert "does no inference" in str(caught.value)
    settings = WorkerSettings(model=str(tiny_int8_dir), device="cpu", backend="identity")
    with pytest.raises(ConfigurationError, match="backend=identity does no inference"):
        load_model(settings.sections.model, settings.sections.batching)
    allowed = settings.model_copy(update={"allow_identity_model": True}).sections
    classifier, model_ref, _ = load_model(allowed.model, allowed.batching)
    assert model_ref.name == "identity" and model_ref.version == classifier.version


def test_run_refuses_it_with_exit_2_before_touching_kafka(tiny_int8_dir: Path, tmp_path: Path) -> None:
    args = ["--model", str(tiny_int8_dir), "--backend", "identity", "--device", "cpu",
            "--bootstrap-servers", "127.0.0.1:1"]  # fmt: skip
    refused = WorkerProcess(child_env(), tmp_path, "refused", *args, http_port=0)
    line = refused.refusal_line()  # exit 2, no traceback
    assert line.startswith("sentiment-worker run: error: model: backend=identity does no inference")
    assert "SENTIMENT_ALLOW_IDENTITY_MODEL=true" in line


def test_a_hub_name_has_no_tokenizer_directory() -> None:
    options = InferenceOptions(backend="identity", allow_identity=True)
    with pytest.raises(ModelLoadError, match="takes its tokenizer from a model directory"):
        load_classifier("ernie-3.0-mini-zh", choose_device("cpu"), options=options)


def test_auto_never_chooses_it(tiny_int8_dir: Path, tmp_path: Path) -> None:
    for directory in (tiny_int8_dir, None):
        assert resolve_backend(directory, "auto") != "identity"
    # Not even when a measurement (made by hand) says it was the fastest: auto serves only real models.
    (tmp_path / "model.onnx").write_bytes(b"")
    BackendMeasurement(
        cpu=cpu_identity(),
        backends={"identity": BackendResult(1e9, 0.99), "onnx": BackendResult(100.0, 0.85)},
    ).write(tmp_path)
    assert resolve_backend(tmp_path, "auto") == "onnx"
    with pytest.raises(ModelLoadError, match="serves no model"):
        resolve_backend(tiny_int8_dir, "identity")
