"""compare-backends on the tiny model: a measurement's accuracy is the backend's real held-out accuracy,
deltas are taken from Paddle Inference fp32, the recorded measurement drives auto, and the fresh-process
path returns rows (or a row saying why it failed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from worker.bench.compare_backends import (
    PADDLE_INT8_UNAVAILABLE,
    Job,
    Row,
    TableOptions,
    format_table,
    in_fresh_process,
    measure_job,
    record_measurement,
    rows_as_json,
    with_deltas,
)
from worker.model.backend_choice import BackendMeasurement, cpu_identity
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, load_classifier, resolve_backend
from worker.training.evaluate import HELDOUT_FILE, read_heldout

SMALL = TableOptions(texts=48, repeats=2, heldout_limit=120)


def heldout_accuracy(directory: Path, backend: str, heldout: Path, limit: int) -> float:
    classifier = load_classifier(
        str(directory),
        choose_device("cpu"),
        options=InferenceOptions(backend=backend),  # type: ignore[arg-type]
    )
    examples = read_heldout(heldout)[:limit]
    probs = classifier.predict_texts([e.text for e in examples])
    return float((probs.argmax(axis=1) == np.array([e.label_id for e in examples])).mean())


def test_measure_job_reports_the_backends_own_accuracy_and_median(
    tiny_onnx_dir: Path, tiny_model_dir: Path
) -> None:
    heldout = tiny_model_dir / HELDOUT_FILE
    row = measure_job(Job("tiny", "ort-fp32", str(tiny_onnx_dir), "onnx", str(heldout)), SMALL)
    assert row.status == "ok" and row.heldout_texts == 120 and row.precision == "float32"
    assert row.accuracy == pytest.approx(heldout_accuracy(tiny_onnx_dir, "onnx", heldout, 120))
    assert len(row.passes_msgs_per_s) == 2 and all(rate > 0 for rate in row.passes_msgs_per_s)
    assert min(row.passes_msgs_per_s) <= (row.msgs_per_s or 0) <= max(row.passes_msgs_per_s)
    assert row.peak_rss_mb is not None and row.peak_rss_mb > 50


def test_fresh_process_measures_int8_or_says_why_it_failed(tiny_int8_dir: Path, tiny_model_dir: Path) -> None:
    heldout = str(tiny_model_dir / HELDOUT_FILE)
    row = in_fresh_process(Job("tiny", "ort-int8", str(tiny_int8_dir), "onnx", heldout), SMALL)
    assert row.status == "ok" and row.precision == "int8"
    assert row.accuracy == pytest.approx(heldout_accuracy(tiny_int8_dir, "onnx", Path(heldout), 120))
    failed = in_fresh_process(Job("tiny", "paddle-fp32", str(tiny_int8_dir), "static", heldout), SMALL)
    assert failed.status.startswith("failed: ModelLoadError") and failed.accuracy is None


def test_deltas_are_from_paddle_fp32_and_the_table_keeps_its_order() -> None:
    rows = with_deltas(
        [
            Row("m", "ort-int8 (ort-dynamic)", "ok", accuracy=0.80, msgs_per_s=300.0, peak_rss_mb=400.0),
            Row("m", "ort-fp32", "ok", accuracy=0.82, msgs_per_s=200.0, peak_rss_mb=500.0),
            Row("m", "paddle-int8", PADDLE_INT8_UNAVAILABLE),
            Row("m", "paddle-fp32", "ok", accuracy=0.82, msgs_per_s=100.0, peak_rss_mb=600.0),
            Row("m", "dygraph", "ok", accuracy=0.82, msgs_per_s=50.0, peak_rss_mb=700.0),
        ]
    )
    assert [r.backend for r in rows] == [
        "dygraph",
        "paddle-fp32",
        "paddle-int8",
        "ort-fp32",
        "ort-int8 (ort-dynamic)",
    ]
    assert [r.delta_points for r in rows] == [
        pytest.approx(0.0),
        0.0,
        None,
        pytest.approx(0.0),
        pytest.approx(-2.0),
    ]
    table = format_table(rows).splitlines()
    assert "3.00x" in table[-1] and "-2.00 pt" in table[-1] and "400 MB" in table[-1]
    assert "unavailable with paddlepaddle 3.3.1" in table[4]
    assert json.loads(json.dumps(rows_as_json(rows)))[4]["delta_points"] == pytest.approx(-2.0)


def test_recorded_measurement_makes_auto_pick_the_faster_fp32_form(
    tiny_onnx_dir: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "served"
    directory.mkdir()
    for name in ("inference.json", "inference.pdiparams", "model.onnx"):
        (directory / name).write_bytes((tiny_onnx_dir / name).read_bytes())
    rows = [
        Row("m", "paddle-fp32", "ok", accuracy=0.8, msgs_per_s=100.0),
        Row("m", "ort-fp32", "ok", accuracy=0.8, msgs_per_s=180.0),
        Row("m", "ort-int8 (ort-dynamic)", "ok", accuracy=0.9, msgs_per_s=900.0),  # another directory
    ]
    path = record_measurement(directory, rows)
    assert path is not None
    recorded = BackendMeasurement.read(directory)
    assert (
        recorded is not None
        and recorded.cpu == cpu_identity()
        and set(recorded.backends) == {"static", "onnx"}
    )
    assert resolve_backend(directory, "auto") == "onnx"
