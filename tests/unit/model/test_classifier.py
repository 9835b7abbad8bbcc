from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from worker.model.classifier import SentimentClassifier
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier
from worker.model.manifest import MANIFEST_FILE, write_manifest
from worker.model.metadata import METADATA_FILE, WEIGHTS_FILE, weights_version

SHORT = "很好"
LONGER = [
    "质量很差，用了两天就坏了，客服也不理人，非常失望，再也不会在这家买东西了。",
    "物流很快，包装完好，书的内容也很精彩，孩子非常喜欢，推荐大家购买！" * 2,
]


@pytest.fixture(scope="module")
def classifier(tiny_model_dir: Path) -> SentimentClassifier:
    return load_classifier(str(tiny_model_dir), choose_device("cpu"))


def test_loads_metadata_and_version(classifier: SentimentClassifier, tiny_model_dir: Path) -> None:
    meta = json.loads((tiny_model_dir / METADATA_FILE).read_text(encoding="utf-8"))
    assert classifier.name == meta["name"]
    assert classifier.labels == ["negative", "positive"]
    assert classifier.max_seq_len == 64
    assert classifier.version == weights_version(tiny_model_dir) == meta["version"]
    assert len(classifier.version) == 12
    assert classifier.device.kind == "cpu"


def test_probabilities_shape_and_sum(classifier: SentimentClassifier) -> None:
    probs = classifier.predict_texts([SHORT, *LONGER])
    assert probs.dtype == np.float32
    assert probs.shape == (3, 2)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert ((probs >= 0) & (probs <= 1)).all()


def test_empty_batch(classifier: SentimentClassifier) -> None:
    assert classifier.predict_ids([]).shape == (0, 2)


def test_deterministic(classifier: SentimentClassifier) -> None:
    first = classifier.predict_texts(LONGER)
    second = classifier.predict_texts(LONGER)
    np.testing.assert_array_equal(first, second)


def test_batch_invariance_with_padding(classifier: SentimentClassifier) -> None:
    """A short text padded next to long ones gets the same probabilities as alone (attention mask works)."""
    alone = classifier.predict_texts([SHORT])[0]
    ids = classifier.token_ids([SHORT, *LONGER])
    assert len(ids[0]) < max(len(x) for x in ids), "the short text must actually be padded"
    batched = classifier.predict_ids(ids)
    np.testing.assert_allclose(batched[0], alone, atol=1e-5)
    for i, text in enumerate(LONGER, start=1):
        np.testing.assert_allclose(batched[i], classifier.predict_texts([text])[0], atol=1e-5)


def test_token_ids_have_cls_sep_and_truncate(classifier: SentimentClassifier) -> None:
    tok = classifier.tokenizer
    long_text = "好" * 500
    ids = classifier.token_ids([SHORT, long_text, ""])
    assert ids[0] == [tok.cls_token_id, *tok.convert_tokens_to_ids(["很", "好"]), tok.sep_token_id]
    assert len(ids[1]) == classifier.max_seq_len == 64
    assert ids[1][0] == tok.cls_token_id and ids[1][-1] == tok.sep_token_id
    assert ids[2] == [tok.cls_token_id, tok.sep_token_id]
    assert classifier.predict_ids(ids).shape == (3, 2)


def test_unknown_characters_map_to_unk(classifier: SentimentClassifier) -> None:
    ids = classifier.token_ids(["\u9fa5\u9fa4"])[0]  # rare CJK characters not in a 4k-review vocab
    assert ids[1:-1] == [classifier.tokenizer.unk_token_id] * 2


def test_max_seq_len_override(tiny_model_dir: Path) -> None:
    short = load_classifier(str(tiny_model_dir), choose_device("cpu"), max_seq_len=16)
    assert short.max_seq_len == 16
    assert len(short.token_ids(["好" * 100])[0]) == 16
    with pytest.raises(ModelLoadError, match="position embeddings"):
        load_classifier(str(tiny_model_dir), choose_device("cpu"), max_seq_len=1000)


def test_too_long_ids_rejected(classifier: SentimentClassifier) -> None:
    with pytest.raises(ValueError, match="max_seq_len"):
        classifier.predict_ids([[1] * 65])


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        load_classifier(str(tmp_path / "nope"), choose_device("cpu"))
    assert "sentiment-worker train" in str(info.value)


def test_missing_served_form_names_the_make_target_that_derives_it(tmp_path: Path) -> None:
    (tmp_path / "default").mkdir()  # the shipped model is there, its INT8 form not yet made
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        load_classifier(str(tmp_path / "default-int8"), choose_device("cpu"))
    assert f"derived from {tmp_path / 'default'}: run `make model`" in str(info.value)


@pytest.mark.parametrize(
    ("source", "form", "target"),
    [
        ("fast", "fast-int8", "make fast-model-int8"),  # issue 40: it suggested `make model`
        ("fast", "fast-static", "make fast-model-static"),
        ("default", "default-static", "make model-static"),
        ("mine", "mine-int8", "make {tmp}/mine-int8/model.onnx"),
    ],
)
def test_each_missing_served_form_names_its_own_make_target(
    tmp_path: Path, source: str, form: str, target: str
) -> None:
    (tmp_path / source).mkdir()
    with pytest.raises(ModelLoadError) as info:
        load_classifier(str(tmp_path / form), choose_device("cpu"))
    assert f"run `{target.format(tmp=tmp_path)}`" in str(info.value)


def test_incomplete_directory_names_missing_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ModelLoadError) as info:
        load_classifier(str(tmp_path), choose_device("cpu"))
    msg = str(info.value)
    assert f"has no {MANIFEST_FILE}" in msg  # verified first: nothing in it is read before
    write_manifest(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        load_classifier(str(tmp_path), choose_device("cpu"))
    msg = str(info.value)
    assert "model.safetensors" in msg and "vocab.txt" in msg
    assert "config.json" not in msg.split("missing")[1]


@pytest.mark.parametrize(
    ("file", "content", "error"),
    [
        (WEIGHTS_FILE, b"not a safetensors file", "model.safetensors is not a readable safetensors file"),
        ("config.json", b"{ not json", "config.json is not valid JSON"),
        (METADATA_FILE, json.dumps({"name": "x"}).encode(), "sentiment_model.json is invalid"),
    ],
    ids=["corrupt_weights", "corrupt_config", "invalid_metadata"],
)
def test_a_broken_file_is_named(
    tiny_model_dir: Path, tmp_path: Path, file: str, content: bytes, error: str
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / file).write_bytes(content)
    write_manifest(broken)  # verified as shipped: the file itself is what is wrong
    with pytest.raises(ModelLoadError, match=error):
        load_classifier(str(broken), choose_device("cpu"))


def test_directory_without_metadata_uses_dir_name_and_defaults(tiny_model_dir: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain-ernie"
    shutil.copytree(tiny_model_dir, plain)
    (plain / METADATA_FILE).unlink()
    write_manifest(plain)
    clf = load_classifier(str(plain), choose_device("cpu"))
    assert clf.name == "plain-ernie"
    assert clf.labels == ["negative", "positive"]
    assert clf.version == weights_version(tiny_model_dir)
    assert clf.max_seq_len == 64  # capped by the model's position embeddings


def test_hub_name_download_failure_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    """No model hub here: simulate PaddleNLP's download error instead of reaching out to the network."""
    from paddlenlp.transformers import ErnieForSequenceClassification

    def refuse_download(*args: object, **kwargs: object) -> None:
        raise OSError("Can't load the model for 'ernie-3.0-medium-zh'")

    monkeypatch.setattr(ErnieForSequenceClassification, "from_pretrained", refuse_download)
    with pytest.raises(ModelLoadError) as info:
        load_classifier("ernie-3.0-medium-zh", choose_device("cpu"), options=InferenceOptions(allow_hub=True))
    msg = str(info.value)
    assert msg.startswith("could not download ernie-3.0-medium-zh (no access to the model hub?)")
    assert "sentiment-worker train" in msg


def test_path_like_missing_model_is_not_treated_as_hub_name(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_classifier("models/no-such-model", choose_device("cpu"))
