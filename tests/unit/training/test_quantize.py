"""INT8 quantization of the tiny model's ONNX export: the quantized model loads, its held-out accuracy delta
is computed (and equals an independent recomputation) and recorded in metadata and model card, the
calibration texts are recorded and disjoint from the held-out split; refusals are clear."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.model_fixtures import TINY_HELDOUT_LIMIT
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, load_classifier
from worker.model.metadata import METADATA_FILE
from worker.model.onnx_backend import ONNX_FILE, OnnxClassifier
from worker.training.evaluate import HELDOUT_FILE, predict_probs, read_heldout
from worker.training.quantize import (
    CALIBRATION_FILE,
    CALIBRATION_TEXTS,
    CARD_FILE,
    EVAL_BATCH_SIZE,
    QuantizeError,
    quantize_model,
)


def accuracy(directory: Path, texts: list[str], gold: np.ndarray) -> float:
    classifier = load_classifier(
        str(directory), choose_device("cpu"), options=InferenceOptions(backend="onnx", tokenizer="slow")
    )
    # Batched exactly as `quantize` measures (ort-dynamic ranges activations per batch, so there another batch
    # composition may flip a borderline review).
    probs, _ = predict_probs(classifier, texts, EVAL_BATCH_SIZE)
    return float((probs.argmax(axis=1) == gold).mean())


def test_int8_model_loads_with_its_own_version_and_precision(
    tiny_int8_dir: Path, tiny_onnx_dir: Path
) -> None:
    classifier = load_classifier(str(tiny_int8_dir), choose_device("cpu"))
    assert isinstance(classifier, OnnxClassifier) and classifier.precision == "int8"
    source = json.loads((tiny_onnx_dir / METADATA_FILE).read_text(encoding="utf-8"))
    assert classifier.version == f"{source['version']}-int8"
    ops = {node.op_type for node in onnx.load(str(tiny_int8_dir / ONNX_FILE)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops and "DynamicQuantizeLinear" not in ops
    assert not (tiny_int8_dir / "inference.pdiparams").exists()  # nothing can serve fp32 from here
    assert (tiny_int8_dir / ONNX_FILE).stat().st_size < (tiny_onnx_dir / ONNX_FILE).stat().st_size


def test_accuracy_delta_is_measured_and_recorded(
    tiny_int8_dir: Path, tiny_onnx_dir: Path, tiny_model_dir: Path
) -> None:
    record = json.loads((tiny_int8_dir / METADATA_FILE).read_text(encoding="utf-8"))["quantization"]
    examples = read_heldout(tiny_model_dir / HELDOUT_FILE)[:TINY_HELDOUT_LIMIT]
    texts, gold = [e.text for e in examples], np.array([e.label_id for e in examples])
    fp32, int8 = accuracy(tiny_onnx_dir, texts, gold), accuracy(tiny_int8_dir, texts, gold)
    acc = record["accuracy"]
    assert acc["texts"] == TINY_HELDOUT_LIMIT
    assert acc["float32"] == pytest.approx(fp32) and acc["int8"] == pytest.approx(int8)
    assert acc["delta_points"] == pytest.approx(100 * (int8 - fp32))
    assert 0.9 <= acc["agreement"] <= 1.0 and acc["max_abs_diff"] > 0  # INT8 is close, but not identical
    assert record["method"] == "ort-static" and record["source_dir"] == str(tiny_onnx_dir.resolve())
    card = (tiny_int8_dir / CARD_FILE).read_text(encoding="utf-8")
    assert f"{acc['delta_points']:+.2f} pt" in card and f"{fp32:.2%}" in card and f"{int8:.2%}" in card


def test_calibration_texts_are_recorded_and_not_held_out(tiny_int8_dir: Path, tiny_model_dir: Path) -> None:
    record = json.loads((tiny_int8_dir / METADATA_FILE).read_text(encoding="utf-8"))["quantization"]
    lines = (tiny_int8_dir / CALIBRATION_FILE).read_text(encoding="utf-8").splitlines()
    texts = [json.loads(line)["text"] for line in lines]
    assert len(texts) == record["calibration"]["texts"] == CALIBRATION_TEXTS == len(set(texts))
    heldout = {e.text for e in read_heldout(tiny_model_dir / HELDOUT_FILE)[:TINY_HELDOUT_LIMIT]}
    assert not heldout & set(texts)
    assert record["calibration"]["used"] is True  # the activation ranges come from these reviews


def _int8_weight_extreme(directory: Path) -> int:
    graph = onnx.load(str(directory / ONNX_FILE)).graph
    weights = [
        onnx.numpy_helper.to_array(t) for t in graph.initializer if t.data_type == onnx.TensorProto.INT8
    ]
    assert weights, "no int8 weight tensors in the quantized graph"
    return max(int(np.abs(w.astype(np.int32)).max()) for w in weights)


def test_weights_keep_seven_bits_unless_eight_are_asked_for(
    tiny_int8_dir: Path, tiny_onnx_dir: Path, tmp_path: Path
) -> None:
    # 7 bits by default: AVX2's u8s8 kernels add product pairs in 16 bits, which 8-bit weights can saturate.
    assert _int8_weight_extreme(tiny_int8_dir) <= 64
    record = json.loads((tiny_int8_dir / METADATA_FILE).read_text(encoding="utf-8"))["quantization"]
    assert record["weight_bits"] == 7 and "--weight-bits 7" in (tiny_int8_dir / CARD_FILE).read_text("utf-8")
    report = quantize_model(tiny_onnx_dir, tmp_path / "full", weight_bits=8, heldout_limit=50)
    assert report.weight_bits == 8 and _int8_weight_extreme(tmp_path / "full") == 127
    with pytest.raises(QuantizeError, match="weight bits must be 7 or 8"):
        quantize_model(tiny_onnx_dir, tmp_path / "six", weight_bits=6)  # type: ignore[arg-type]


def test_only_weight_multiplications_are_quantized(tiny_int8_dir: Path) -> None:
    # The attention products (two activations) stay float32, as ort-dynamic leaves them.
    graph = onnx.load(str(tiny_int8_dir / ONNX_FILE)).graph
    weights = {t.name for t in graph.initializer}
    dequantized = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    quantized = [n for n in matmuls if all(i in dequantized for i in n.input)]
    assert quantized and all(dequantized[n.input[1]] in weights for n in quantized)
    assert [n for n in matmuls if n not in quantized and not weights & set(n.input)]  # attention, float32


def test_dynamic_quantization_is_kept_and_its_card_says_labels_depend_on_batch_mates(
    tiny_onnx_dir: Path, tmp_path: Path
) -> None:
    report = quantize_model(
        tiny_onnx_dir, tmp_path / "dynamic", method="ort-dynamic", heldout_limit=100, calibration_size=64
    )
    ops = {node.op_type for node in onnx.load(str(tmp_path / "dynamic" / ONNX_FILE)).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    record = json.loads((tmp_path / "dynamic" / METADATA_FILE).read_text(encoding="utf-8"))["quantization"]
    assert record["method"] == "ort-dynamic" and record["batch_invariant"] is False
    assert record["calibration"] | {"texts": 64, "used": False} == record["calibration"]
    assert record["accuracy"]["delta_points"] == pytest.approx(report.accuracy.delta_points)
    assert report.accuracy.texts == 100
    assert "**Batch-dependent**" in (tmp_path / "dynamic" / CARD_FILE).read_text(encoding="utf-8")


def test_quantize_refuses_what_it_cannot_quantize(
    tiny_model_dir: Path, tiny_onnx_dir: Path, tiny_int8_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(QuantizeError, match="export --format onnx"):
        quantize_model(tiny_model_dir, tmp_path / "a")
    with pytest.raises(QuantizeError, match="already quantized"):
        quantize_model(tiny_int8_dir, tmp_path / "b")
    with pytest.raises(QuantizeError, match="does not exist"):
        quantize_model(tiny_onnx_dir, tmp_path / "c", heldout=tmp_path / "missing.jsonl")
    with pytest.raises(QuantizeError, match="--overwrite"):
        quantize_model(tiny_onnx_dir, tiny_int8_dir)
    with pytest.raises(QuantizeError, match="unknown method"):
        quantize_model(tiny_onnx_dir, tmp_path / "d", method="paddle-magic")  # type: ignore[arg-type]
    assert not [p for p in tmp_path.iterdir()]
