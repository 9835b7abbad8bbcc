"""What loading checks before a model may serve: label names that fit the model's outputs, metadata values of
the right type, and the file an exported directory misses (real tiny models, metadata edited on a copy)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from worker.cli.main import main
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier
from worker.model.manifest import write_manifest
from worker.model.metadata import METADATA_FILE
from worker.model.onnx_backend import ONNX_FILE


def _copy_with(source: Path, target: Path, **changes: Any) -> Path:
    """A copy of the model directory `source` whose sentiment_model.json has `changes` applied, vouched for
    (its manifest written again, as `sentiment-worker model-manifest` does): what loading checks after the
    files match their manifest."""
    shutil.copytree(source, target)
    path = target / METADATA_FILE
    meta = json.loads(path.read_text(encoding="utf-8"))
    meta.update(changes)
    path.write_text(json.dumps(meta), encoding="utf-8")
    write_manifest(target)
    return target


def _load(directory: Path, backend: str = "auto") -> Any:
    options = InferenceOptions(backend=backend, tokenizer="slow")  # type: ignore[arg-type]
    return load_classifier(str(directory), choose_device("cpu"), options=options)


THREE_LABELS = ["negative", "positive", "neutral"]


@pytest.mark.parametrize("backend", ["onnx", "static"])
def test_more_labels_than_outputs_is_refused_at_load(
    tiny_onnx_dir: Path, tmp_path: Path, backend: str
) -> None:
    """Before: loaded, warmed up, reported ready, and dead-lettered every input as inference_failed."""
    model = _copy_with(tiny_onnx_dir, tmp_path / "m", labels=THREE_LABELS)
    with pytest.raises(ModelLoadError) as caught:
        _load(model, backend)
    message = str(caught.value)
    assert str(model / METADATA_FILE) in message
    assert "names 3 labels" in message and "gives 2 outputs per text" in message


def test_more_labels_than_outputs_of_an_int8_model(tiny_int8_dir: Path, tmp_path: Path) -> None:
    model = _copy_with(tiny_int8_dir, tmp_path / "m", labels=["negative"])
    with pytest.raises(ModelLoadError, match=r"names 1 labels \['negative'\] but the model gives 2 outputs"):
        _load(model)


def test_dygraph_label_mismatch_names_the_metadata_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = _copy_with(tiny_model_dir, tmp_path / "m", labels=THREE_LABELS)
    with pytest.raises(ModelLoadError, match=f"{METADATA_FILE} names 3 labels .* gives 2 outputs"):
        _load(model)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (["same", "same"], "'labels' names 'same' more than once"),
        (["negative", ""], "'labels' must be a non-empty list of non-empty strings"),
        (["negative", " "], "'labels' must be a non-empty list of non-empty strings"),
        (None, "'labels' must be a non-empty list"),
    ],
)
def test_label_names_must_be_distinct_and_non_empty(
    tiny_int8_dir: Path, tmp_path: Path, labels: Any, expected: str
) -> None:
    """Before: ["same", "same"] loaded, and a result's probabilities by name no longer summed to 1."""
    model = _copy_with(tiny_int8_dir, tmp_path / "m", labels=labels)
    with pytest.raises(ModelLoadError, match=expected) as caught:
        _load(model)
    assert str(model / METADATA_FILE) in str(caught.value)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("max_seq_len", None, "'max_seq_len' must be an integer >= 3, not null"),
        ("max_seq_len", "64", "'max_seq_len' must be an integer >= 3, not \"64\""),
        ("max_seq_len", 1.5, "'max_seq_len' must be an integer >= 3, not 1.5"),
        ("max_seq_len", True, "'max_seq_len' must be an integer >= 3, not true"),
        ("name", None, "'name' must be a non-empty string, not null"),
        ("version", 7, "'version' must be a string, not 7"),
        ("training", [1], "'training' must be a JSON object, not \\[1\\]"),
    ],
)
@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_int8_dir"])
def test_null_or_bad_metadata_values_name_the_file_and_the_key(
    request: pytest.FixtureRequest, tmp_path: Path, fixture: str, key: str, value: Any, expected: str
) -> None:
    """Before: "max_seq_len": null was a TypeError traceback (exit 1); "64" and 1.5 were taken as 64 and 1."""
    model = _copy_with(request.getfixturevalue(fixture), tmp_path / "m", **{key: value})
    with pytest.raises(ModelLoadError, match=expected) as caught:
        _load(model)
    assert str(model / METADATA_FILE) in str(caught.value)


def test_bad_onnx_precision_names_the_key(tiny_int8_dir: Path, tmp_path: Path) -> None:
    meta = json.loads((tiny_int8_dir / METADATA_FILE).read_text(encoding="utf-8"))
    model = _copy_with(tiny_int8_dir, tmp_path / "m", onnx={**meta["onnx"], "precision": None})
    with pytest.raises(ModelLoadError, match="'onnx.precision' must be one of float32, int8, not null"):
        _load(model)


def test_onnx_directory_without_its_model_file_names_that_file(tiny_int8_dir: Path, tmp_path: Path) -> None:
    """Before: "missing config.json or model_config.json, model_state.pdparams or model.safetensors"."""
    model = tmp_path / "m"
    shutil.copytree(tiny_int8_dir, model)
    (model / ONNX_FILE).unlink()
    with pytest.raises(ModelLoadError, match=f"lacks {ONNX_FILE}, which its model_manifest.json lists"):
        _load(model)
    write_manifest(model)  # vouched for as it is: its metadata still describes the ONNX model
    with pytest.raises(ModelLoadError) as caught:
        _load(model)
    message = str(caught.value)
    assert f"describes an ONNX model but {ONNX_FILE} is missing" in message
    assert "pdparams" not in message


def test_cli_exits_2_naming_the_file_and_key(
    tiny_int8_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line: one line naming the file and the key, exit 2 (before: a traceback, exit 1)."""
    model = _copy_with(tiny_int8_dir, tmp_path / "m", max_seq_len=None)
    reviews = tmp_path / "reviews.txt"
    reviews.write_text("好\n", encoding="utf-8")
    code = main(["predict", str(reviews), "--model", str(model), "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert str(model / METADATA_FILE) in err and "'max_seq_len'" in err and "Traceback" not in err
