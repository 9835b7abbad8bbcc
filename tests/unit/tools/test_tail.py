"""worker.tools.tail display helpers: records → rows (results, dead letters, reviews) → an aligned table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas import DeadLetterKind, ModelRef, SentimentResult, SourceRef, build_dead_letter_headers
from worker.tools.tail import TailedRecord, display_width, fit, format_table, result_row


def result_record(ident: str, label: str, confidence: float, offset: int, **metadata: Any) -> TailedRecord:
    result = SentimentResult(
        id=ident,
        label=label,
        label_id=1 if label == "positive" else 0,
        confidence=confidence,
        probabilities={label: confidence, "other": 1 - confidence},
        model=ModelRef(name="ernie-3.0-mini-zh-sentiment", version="abc123"),
        source=SourceRef(topic="reviews", partition=0, offset=offset, timestamp_ms=1_700_000_000_000),
        processing_time_ms=12.5,
        processed_at_ms=1_700_000_000_100,
        metadata=metadata,
    )
    return TailedRecord("results", 2, offset, ident.encode(), result.model_dump_json().encode(), [])


def dead_letter(value: bytes | None, kind: DeadLetterKind, reason: str, offset: int = 9) -> TailedRecord:
    headers = build_dead_letter_headers(kind, reason, "reviews", 1, offset, None, "worker-1")
    headers.insert(0, ("traceparent", b"00-abc"))  # a copied original header is ignored
    return TailedRecord("reviews-dlq", 0, offset, b"k-dlq", value, headers)


def test_result_row_reads_a_sentiment_result() -> None:
    row = result_row(result_record("r-1", "positive", 0.9731, 17, shop="川味小馆", stars=5))

    assert row == {
        "kind": "result",
        "id": "r-1",
        "label": "positive",
        "confidence": 0.9731,
        "error": None,
        "partition": 2,
        "offset": 17,
        "text": None,  # a result carries no text
        "reason": None,
        "key": "r-1",
        "source": "reviews/0/17",
        "metadata": {"shop": "川味小馆", "stars": 5},
    }


def test_result_row_shows_a_text_the_result_carries_in_its_metadata() -> None:
    row = result_row(result_record("r-2", "negative", 0.6, 3, text="很好"))

    assert (row["kind"], row["label"], row["text"], row["metadata"]) == (
        "result",
        "negative",
        "很好",
        {"text": "很好"},
    )


def test_the_results_table_shows_the_input_and_metadata_and_says_results_have_no_text() -> None:
    rows = [
        result_row(result_record("demo-001", "positive", 0.983, 3, domain="food", stars=5)),
        result_row(result_record("reviews/0/4", "negative", 0.754, 4)),
    ]

    lines = format_table(rows, width=100).splitlines()

    assert lines[0].endswith("INPUT, METADATA (a result has no text)")
    assert lines[2].endswith("0.983  reviews/0/3 domain=food stars=5")
    assert lines[3].endswith("0.754  reviews/0/4")


def test_the_id_of_a_dead_letter_is_the_review_id_never_the_message_key() -> None:
    """One thing in the ID column: the id the worker gives the review (the input's `id`, else the input's
    topic/partition/offset), as in the results table; the key of every record here is "k-dlq"."""
    rows = [
        result_row(dead_letter(b'{"id": "order-7", "text": ""}', DeadLetterKind.EMPTY_TEXT, "empty", 11)),
        result_row(dead_letter(b'{"id": 42, "text": 5}', DeadLetterKind.WRONG_TYPE, "number", 12)),
        result_row(dead_letter(b'{"text": 5}', DeadLetterKind.WRONG_TYPE, "number", 13)),
        result_row(dead_letter(b"not json", DeadLetterKind.INVALID_JSON, "not JSON", 14)),
        result_row(dead_letter(None, DeadLetterKind.EMPTY_VALUE, "tombstone", 15)),
    ]

    assert [row["id"] for row in rows] == ["order-7", "42", "reviews/1/13", "reviews/1/14", "reviews/1/15"]
    assert [row["source"] for row in rows] == [f"reviews/1/{offset}" for offset in range(11, 16)]
    assert {row["key"] for row in rows} == {"k-dlq"}
    table = format_table(rows, width=100)
    assert "k-dlq" not in table
    assert table.splitlines()[0].endswith("REASON | TEXT")


def test_result_row_reads_dead_letter_headers_and_original_value() -> None:
    original = json.dumps({"id": 77, "text": "   "}, ensure_ascii=False).encode()
    row = result_row(dead_letter(original, DeadLetterKind.EMPTY_TEXT, "text is blank; send some words"))

    assert row["kind"] == "dead_letter"
    assert (row["error"], row["label"]) == ("empty_text", None)  # the kind is an error, not a label
    assert row["reason"] == "text is blank; send some words"
    assert row["id"] == "77"
    assert (row["partition"], row["offset"]) == (0, 9)


def test_result_row_dead_letter_with_non_json_value_has_its_input_position_as_id_and_raw_text() -> None:
    row = result_row(dead_letter(b"\xffnot json", DeadLetterKind.INVALID_UTF8, "not UTF-8"))

    assert (row["kind"], row["error"], row["id"]) == ("dead_letter", "invalid_utf8", "reviews/1/9")
    assert row["text"] == "\ufffdnot json"


def test_result_row_dead_letter_with_malformed_headers_still_shows_the_kind() -> None:
    rec = TailedRecord("dlq", 0, 1, None, None, [("sentiment.error.kind", b"empty_value")])

    row = result_row(rec)

    assert (row["kind"], row["error"], row["reason"]) == (
        "dead_letter",
        "empty_value",
        "(malformed dead-letter headers)",
    )


def test_result_row_reads_input_reviews_and_raw_values() -> None:
    review = result_row(TailedRecord("reviews", 0, 5, b"r9", '{"id":"r9","text":"发货快"}'.encode(), []))
    raw = result_row(TailedRecord("reviews", 0, 6, None, "纯文本评论".encode(), []))
    tombstone = result_row(TailedRecord("reviews", 0, 7, b"gone", None, []))

    assert (review["kind"], review["id"], review["text"], review["label"]) == ("review", "r9", "发货快", None)
    assert (raw["kind"], raw["id"], raw["text"]) == ("raw", "reviews/0/6", "纯文本评论")
    assert (tombstone["kind"], tombstone["id"], tombstone["text"]) == ("raw", "reviews/0/7", None)
    assert (review["key"], raw["key"], tombstone["key"]) == ("r9", None, "gone")


# --- display width ----------------------------------------------------------------------------------------


def test_display_width_counts_cjk_double() -> None:
    assert display_width("abc") == 3
    assert display_width("中文") == 4
    assert display_width("ｆｕｌｌ") == 8  # fullwidth forms
    assert display_width("好，评！") == 8  # fullwidth punctuation
    assert display_width("e\u0301") == 1  # combining accent takes no column


@pytest.mark.parametrize(
    ("text", "width", "expected"),
    [
        ("abc", 5, "abc  "),
        ("中文评论", 8, "中文评论"),
        ("中文评论", 7, "中文评…"),  # 评 ends at column 6, … at 7
        ("中文评论", 6, "中文… "),  # 评 would leave no room for the ellipsis: pad
        ("abcdef", 4, "abc…"),
        ("a\nb\tc", 6, "a b c "),
    ],
)
def test_fit_pads_and_truncates_by_display_width(text: str, width: int, expected: str) -> None:
    out = fit(text, width)

    assert out == expected
    assert display_width(out) == width


def test_table_columns_align_with_chinese_text() -> None:
    rows = [
        result_row(
            result_record(
                "r-1", "positive", 0.9731, 17, text="这款手机的屏幕非常清晰，电池续航也很长，物流也快。"
            )
        ),
        result_row(result_record("订单-二〇二四", "negative", 0.512, 18, text="short ascii text")),
        result_row(
            dead_letter(b'{"text": 5}', DeadLetterKind.WRONG_TYPE, "`text` must be a string (got number)")
        ),
        result_row(TailedRecord("reviews", 0, 123456, None, '{"text":"混合 mixed 文本 text"}'.encode(), [])),
    ]

    table = format_table(rows, width=91)
    lines = table.splitlines()

    assert len(lines) == 2 + len(rows)
    assert all(display_width(line) <= 91 for line in lines)
    # Each row's cells start at the same terminal column as the header's.
    header = lines[0]
    starts = [display_width(header[: header.index(name)]) for name in ("ID", "LABEL", "CONF", "TEXT")]
    assert starts == [12, 30, 55, 62]
    cells = [
        ("2:17", "r-1", "positive", "0.973", "这款手机"),
        ("2:18", "订单-二〇二四", "negative", "0.512", "short ascii"),
        ("0:9", "reviews/1/9", "DLQ wrong_type", "", "`text` must be a string"),
        ("0:123456", "reviews/0/123456", "-", "", "混合 mixed"),
    ]
    for line, (position, ident, label, conf, detail) in zip(lines[2:], cells, strict=True):
        assert line.startswith(position)
        assert display_width(line[: line.index(detail)]) == starts[3]
        if ident:
            assert display_width(line[: line.index(ident)]) == starts[0]
        assert display_width(line[: line.index(label)]) == starts[1]
        if conf:
            assert display_width(line[: line.index(conf)]) == starts[2]
    # The long Chinese review is cut by display width with an ellipsis, exactly at the table width.
    assert lines[2].endswith("…")
    assert display_width(lines[2]) == 91


def test_table_shows_dead_letter_reason_and_original_text() -> None:
    value = '{"text": "很长的评论"}'.encode()
    rows = [result_row(dead_letter(value, DeadLetterKind.TEXT_TOO_LONG, "text has 9000 characters"))]

    table = format_table(rows, width=120)

    assert table.splitlines()[2].endswith(
        "DLQ text_too_long" + " " * 6 + "  " + " " * 5 + "  text has 9000 characters | 很长的评论"
    )
