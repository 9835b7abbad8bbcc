"""A per-character id table: the fast tokenizer's ids for most review texts without running its pipeline.

ErnieTokenizer's basic tokenizer makes every CJK ideograph, punctuation and symbol character a word of its
own, and whitespace only separates words. So in a text made of such characters, whitespace and ASCII
letters and digits, each isolated character's id depends on that character alone (one table lookup),
and each run of ASCII letters and digits is a word whose WordPiece ids depend on that word alone (asked of
the tokenizer once, then cached). A window's texts are looked up together in numpy: one pass, a few
microseconds a text, where the tokenizer's pipeline (normalizers, regex splits, WordPiece) takes tens.

Any other character (accented or full-width letters, combining marks, control and zero-width characters,
which the pipeline removes or joins to their neighbours), and any text holding a special token such as
``[CLS]`` verbatim, sends the text to the tokenizer itself: the general path, with identical ids.

The table is built from the tokenizer it stands in for and checked against it (`CharTable.build`): every
table character encoded in one string must give exactly the table's ids, else there is no table.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Callable, Sequence

import numpy as np

log = logging.getLogger(__name__)

Encode = Callable[[Sequence[str]], list[list[int]]]

_SKIP = -1  # whitespace: separates words, yields no id
_GENERAL = -2  # a character only the tokenizer's own pipeline handles: the whole text goes there
_WORD = -3  # an ASCII letter or digit: part of a word looked up as a whole

_MAX_CODE_POINT = 0x110000
_SEPARATOR = "\n"  # joins a window's texts; whitespace, so no word runs across two texts
_MAX_CACHED_WORDS = 200_000
_WORD_CHARACTERS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

# Ranges holding the isolated characters reviews use: ASCII and Latin-1 punctuation and symbols, general
# punctuation, currency and letter-like symbols, arrows, maths, boxes, shapes, dingbats, CJK symbols and
# punctuation, kana, CJK compatibility forms, half- and full-width forms, emoji; and the CJK ideographs.
_SYMBOL_RANGES = (
    (0x0000, 0x0100),
    (0x2000, 0x2BFF),
    (0x3000, 0x3100),
    (0xFE10, 0xFE70),
    (0xFF00, 0xFFF0),
    (0x1F000, 0x1FB00),
)


class CharTable:
    """Code point → id (or: whitespace, word character, general path) for one tokenizer."""

    def __init__(self, table: np.ndarray, encode: Encode, special_tokens: Sequence[str]) -> None:
        self._table = table
        self._encode = encode
        self._special_tokens = tuple(special_tokens)
        self._special_starts = {token[0] for token in special_tokens if token}
        self._words: dict[str, list[int]] = {}

    @classmethod
    def build(
        cls,
        encode: Encode,
        vocab: dict[str, int],
        *,
        unk_token: str,
        special_tokens: Sequence[str],
        cjk_ranges: Sequence[tuple[int, int]],
        is_isolated: Callable[[int, str], bool],
    ) -> CharTable | None:
        """The table for the tokenizer `encode` runs (its `vocab`, `unk_token`, `special_tokens`, the CJK
        ranges and the other characters its basic tokenizer isolates, by code point and category); None
        when the tokenizer does not encode the table's characters as the table would (a pipeline other
        than ErnieTokenizer's: every text then takes the general path)."""
        table = np.full(_MAX_CODE_POINT, _GENERAL, dtype=np.int32)
        unk = vocab[unk_token]
        table[[ord(ch) for ch in _WORD_CHARACTERS]] = _WORD
        isolated: list[str] = []
        for lo, hi in cjk_ranges:
            for cp in range(lo, hi + 1):
                ch = chr(cp)
                # Unassigned code points are removed by the pipeline; compatibility ideographs decompose.
                if unicodedata.category(ch) == "Lo" and unicodedata.normalize("NFD", ch) == ch:
                    isolated.append(ch)
        for lo, hi in _SYMBOL_RANGES:
            for cp in range(lo, hi):
                ch = chr(cp)
                category = unicodedata.category(ch)
                if ch.isspace() or category == "Zs":
                    table[cp] = _SKIP
                elif (
                    not category.startswith("C")  # removed by the pipeline (U+00AD soft hyphen, say)
                    and is_isolated(cp, category)
                    and ch.lower() == ch
                    and unicodedata.normalize("NFD", ch) == ch
                ):
                    isolated.append(ch)
        expected = [vocab.get(ch, unk) for ch in isolated]
        if encode(["".join(isolated)]) != [expected]:
            log.info("no character table: the tokenizer encodes single characters otherwise")
            return None
        table[[ord(ch) for ch in isolated]] = expected
        return cls(table, encode, special_tokens)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """The tokenizer's ids of every text: from the table where it can, else from the tokenizer."""
        if not texts:
            return []
        joined = _SEPARATOR.join(texts)
        try:
            code_points = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32)
        except UnicodeEncodeError:  # a lone surrogate: the tokenizer says which text (its own failure)
            return self._encode(texts)
        ids = self._table[code_points]
        lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
        ends = np.cumsum(lengths + 1) - 1  # each text's end in `joined`: its separator's position
        starts = ends - lengths
        several = self._words_into(ids, joined)
        kept = ids >= 0
        position = _cumulative(kept)
        flat = ids[kept].tolist()
        out = [flat[lo:hi] for lo, hi in zip(position[starts].tolist(), position[ends].tolist(), strict=True)]
        if several:
            marked = _cumulative(ids >= _SEVERAL_IDS)
            for i in np.flatnonzero(marked[ends] - marked[starts]).tolist():
                out[i] = [
                    y for x in out[i] for y in (several[x - _SEVERAL_IDS] if x >= _SEVERAL_IDS else [x])
                ]
        general = _cumulative(ids == _GENERAL)
        to_general = set(np.flatnonzero(general[ends] - general[starts]).tolist())
        if any(ch in joined for ch in self._special_starts):
            to_general.update(i for i, text in enumerate(texts) if self._has_special_token(text))
        if to_general:
            chosen = sorted(to_general)
            for i, row in zip(chosen, self._encode([texts[i] for i in chosen]), strict=True):
                out[i] = row
        return out

    def _has_special_token(self, text: str) -> bool:
        return any(ch in text for ch in self._special_starts) and any(t in text for t in self._special_tokens)

    def _words_into(self, ids: np.ndarray, joined: str) -> list[list[int]]:
        """Replaces each run of word characters in `ids` by its ids: a one-id word's id at the run's first
        position, a word of several ids its index into the returned list plus `_SEVERAL_IDS`; the rest of
        the run is skipped."""
        is_word = ids == _WORD
        if not is_word.any():
            return []
        edges = np.diff(is_word.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
        run_starts = np.flatnonzero(edges == 1)
        run_ends = np.flatnonzero(edges == -1)
        words = [joined[s:e] for s, e in zip(run_starts.tolist(), run_ends.tolist(), strict=True)]
        self._learn([w for w in set(words) if w not in self._words])
        several: list[list[int]] = []
        values = np.empty(len(words), dtype=np.int32)
        for k, word in enumerate(words):
            word_ids = self._words[word]
            if len(word_ids) == 1:
                values[k] = word_ids[0]
            else:  # several ids (or none, which expands to nothing)
                values[k] = _SEVERAL_IDS + len(several)
                several.append(word_ids)
        ids[is_word] = _SKIP
        ids[run_starts] = values
        return several

    def _learn(self, words: list[str]) -> None:
        if not words:
            return
        if len(self._words) + len(words) > _MAX_CACHED_WORDS:
            self._words.clear()
        self._words.update(zip(words, self._encode(words), strict=True))


_SEVERAL_IDS = 1 << 30  # above any vocabulary's ids: marks a word of several ids in a row


def _cumulative(flags: np.ndarray) -> np.ndarray:
    """c[i]: how many of flags[:i] are set (so c[end] - c[start] counts [start, end))."""
    return np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
