"""Review files as teams export them: UTF-8, UTF-8 with a BOM, GB18030/GBK (Excel's CSV on a Chinese
Windows), or the encoding named; a clear line when none reads it; ids that occur twice reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.files.review_files import BadRow, FeedFileError, FileReview, ReviewFile

SHOP_CSV = (
    "评论ID,评论内容,店铺,评分\nR1,外送很快，餐點還是熱的 😀,s1,5\nR2,Great value,s2,4\nR3,太差了,s1,1\n"
)


def good(file: ReviewFile) -> list[FileReview]:
    rows = list(file)
    assert not [row for row in rows if isinstance(row, BadRow)], rows
    return [row for row in rows if isinstance(row, FileReview)]


@pytest.mark.parametrize(
    ("encoding", "text", "read_as"),
    [
        ("utf-8", SHOP_CSV, "utf-8"),
        ("utf-8-sig", SHOP_CSV, "utf-8"),
        ("gbk", SHOP_CSV.replace(" 😀", "").replace("餐點還是熱的", "餐点还是热的"), "gb18030"),
        ("gb18030", SHOP_CSV, "gb18030"),
    ],
)
def test_a_csv_is_read_in_the_encoding_it_was_saved_in(
    tmp_path: Path, encoding: str, text: str, read_as: str
) -> None:
    path = tmp_path / "shop.csv"
    path.write_bytes(text.encode(encoding))
    file = ReviewFile(path, text_field="评论内容", id_field="评论ID")
    rows = good(file)
    assert file.encoding == read_as
    assert [row.id for row in rows] == ["R1", "R2", "R3"]
    assert rows[1].text == "Great value" and rows[2].text == "太差了"
    assert rows[0].metadata == {"店铺": "s1", "评分": "5"}


def test_a_gbk_jsonl_line_reaches_the_worker_as_utf8(tmp_path: Path) -> None:
    path = tmp_path / "shop.jsonl"
    path.write_bytes('{"id": "R1", "text": "质量很好"}\n'.encode("gbk"))
    rows = good(ReviewFile(path))
    assert rows[0].text == "质量很好" and rows[0].raw == '{"id": "R1", "text": "质量很好"}'.encode()


def test_the_encoding_named_wins_and_a_wrong_one_says_what_to_give(tmp_path: Path) -> None:
    path = tmp_path / "shop.csv"
    path.write_bytes(SHOP_CSV.replace(" 😀", "").encode("gbk"))
    with pytest.raises(FeedFileError) as wrong:
        list(ReviewFile(path, text_field="评论内容", encoding="utf-8"))
    said = str(wrong.value)
    assert "header row is not valid utf-8 text" in said and "--encoding" in said and "gb18030" in said
    assert "\\udc" not in said and "\udcc6" not in said
    assert [
        r.id for r in good(ReviewFile(path, text_field="评论内容", id_field="评论ID", encoding="GBK"))
    ] == [
        "R1",
        "R2",
        "R3",
    ]


def test_a_file_in_no_encoding_it_knows_says_so_in_one_line_naming_the_choices(tmp_path: Path) -> None:
    path = tmp_path / "odd.csv"
    path.write_bytes(b"\xff\xfe\xff,id\n\xe5\xa5\xbd,1\n")
    with pytest.raises(FeedFileError) as unreadable:
        list(ReviewFile(path))
    said = str(unreadable.value)
    assert "\n" not in said and "the header row is not valid utf-8 text" in said
    assert "--encoding (auto (UTF-8, UTF-8 with BOM, then GB18030/GBK), utf-8, gb18030" in said
    lines = tmp_path / "odd.txt"
    lines.write_bytes("好评\n".encode() + b"\xff\xfe\xff\n")
    bad = [row for row in ReviewFile(lines) if isinstance(row, BadRow)]
    assert [(row.line, row.kind) for row in bad] == [(2, "invalid_utf8")]
    assert "give the file's encoding with --encoding" in bad[0].reason
    with pytest.raises(FeedFileError, match="unknown encoding 'klingon'"):
        ReviewFile(path, encoding="klingon")


def test_ids_that_occur_twice_are_reported_with_count_and_first_examples(tmp_path: Path) -> None:
    path = tmp_path / "dups.csv"
    rows = ["id,text", *(f"R{i % 5},review {i}" for i in range(12)), "Z,once"]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    file = ReviewFile(path, id_field="id")
    assert len(good(file)) == 13
    assert file.duplicate_ids() == {"R0": 3, "R1": 3, "R2": 2, "R3": 2, "R4": 2}
    warning = file.duplicate_warning()
    assert warning is not None
    assert "5 id(s) occur more than once (R0 ×3, R1 ×3, R2 ×2, ...)" in warning
    assert "the 7 repeated row(s) are kept" in warning
    single = tmp_path / "single.csv"
    single.write_text("id,text\nA,x\nB,y\n", encoding="utf-8")
    once = ReviewFile(single)
    good(once)
    assert once.duplicate_warning() is None


def test_a_utf8_file_with_one_bad_byte_stays_utf8_and_names_that_row(tmp_path: Path) -> None:
    path = tmp_path / "mostly.csv"
    path.write_bytes("id,text\nR1,质量很好\nR2,太差了\n".encode() + b"R3,\xe5\xa5\n")
    file = ReviewFile(path)
    rows = list(file)
    assert file.encoding == "utf-8"
    assert [(row.line, type(row).__name__) for row in rows] == [
        (2, "FileReview"),
        (3, "FileReview"),
        (4, "BadRow"),
    ]
