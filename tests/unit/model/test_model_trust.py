"""Model directories are data, not code (issue 50, finding 5): a directory is verified against its manifest
before anything in it is deserialized, its weights are safetensors, and a pickle never loads. Real tiny
models (the session's), copied and altered the way an attacker or a bad copy would."""

from __future__ import annotations

import hashlib
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from worker.cli.main import main
from worker.model.classifier import TextClassifierBase
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier
from worker.model.manifest import (
    LEGACY_WEIGHTS_FILE,
    MANIFEST_FILE,
    TRAINING_STATE_DIR,
    UnverifiedModelError,
    file_sha256,
    manifest_bytes,
    model_content_hash,
    pickle_files,
    verify_model_dir,
    write_manifest,
)
from worker.model.metadata import WEIGHTS_FILE
from worker.model.onnx_backend import ONNX_FILE
from worker.model.weights import read_weights

PROBES = ["质量很好，非常满意", "太差了，再也不买", "一般般"]


class Payload:
    """A pickle whose loading calls eval, as the red team's did: the code writes `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (eval, (f"open({str(self.marker)!r}, 'w').write('the payload ran')",))


def _load(directory: Path, backend: str = "auto") -> TextClassifierBase:
    options = InferenceOptions(backend=backend, tokenizer="slow")  # type: ignore[arg-type]
    return load_classifier(str(directory), choose_device("cpu"), options=options)


def _hostile_copy(source: Path, target: Path, marker: Path) -> Path:
    """`source` with its weights replaced by a pickle that runs code, and a manifest listing every file
    (an attacker who can write the directory can write that too)."""
    shutil.copytree(source, target)
    (target / WEIGHTS_FILE).unlink()
    (target / LEGACY_WEIGHTS_FILE).write_bytes(pickle.dumps({"weights": Payload(marker)}))
    files = {p.name: file_sha256(p) for p in target.iterdir() if p.name != MANIFEST_FILE}
    (target / MANIFEST_FILE).write_bytes(manifest_bytes(files))
    return target


@pytest.mark.parametrize("backend", ["auto", "dynamic"])
def test_a_pickle_that_runs_code_is_refused_before_it_runs(
    tiny_model_dir: Path, tmp_path: Path, backend: str
) -> None:
    """Before: the payload ran, then the loader refused the weights ("lacks 73 of 73 weights")."""
    marker = tmp_path / "payload-ran"
    model = _hostile_copy(tiny_model_dir, tmp_path / "hostile", marker)
    with pytest.raises(ModelLoadError) as caught:
        _load(model, backend)
    assert not marker.exists()
    message = str(caught.value)
    assert f"holds {LEGACY_WEIGHTS_FILE}, a pickle" in message
    assert f"sentiment-worker model-manifest --convert-pickle {model}" in message


def test_the_command_line_refuses_it_in_one_line_and_the_payload_never_runs(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "payload-ran"
    model = _hostile_copy(tiny_model_dir, tmp_path / "hostile", marker)
    reviews = tmp_path / "reviews.txt"
    reviews.write_text("好\n", encoding="utf-8")
    code = main(["predict", str(reviews), "--model", str(model), "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and not marker.exists()
    assert err.count("\n") == 1 and "a pickle" in err and "Traceback" not in err
    # Nor will the manifest command vouch for it.
    assert main(["model-manifest", str(model)]) == 2
    assert not marker.exists()


def test_a_pickle_named_like_safetensors_is_never_unpickled(tiny_model_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    model = shutil.copytree(tiny_model_dir, tmp_path / "renamed")
    (model / WEIGHTS_FILE).write_bytes(pickle.dumps(Payload(marker)))
    write_manifest(model)  # even vouched for, it is parsed as data
    with pytest.raises(ModelLoadError, match="is not a readable safetensors file"):
        _load(model)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("fixture", "name"), [("tiny_model_dir", WEIGHTS_FILE), ("tiny_int8_dir", ONNX_FILE)]
)
def test_one_changed_byte_is_refused(
    request: pytest.FixtureRequest, tmp_path: Path, fixture: str, name: str
) -> None:
    """Before: a changed weight loaded and served."""
    model = shutil.copytree(request.getfixturevalue(fixture), tmp_path / "tampered")
    data = bytearray((model / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (model / name).write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as caught:
        _load(model)
    message = str(caught.value)
    assert f"{model / name} does not match its {MANIFEST_FILE}" in message
    assert "copy the directory again" in message


def test_an_added_file_is_refused(tiny_int8_dir: Path, tmp_path: Path) -> None:
    """Before: an added_tokens.json (read by PaddleNLP's tokenizer) changed how reviews were cut."""
    model = shutil.copytree(tiny_int8_dir, tmp_path / "added")
    (model / "added_tokens.json").write_text('{"好不好": 5}', encoding="utf-8")
    with pytest.raises(ModelLoadError) as caught:
        _load(model)
    message = str(caught.value)
    assert f"holds added_tokens.json, which its {MANIFEST_FILE} does not list" in message
    assert f"sentiment-worker model-manifest {model}" in message


def test_a_file_listed_but_gone_is_refused(tiny_int8_dir: Path, tmp_path: Path) -> None:
    model = shutil.copytree(tiny_int8_dir, tmp_path / "partial")
    (model / "vocab.txt").unlink()
    with pytest.raises(ModelLoadError, match="lacks vocab.txt, which its model_manifest.json lists"):
        _load(model)


def test_without_a_manifest_the_line_says_how_to_make_one_and_the_command_makes_it(
    tiny_int8_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = shutil.copytree(tiny_int8_dir, tmp_path / "bare")
    (model / MANIFEST_FILE).unlink()
    with pytest.raises(ModelLoadError) as caught:
        _load(model)
    assert str(caught.value).startswith(f"{model} has no {MANIFEST_FILE}")
    assert f"run `sentiment-worker model-manifest {model}` (it vouches for them)" in str(caught.value)

    assert main(["model-manifest", str(model), "--check"]) == 2
    capsys.readouterr()
    assert main(["model-manifest", str(model)]) == 0
    out, err = capsys.readouterr()
    assert "WARNING: writing a manifest vouches for every file" in err
    content = model_content_hash(model)
    assert f"content sha256 {content}" in out
    assert content == model_content_hash(tiny_int8_dir)  # the same files: the same hash
    assert _load(model).content_hash == content


def test_the_content_hash_is_the_manifests_sha256_and_changes_with_any_file(
    tiny_int8_dir: Path, tmp_path: Path
) -> None:
    content = model_content_hash(tiny_int8_dir)
    assert content == hashlib.sha256((tiny_int8_dir / MANIFEST_FILE).read_bytes()).hexdigest()
    assert set(verify_model_dir(tiny_int8_dir).files) == {
        p.name for p in tiny_int8_dir.iterdir() if p.name != MANIFEST_FILE
    }
    edited = shutil.copytree(tiny_int8_dir, tmp_path / "edited")
    (edited / "README.md").write_text("another card\n", encoding="utf-8")
    assert write_manifest(edited) != content


def test_training_state_and_a_speed_measurement_are_outside_the_manifest_and_never_read(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """checkpoint/ holds a training run's Paddle checkpoints (pickles): serving never opens them."""
    marker = tmp_path / "payload-ran"
    model = shutil.copytree(tiny_model_dir, tmp_path / "with-checkpoint")
    (model / TRAINING_STATE_DIR).mkdir()
    (model / TRAINING_STATE_DIR / "model.pdparams").write_bytes(pickle.dumps(Payload(marker)))
    (model / "backend_measurement.json").write_text("{}", encoding="utf-8")
    assert model_content_hash(model) == model_content_hash(tiny_model_dir)
    _load(model)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a//b", MANIFEST_FILE, "checkpoint/x"])
def test_a_manifest_naming_paths_outside_the_directory_is_invalid(
    tiny_int8_dir: Path, tmp_path: Path, name: str
) -> None:
    model = shutil.copytree(tiny_int8_dir, tmp_path / "odd")
    files = dict(verify_model_dir(model).files)
    files[name] = "0" * 64
    (model / MANIFEST_FILE).write_bytes(manifest_bytes(files))
    with pytest.raises(UnverifiedModelError, match="is not a valid manifest"):
        verify_model_dir(model)


def test_a_trusted_pickled_directory_converts_to_the_same_model(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory written before safetensors (model_state.pdparams): refused, then converted on purpose;
    the converted one gives exactly the same probabilities."""
    import paddle

    legacy = shutil.copytree(tiny_model_dir, tmp_path / "legacy")
    paddle.save(
        {k: paddle.to_tensor(v) for k, v in read_weights(legacy / WEIGHTS_FILE).items()},
        str(legacy / LEGACY_WEIGHTS_FILE),
    )
    (legacy / WEIGHTS_FILE).unlink()
    (legacy / MANIFEST_FILE).unlink()
    with pytest.raises(ModelLoadError, match="--convert-pickle"):
        _load(legacy)

    assert main(["model-manifest", "--convert-pickle", str(legacy)]) == 0
    err = capsys.readouterr().err
    assert "WARNING: --convert-pickle loads" in err and "vouches for every file" in err
    assert pickle_files(legacy) == []
    before = _load(tiny_model_dir).predict_texts(PROBES)
    after = _load(legacy).predict_texts(PROBES)
    assert np.array_equal(before, after)


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_onnx_dir", "tiny_int8_dir"])
def test_train_export_and_quantize_write_data_only_and_a_manifest(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    directory: Path = request.getfixturevalue(fixture)
    assert pickle_files(directory) == []
    assert not list(directory.rglob("*.pdparams")) and not list(directory.rglob("*.info"))
    verified = verify_model_dir(directory)
    assert verified.content_hash == _load(directory).content_hash


def test_a_hub_name_is_refused_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PaddleNLP name makes PaddleNLP download and unpickle weights: never without the setting."""
    from paddlenlp.transformers import ErnieForSequenceClassification

    calls: list[object] = []
    monkeypatch.setattr(ErnieForSequenceClassification, "from_pretrained", lambda *a, **k: calls.append(a))
    with pytest.raises(ModelLoadError) as caught:
        load_classifier("ernie-3.0-medium-zh", choose_device("cpu"))
    assert calls == []
    assert "SENTIMENT_ALLOW_HUB_MODEL=true" in str(caught.value)
    assert "sentiment-worker train --init ernie-3.0-medium-zh" in str(caught.value)
