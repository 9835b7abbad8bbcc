"""`adapt`'s input: the text, label and rating columns, the label words, the middle ratings, and the odd-row
rule (`produce`'s: a file with bad rows is refused, each named by line, unless --skip-bad)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.files.review_files import FeedFileError, ReviewFile
from worker.tools.adapt_rows import LABEL_PROBLEM, read_labelled
from worker.training.adapt_labels import LabelRule, label_word
from worker.training.corpus import LabeledText


@pytest.mark.parametrize(
    ("word", "label"),
    [("0", 0), ("1", 1), ("negative", 0), ("Positive", 1), (" neg ", 0), ("POS", 1), ("负面", 0),
     ("正面", 1), ("差评", 0), ("好评", 1), (0, 0), (1, 1)],
)  # fmt: skip
def test_label_words_in_english_and_chinese(word: object, label: int) -> None:
    assert label_word(word) == label


@pytest.mark.parametrize("word", ["2", "maybe", "", None, True, "中评"])
def test_other_label_values_are_refused(word: object) -> None:
    with pytest.raises(ValueError, match="not a label word"):
        label_word(word)


def test_ratings_cut_at_the_thresholds_and_the_middle_is_dropped() -> None:
    rule = LabelRule("stars", rating=True)
    assert [rule.label_of(v) for v in ("1", 2, "2.0", "3", 3.5, "4", 5, "5星")] == [
        0,
        0,
        0,
        None,
        None,
        1,
        1,
        1,
    ]
    wide = LabelRule("stars", rating=True, negative_max=3, positive_min=5)
    assert [wide.label_of(v) for v in (3, 4, 5)] == [0, None, 1]
    with pytest.raises(ValueError, match="not a number"):
        rule.label_of("five")
    with pytest.raises(ValueError, match="must be below"):
        LabelRule("stars", rating=True, negative_max=4, positive_min=4)


def _csv(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_rated_csv_with_named_columns(tmp_path: Path) -> None:
    path = _csv(
        tmp_path / "rated.csv",
        ["评论,评分,店铺", "送餐很快,5,a", "太难吃了,1,b", "一般般,3,c", "还行吧,4,d", "送餐很快,5,e"],
    )
    rows = read_labelled(ReviewFile(path, text_field="评论"), LabelRule("评分", rating=True))
    assert rows.examples == [LabeledText("送餐很快", 1), LabeledText("太难吃了", 0), LabeledText("还行吧", 1)]
    assert (rows.read, rows.middle_dropped, rows.repeats, rows.bad) == (5, 1, 1, [])
    assert "1 middle ratings dropped" in rows.describe("rated.csv", LabelRule("评分", rating=True))


def test_a_jsonl_with_label_words(tmp_path: Path) -> None:
    path = tmp_path / "labelled.jsonl"
    lines = [{"review": "很好", "sentiment": "好评"}, {"review": "很差", "sentiment": "差评"},
             {"review": "不错", "sentiment": 1}]  # fmt: skip
    path.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n", encoding="utf-8")
    rows = read_labelled(ReviewFile(path, text_field="review"), LabelRule("sentiment"))
    assert [(ex.text, ex.label_id) for ex in rows.examples] == [("很好", 1), ("很差", 0), ("不错", 1)]


def test_the_odd_row_rule_refuses_the_file_naming_each_bad_row(tmp_path: Path) -> None:
    path = _csv(
        tmp_path / "odd.csv",
        ["text,label", "很好,1", "多了,一个,字段", "很差,0", "没有标签,", "   ,1", "不错,maybe"],
    )
    with pytest.raises(FeedFileError) as refused:
        read_labelled(ReviewFile(path), LabelRule("label"))
    message = str(refused.value)
    assert "4 of 6 rows cannot be used, so nothing was trained" in message
    for line, kind in ((3, "invalid_csv"), (5, LABEL_PROBLEM), (6, "empty_text"), (7, LABEL_PROBLEM)):
        assert f"line {line}: {kind}" in message
    rows = read_labelled(ReviewFile(path), LabelRule("label"), skip_bad=True)
    assert [(ex.text, ex.label_id) for ex in rows.examples] == [("很好", 1), ("很差", 0)]
    assert [bad.line for bad in rows.bad] == [3, 5, 6, 7]


def test_a_missing_label_column_is_named(tmp_path: Path) -> None:
    path = _csv(tmp_path / "nolabel.csv", ["text,stars", "很好,5"])
    with pytest.raises(FeedFileError, match="no `label` column.*--label-field"):
        read_labelled(ReviewFile(path), LabelRule("label"))
    with pytest.raises(FeedFileError, match="no `body` column.*--text-field"):
        read_labelled(ReviewFile(path, text_field="body"), LabelRule("stars", rating=True))
