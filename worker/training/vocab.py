"""Character vocabulary for the from-scratch model, built so ``ErnieTokenizer`` covers the training text."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_char_vocab(texts: Iterable[str], min_freq: int) -> list[str]:
    """Special tokens, then every character seen at least ``min_freq`` times (most frequent first).

    Texts are split with the same basic tokenizer ``ErnieTokenizer`` uses (lower-casing, CJK characters
    as single tokens). Characters that continue a non-CJK word (e.g. the "ello" of "hello") are also added
    as WordPiece continuations ("##e") so such words tokenize to characters instead of one [UNK].
    """
    from paddlenlp.transformers.bert.tokenizer import BasicTokenizer

    basic = BasicTokenizer(do_lower_case=True)
    counts: Counter[str] = Counter()
    for text in texts:
        for word in basic.tokenize(text):
            counts[word[0]] += 1
            for ch in word[1:]:
                counts["##" + ch] += 1
    ranked = sorted((tok for tok, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
    return SPECIAL_TOKENS + [tok for tok in ranked if tok not in SPECIAL_TOKENS]


def write_vocab(tokens: list[str], path: Path) -> None:
    """Write one token per line (line number = id), the format ``ErnieTokenizer(vocab_file)`` reads."""
    path.write_text("".join(tok + "\n" for tok in tokens), encoding="utf-8")
