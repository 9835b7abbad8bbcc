"""Vocabularies: the character vocabulary of the from-scratch model, built so ``ErnieTokenizer`` covers the
training text, and pruning of the rows a pretrained vocabulary's tokenizer can never emit."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.errors import OperationError
from worker.model.fast_tokenizer import PARITY_PROBES, FastErnieTokenizer, SlowErnieTokenizer
from worker.model.metadata import CONFIG_FILES, TOKENIZER_CONFIG_FILE, find_weights
from worker.model.weights import read_weights, save_weights

SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
SLOW_PARITY_SAMPLE = 500
"""Texts (besides the probes) also checked with the reference tokenizer; all go through the fast twin."""
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


def read_vocab(path: Path) -> list[str]:
    """The tokens of a vocab.txt, id = line number; lines end at "\\n" only (a token may be U+2028)."""
    tokens = path.read_text(encoding="utf-8").split("\n")
    return tokens[:-1] if tokens and tokens[-1] == "" else tokens


def write_vocab(tokens: list[str], path: Path) -> None:
    """Write one token per line (line number = id), the format ``ErnieTokenizer(vocab_file)`` reads."""
    path.write_text("".join(tok + "\n" for tok in tokens), encoding="utf-8")


@dataclass(frozen=True)
class PruneReport:
    """What `prune_vocabulary` did: vocabulary rows before and after, and how many texts it checked."""

    rows_before: int
    rows_after: int
    parity_texts: int

    @property
    def dropped(self) -> int:
        """Rows removed: tokens the tokenizer can never emit."""
        return self.rows_before - self.rows_after


class VocabularyError(OperationError):
    """Pruning would change what the tokenizer emits, or the directory is not an ERNIE model directory."""


def unreachable_tokens(tokens: Sequence[str], basic_tokenize: Callable[[str], list[str]]) -> set[int]:
    """Ids of the tokens WordPiece can never emit after `basic_tokenize` (the tokenizer's BasicTokenizer).

    BasicTokenizer makes every CJK ideograph and every punctuation character a word of its own and
    lower-cases the rest, so WordPiece only ever sees clean words: a whole-word token must survive
    `basic_tokenize` as one unchanged word, and a ``##`` continuation must stay one word when it follows a
    letter. ``##好`` (7,322 such rows in bge-small-zh's vocabulary), ``##中国``, ``Ab`` or ``a.`` fail that.
    Bracketed special tokens ([CLS], [PAD], [unused1] ...) are always kept.
    """
    dropped: set[int] = set()
    for i, token in enumerate(tokens):
        if token.startswith("[") and token.endswith("]"):
            continue
        continuation = token.startswith("##") and len(token) > 2
        surface = "x" + token[2:] if continuation else token  # a continuation is glued to a letter
        if basic_tokenize(surface) != [surface]:
            dropped.add(i)
    return dropped


def prune_vocabulary(directory: Path, parity_texts: Sequence[str]) -> PruneReport:
    """Drop the vocabulary rows the tokenizer can never emit from a model directory, in place: `vocab.txt`
    rewritten, the word-embedding rows gathered, `config.json`'s vocab_size and pad_token_id remapped.

    Lossless by construction, and checked: every text of `parity_texts` (plus the tokenizer's edge-case
    probes) must tokenize to the same token strings before and after, else VocabularyError and nothing is
    written. Logits are unchanged too (the dropped rows are never looked up).
    """
    from paddlenlp.transformers import ErnieTokenizer

    vocab_file = directory / "vocab.txt"
    weights = find_weights(directory)
    config_file = next((directory / n for n in CONFIG_FILES if (directory / n).is_file()), None)
    if not vocab_file.is_file() or weights is None or config_file is None:
        raise VocabularyError(f"{directory} has no vocab.txt, config.json and model.safetensors")
    tokens = read_vocab(vocab_file)
    before = ErnieTokenizer.from_pretrained(str(directory))
    dropped = unreachable_tokens(tokens, before.basic_tokenizer.tokenize)
    kept = [i for i in range(len(tokens)) if i not in dropped]
    new_id = {old: new for new, old in enumerate(kept)}

    texts = [*parity_texts, *PARITY_PROBES]
    with tempfile.TemporaryDirectory(prefix="sentiment-vocab-") as tmp:
        for name in (TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE):  # the same tokenizer, pruned vocab
            if (directory / name).is_file():
                shutil.copy(directory / name, Path(tmp) / name)
        write_vocab([tokens[i] for i in kept], Path(tmp) / "vocab.txt")
        after = ErnieTokenizer.from_pretrained(tmp)
        # Every text through the fast twins (Rust, batched: seconds for the corpus), and the reference
        # tokenizer itself on the probes and an even sample, so a fast-twin quirk cannot hide a change.
        fast_before, fast_after = (
            FastErnieTokenizer.from_paddle(before),
            FastErnieTokenizer.from_paddle(after),
        )
        _check_parity(texts, fast_before.encode_batch(texts), fast_after.encode_batch(texts), new_id, after)
        sample = [*PARITY_PROBES, *texts[:: max(1, len(texts) // SLOW_PARITY_SAMPLE)]]
        slow_before, slow_after = SlowErnieTokenizer(before), SlowErnieTokenizer(after)
        _check_parity(
            sample, slow_before.encode_batch(sample), slow_after.encode_batch(sample), new_id, after
        )

    state = read_weights(weights)
    rows = [k for k, t in state.items() if k.endswith("word_embeddings.weight") and t.shape[0] == len(tokens)]
    if len(rows) != 1:
        raise VocabularyError(f"{weights} has no single word-embedding table of {len(tokens)} rows: {rows}")
    state[rows[0]] = state[rows[0]][kept]
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["vocab_size"] = len(kept)
    for key in [k for k in config if k.endswith("_token_id") and isinstance(config[k], int)]:
        if config[key] in dropped:
            raise VocabularyError(f"{config_file.name} {key}={config[key]} names a dropped token")
        config[key] = new_id.get(config[key], config[key])
    save_weights(state, directory)
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_vocab([tokens[i] for i in kept], vocab_file)
    return PruneReport(rows_before=len(tokens), rows_after=len(kept), parity_texts=len(texts))


def _check_parity(
    texts: Sequence[str],
    old_ids: Sequence[list[int]],
    new_ids: Sequence[list[int]],
    new_id: dict[int, int],
    after: Any,
) -> None:
    """VocabularyError naming the first text whose remapped old ids differ from the pruned tokenizer's."""
    for n, (text, old, new) in enumerate(zip(texts, old_ids, new_ids, strict=True)):
        if [new_id.get(i, -1) for i in old] != new:
            raise VocabularyError(
                f"pruning would change the tokens of text {n} ({text[:40]!r}): old ids {old} remapped "
                f"{[new_id.get(i, -1) for i in old]} vs {after.convert_ids_to_tokens(new)} ({new})"
            )
