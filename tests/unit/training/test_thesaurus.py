"""`train --synonym-copies`: reviews with words swapped for synonyms from a shipped thesaurus."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from worker.training.options import TrainingError, TrainOptions
from worker.training.thesaurus import (
    ThesaurusError,
    load_thesaurus,
    parse_thesaurus,
    synonym_texts,
    synonym_variant,
    thesaurus_path,
)

LINES = [
    "Ed20A01= 满意 心满意足 称心 意",  # a synonym group; the single character is too ambiguous to use
    "Ed20A02# 满意度 好评",  # related words, not synonyms: skipped
    "Ed20A03@ 如意",  # a word alone: skipped
    "Ga01A01= 干净 清洁 整洁",
]


def test_only_synonym_groups_of_two_characters_or_more_are_read() -> None:
    thesaurus = parse_thesaurus(LINES)
    assert thesaurus["满意"] == ("心满意足", "称心")
    assert thesaurus["清洁"] == ("干净", "整洁")
    assert "意" not in thesaurus and "满意度" not in thesaurus and "如意" not in thesaurus
    with pytest.raises(ThesaurusError, match="line 1: expected an 8-character code"):
        parse_thesaurus(["Ed20= 满意 称心"])


def test_a_variant_swaps_known_words_only() -> None:
    thesaurus = parse_thesaurus(LINES)
    words = ["房间", "很", "干净", "，", "非常", "满意"]
    variants = {synonym_variant(words, thesaurus, random.Random(seed), share=1.0) for seed in range(20)}
    # both known words swapped every time, the rest untouched
    assert variants <= {f"房间很{a}，非常{b}" for a in ("清洁", "整洁") for b in ("心满意足", "称心")}
    assert len(variants) > 1
    # at least one word is swapped even when the share rounds to none
    low = synonym_variant(words, thesaurus, random.Random(0), share=0.01)
    assert low is not None and low != "".join(words) and len(low) >= len("".join(words))
    assert synonym_variant(["没有", "同义词"], thesaurus, random.Random(0), share=0.5) is None


def test_synonym_texts_from_the_installed_thesaurus() -> None:
    assert thesaurus_path().name == "同义词.txt"
    thesaurus = load_thesaurus()
    assert len(thesaurus) > 30_000 and "满意" in thesaurus
    texts = ["房间很干净，服务员态度非常好，下次还会再来。", "送错了餐，打电话也没人理，差评。", "嗯"]
    out = synonym_texts(texts, 2, seed=3)
    assert len(out) == 4  # "嗯" has no word the thesaurus knows: skipped in both copies
    assert all(text not in texts for text in out)
    assert synonym_texts(texts, 2, seed=3) == out  # seeded
    assert synonym_texts(texts, 0, seed=3) == []


def test_a_missing_thesaurus_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ThesaurusError, match="cannot read the thesaurus"):
        load_thesaurus(tmp_path / "missing.txt")


def test_synonym_copies_need_a_teacher(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="synonym_copies need a teacher"):
        TrainOptions(output_dir=tmp_path, synonym_copies=1).validate()
    with pytest.raises(TrainingError, match="synonym_copies must be >= 0"):
        TrainOptions(output_dir=tmp_path, teacher="t", synonym_copies=-1).validate()
