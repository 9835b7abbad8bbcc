"""Text → WordPiece ids: a fast path (Rust `tokenizers`) with exact id parity to PaddleNLP's ErnieTokenizer.

The slow tokenizer (PaddleNLP ``ErnieTokenizer``) is the reference. The fast one rebuilds its pipeline in
`tokenizers` over the same vocabulary:

- special tokens found verbatim in the text ([CLS], [UNK], ...) stay whole and are not lower-cased;
- drop NUL/U+FFFD/control/unassigned characters, lower-case (per character), map whitespace to a space;
- NFD + drop non-spacing marks (accents) — only when lower-casing, as ErnieTokenizer does;
- split on whitespace, isolate every punctuation *and symbol* character (ErnieTokenizer's BasicTokenizer
  also splits on Unicode symbols, e.g. emoji, unlike BERT's) and every CJK ideograph;
- greedy longest-match WordPiece with ``##`` continuations, words over 100 characters → [UNK].

The character classes are computed from Python's ``unicodedata`` (the one the reference uses), not from the
Rust crates' own, older Unicode tables, so new emoji or marks are classified identically on both paths.
"""

from __future__ import annotations

import functools
import logging
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from worker.model.char_table import CharTable

log = logging.getLogger(__name__)

TokenizerKind = Literal["fast", "slow", "auto"]

# Code points ErnieTokenizer's BasicTokenizer treats as CJK ideographs (paddlenlp bert/tokenizer.py);
# note 0x2B820, where the `tokenizers` BertNormalizer starts at 0x2B920.
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
# paddlenlp tokenizer_utils._is_symbol: these count as symbols besides the S* categories.
_EXTRA_SYMBOLS = (0x00AD, 0x00B2, 0x00BA, 0x3007, 0x00B5, 0x00D8, 0x014B, 0x01B1)

# Texts for the start-up parity check of `tokenizer=auto` (the full corpus check is a test).
PARITY_PROBES = (
    "这个商品很好，物流也快！",
    "质量太差了。。。再也不买了!!!",
    "Hello World, iPhone 15 Pro Max 真的很香 👍👍",
    "ＡＢＣ全角字符１２３，「引号」【括号】",
    "价格￥199.00元, 折扣30%~50%",
    "emoji 😀🙃🫠❤️‍🔥 👍🏻 混合",
    "Ça coûte 10€ — naïve café résumé",
    "tab\tnew\nline\rcarriage\u3000ideographic\u00a0nbsp\u2028sep",
    "control\x00\x01\x7f\u200b\ufeff\ufffdchars",
    "[CLS] 特殊 [SEP] [UNK] [cls] [MASK]x",
    "a" * 120 + " " + "好" * 30,
    "ΣΊΣΥΦΟΣ İstanbul ǾØŊ ²µº 〇",
)


class ContentTokenizer(Protocol):
    """Texts → WordPiece ids without [CLS]/[SEP] (the layout is added by worker.model.long_text)."""

    kind: str

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...


class SlowErnieTokenizer:
    """The reference: PaddleNLP's pure-Python ``ErnieTokenizer`` (one text at a time)."""

    kind = "slow"

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        tok = self._tokenizer
        return [list(tok.convert_tokens_to_ids(tok.tokenize(text))) for text in texts]


class FastErnieTokenizer:
    """`tokenizers` WordPiece reproducing ``ErnieTokenizer`` ids; ``encode_batch`` runs in parallel (Rust)."""

    kind = "fast"

    def __init__(
        self,
        vocab: dict[str, int],
        *,
        unk_token: str,
        do_lower_case: bool,
        special_tokens: Sequence[str],
        max_input_chars_per_word: int = 100,
    ) -> None:
        from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers
        from tokenizers.models import WordPiece

        if unk_token not in vocab:
            raise ValueError(f"unk token {unk_token!r} is not in the vocabulary")
        tokenizer = Tokenizer(
            WordPiece(
                vocab,
                unk_token=unk_token,
                max_input_chars_per_word=max_input_chars_per_word,
                continuing_subword_prefix="##",
            )
        )
        classes = _char_classes()
        # Removal first: Rust's case tables are newer than Python's, so lower-casing first would turn code
        # points the reference treats as unassigned (and drops) into letters (U+A7CB → U+0264).
        steps: list[Any] = [normalizers.Replace(Regex(classes.removed), "")]
        if do_lower_case:
            steps.append(normalizers.Lowercase())
        steps.append(normalizers.Replace(Regex(classes.whitespace), " "))
        if do_lower_case:
            steps += [normalizers.NFD(), normalizers.Replace(Regex(classes.nonspacing_marks), "")]
        tokenizer.normalizer = normalizers.Sequence(steps)
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(classes.isolated), "isolated")]
        )
        missing = [t for t in special_tokens if t not in vocab]
        if missing:
            raise ValueError(f"special tokens {missing} are not in the vocabulary")
        # Special tokens written in the text stay whole and un-normalized, as ErnieTokenizer's trie split.
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
        self._tokenizer = tokenizer
        self._table = self._build_table()

    @classmethod
    def from_file(cls, path: Path) -> FastErnieTokenizer:
        """The fast tokenizer `save` wrote (`tokenizers`' own JSON): no PaddleNLP, no character tables to
        compute. Raises ValueError when the file is not a tokenizer `tokenizers` can read."""
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the Rust side raises Exception for any malformed file
            raise ValueError(f"{path} is not a tokenizer file: {exc}") from exc
        fast = cls.__new__(cls)
        fast._tokenizer = tokenizer
        fast._table = fast._build_table()
        return fast

    def _build_table(self) -> CharTable | None:
        """The character table standing in for the pipeline on most texts (see worker.model.char_table)."""
        tokenizer = self._tokenizer
        special = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special]
        return CharTable.build(
            self._encode_pipeline,
            tokenizer.get_vocab(),
            unk_token=tokenizer.model.unk_token,
            special_tokens=special,
            cjk_ranges=_CJK_RANGES,
            is_isolated=_is_isolated,
        )

    def save(self, path: Path) -> None:
        """Writes this tokenizer's whole pipeline (vocabulary, normalizer, splits, special tokens) as JSON."""
        self._tokenizer.save(str(path))

    @classmethod
    def from_paddle(cls, tokenizer: Any) -> FastErnieTokenizer:
        """Builds the fast twin of a PaddleNLP ``ErnieTokenizer`` (same vocab, case and special tokens)."""
        return cls(
            dict(tokenizer.get_vocab()),
            unk_token=str(tokenizer.unk_token),
            do_lower_case=bool(getattr(tokenizer, "do_lower_case", True)),
            special_tokens=sorted(set(tokenizer.unique_no_split_tokens) | set(tokenizer.all_special_tokens)),
            max_input_chars_per_word=int(tokenizer.wordpiece_tokenizer.max_input_chars_per_word),
        )

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._table is None:
            return self._encode_pipeline(texts)
        return self._table.encode_batch(texts)

    def _encode_pipeline(self, texts: Sequence[str]) -> list[list[int]]:
        """The tokenizer's whole pipeline (the general path)."""
        # encode_batch_fast (tokenizers ≥ 0.20) skips the character offsets, which only ids don't need.
        encode = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        return [list(e.ids) for e in encode(list(texts), add_special_tokens=False)]


@dataclass(frozen=True)
class _CharClasses:
    """Regex character classes (Oniguruma syntax) derived from Python's ``unicodedata``."""

    removed: str
    whitespace: str
    nonspacing_marks: str
    isolated: str


def _is_punctuation(cp: int, category: str) -> bool:
    ascii_punct = 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
    return ascii_punct or category.startswith("P")


def _is_isolated(cp: int, category: str) -> bool:
    """A character the basic tokenizer makes a word of its own: punctuation, symbol or CJK ideograph."""
    return (
        _is_punctuation(cp, category)
        or category.startswith("S")
        or cp in _EXTRA_SYMBOLS
        or any(lo <= cp <= hi for lo, hi in _CJK_RANGES)
    )


@functools.lru_cache(maxsize=1)
def _char_classes() -> _CharClasses:
    removed: list[int] = []
    whitespace: list[int] = []
    marks: list[int] = []
    isolated: list[int] = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue  # surrogates cannot occur in a Rust string
        ch = chr(cp)
        cat = unicodedata.category(ch)
        is_control = cat.startswith("C") and ch not in "\t\n\r"
        if cp == 0 or cp == 0xFFFD or is_control:
            removed.append(cp)
            continue
        if ch.isspace() or cat == "Zs":
            whitespace.append(cp)  # _clean_text's spaces, and what str.split() splits on besides them
            continue
        if cat == "Mn":
            marks.append(cp)
        if _is_isolated(cp, cat):
            isolated.append(cp)
    return _CharClasses(
        _regex_class(removed), _regex_class(whitespace), _regex_class(marks), _regex_class(isolated)
    )


def _regex_class(codepoints: list[int]) -> str:
    parts: list[str] = []
    start = prev = codepoints[0]
    for cp in [*codepoints[1:], -1]:
        if cp == prev + 1:
            prev = cp
            continue
        parts.append(f"\\x{{{start:X}}}" if start == prev else f"\\x{{{start:X}}}-\\x{{{prev:X}}}")
        start = prev = cp
    return "[" + "".join(parts) + "]"


def parity_mismatches(
    fast: ContentTokenizer, slow: ContentTokenizer, texts: Sequence[str]
) -> list[tuple[str, list[int], list[int]]]:
    """(text, fast ids, slow ids) for every text the two tokenizers encode differently."""
    return [
        (text, f, s)
        for text, f, s in zip(texts, fast.encode_batch(texts), slow.encode_batch(texts), strict=True)
        if f != s
    ]


def choose_tokenizer(paddle_tokenizer: Any, kind: TokenizerKind) -> ContentTokenizer:
    """The content tokenizer for ``kind``: slow (reference), fast, or auto.

    auto: the fast one when it can be built and matches the reference on ``PARITY_PROBES`` (checked now,
    a few milliseconds), else the slow one with a warning. ``fast`` raises ValueError if it can't be built.
    """
    slow = SlowErnieTokenizer(paddle_tokenizer)
    if kind == "slow":
        return slow
    try:
        fast = FastErnieTokenizer.from_paddle(paddle_tokenizer)
    except Exception as exc:  # noqa: BLE001 - any failure to rebuild the pipeline means: use the reference
        if kind == "fast":
            raise ValueError(f"cannot build the fast tokenizer: {type(exc).__name__}: {exc}") from exc
        log.warning("tokenizer=auto: using the slow tokenizer, the fast one cannot be built: %s", exc)
        return slow
    if kind == "fast":
        return fast
    mismatches = parity_mismatches(fast, slow, PARITY_PROBES)
    if mismatches:
        log.warning(
            "tokenizer=auto: using the slow tokenizer, the fast one differs on %d probe texts (e.g. %r)",
            len(mismatches),
            mismatches[0][0],
        )
        return slow
    return fast


FAST_TOKENIZER_FILE = "fast_tokenizer.json"
"""The fast tokenizer an export saves beside the model once it matched the reference on probe texts."""


@dataclass(frozen=True)
class SpecialIds:
    """The ids a sequence is laid out and padded with."""

    cls: int
    sep: int
    pad: int

    @classmethod
    def of(cls, paddle_tokenizer: Any) -> SpecialIds:
        t = paddle_tokenizer
        return cls(int(t.cls_token_id), int(t.sep_token_id), int(t.pad_token_id))


def save_checked_fast_tokenizer(
    paddle_tokenizer: Any, directory: Path, probes: Sequence[str]
) -> dict[str, Any] | None:
    """Writes `FAST_TOKENIZER_FILE` into `directory` when the fast tokenizer encodes every probe text as the
    reference does, and returns the record for sentiment_model.json's ``tokenizer`` section (`tokenizers`
    version, probes checked, special ids); None, and nothing written, when it cannot be built
    or differs (a served model then checks parity with PaddleNLP at every start, as before)."""
    import tokenizers

    try:
        fast = FastErnieTokenizer.from_paddle(paddle_tokenizer)
    except Exception as exc:  # noqa: BLE001 - as choose_tokenizer: any failure means the reference serves
        log.warning("no fast tokenizer saved: it cannot be built: %s", exc)
        return None
    mismatches = parity_mismatches(fast, SlowErnieTokenizer(paddle_tokenizer), probes)
    if mismatches:
        log.warning(
            "no fast tokenizer saved: it differs from the reference on %d probe texts", len(mismatches)
        )
        return None
    fast.save(directory / FAST_TOKENIZER_FILE)
    ids = SpecialIds.of(paddle_tokenizer)
    return {
        "tokenizers_version": tokenizers.__version__,
        "parity_probe_texts": len(probes),
        "special_ids": {"cls": ids.cls, "sep": ids.sep, "pad": ids.pad},
    }


def load_checked_fast_tokenizer(
    directory: Path, record: dict[str, Any]
) -> tuple[FastErnieTokenizer, SpecialIds] | None:
    """The fast tokenizer `save_checked_fast_tokenizer` saved, with the special ids it recorded; None when
    `record` (the ``tokenizer`` section) is empty, its file is missing, or it was checked under another
    `tokenizers` version (whose pipeline may encode differently: the caller checks parity again)."""
    import tokenizers

    path = directory / FAST_TOKENIZER_FILE
    if record.get("tokenizers_version") != tokenizers.__version__ or not path.is_file():
        return None
    try:
        given = dict(record["special_ids"])
        ids = SpecialIds(cls=int(given["cls"]), sep=int(given["sep"]), pad=int(given["pad"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"the tokenizer record of {directory} is invalid ({exc}): re-run the export"
        ) from exc
    return FastErnieTokenizer.from_file(path), ids


@dataclass(frozen=True)
class TokenizerSpeed:
    """Texts per second of each tokenizer on the same texts (best of the repeats)."""

    texts: int
    fast_texts_per_s: float
    slow_texts_per_s: float

    @property
    def ratio(self) -> float:
        return self.fast_texts_per_s / self.slow_texts_per_s if self.slow_texts_per_s else float("inf")


def measure_tokenizer_speed(
    fast: ContentTokenizer, slow: ContentTokenizer, texts: Sequence[str], repeats: int = 3
) -> TokenizerSpeed:
    """Times ``encode_batch`` of both tokenizers over ``texts`` (one call = the whole list)."""

    def rate(tok: ContentTokenizer) -> float:
        best = float("inf")
        for _ in range(max(1, repeats)):
            started = time.perf_counter()
            tok.encode_batch(texts)
            best = min(best, time.perf_counter() - started)
        return len(texts) / best if best > 0 else float("inf")

    return TokenizerSpeed(len(texts), rate(fast), rate(slow))
