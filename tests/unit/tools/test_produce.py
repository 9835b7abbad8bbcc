"""worker.tools.produce: review files → records (each format, every bad row named by its line before
anything is sent, the columns named), the rate schedule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schemas.review_decode import InputFormat, decode_review
from schemas.review_input import Review
from worker.cli.produce import summary
from worker.files.review_files import BadRow, FeedFileError, ReviewFile, detect_format
from worker.tools.produce import (
    DeliveryTally,
    FeedRecord,
    FileCheck,
    MessageFields,
    ProduceReport,
    RateLimiter,
    check_file,
    feed_records,
)


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return path


def read_reviews(
    path: Path, fmt: Any = "auto", *, raw_text: bool = False, **columns: Any
) -> list[FeedRecord]:
    return list(feed_records(ReviewFile(path, fmt, **columns), raw_text=raw_text))


def checked(path: Path, fmt: Any = "auto", **columns: Any) -> FileCheck:
    return check_file(ReviewFile(path, fmt, max_text_chars=100, **columns))


def bad_rows(path: Path, fmt: Any = "auto", **columns: Any) -> list[tuple[int, str]]:
    return [(row.line, row.kind) for row in checked(path, fmt, **columns).bad]


def decoded(record: FeedRecord, input_format: InputFormat = "json") -> Review:
    """What the worker makes of the record: the files must produce valid reviews."""
    result = decode_review(
        record.value,
        input_format=input_format,
        max_value_bytes=100_000,
        max_text_chars=10_000,
        max_json_depth=8,
        default_id="t/0/0",
    )
    assert isinstance(result, Review), result
    return result


# --- jsonl ------------------------------------------------------------------------------------------------


def test_jsonl_lines_are_sent_byte_for_byte_with_id_keys(tmp_path: Path) -> None:
    lines = [
        '{"id": "r1", "text": "质量很好", "stars": 5}',
        '{"text": "没有编号"}',
        '{"id": 42, "text":"整数编号"}',
    ]
    path = write(tmp_path, "reviews.jsonl", "\n".join(lines) + "\n")

    records = read_reviews(path)

    assert [r.line for r in records] == [1, 2, 3]
    assert [r.value for r in records] == [line.encode() for line in lines]
    assert [r.key for r in records] == [b"r1", None, b"42"]
    assert decoded(records[0]).metadata == {"stars": 5}


def test_jsonl_bad_lines_are_all_named_by_the_worker_s_rules(tmp_path: Path) -> None:
    lines = [
        '{"text": "好"}',
        "",
        '{"text": "坏"',
        '{"text": "a", "score": NaN}',
        '{"text": "\u200b "}',
        '["text"]',
        '{"text": 5}',
        '{"body": "x"}',
        '{"text": "' + "长" * 101 + '"}',
        '{"text": "最后"}',
    ]
    path = write(tmp_path, "reviews.jsonl", "\n".join(lines) + "\n")

    check = checked(path)

    assert (check.read, check.good) == (10, 2)
    assert [(row.line, row.kind) for row in check.bad] == [
        (2, "empty_text"),
        (3, "invalid_json"),
        (4, "invalid_json"),
        (5, "empty_text"),
        (6, "not_an_object"),
        (7, "wrong_type"),
        (8, "missing_text"),
        (9, "text_too_long"),
    ]
    assert "--text-field" in check.bad[6].reason
    assert "more than the limit of 100" in check.bad[7].reason


def test_jsonl_invalid_utf8_names_line_and_byte(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.jsonl", b'{"text": "ok"}\n{"text": "\xff\xfe"}\n')

    (bad,) = checked(path).bad

    assert (bad.line, bad.kind) == (2, "invalid_utf8")
    assert "byte 11 (0xff)" in bad.reason


def test_jsonl_bom_and_crlf_are_not_part_of_the_value(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.jsonl", b'\xef\xbb\xbf{"id": "a", "text": "x"}\r\n{"text": "y"}\r\n')

    records = read_reviews(path)

    assert [r.value for r in records] == [b'{"id": "a", "text": "x"}', b'{"text": "y"}']
    assert records[0].key == b"a"


def test_pretty_printed_json_file_gets_a_hint(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.json", '[\n  {"text": "x"}\n]\n')

    assert "JSON Lines" in checked(path).bad[0].reason


def test_jsonl_fields_named_are_sent_under_the_worker_s_names(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.jsonl", '{"review_id": 7, "content": "很好", "shop": "s"}\n')

    (record,) = read_reviews(path, text_field="content", id_field="review_id")

    assert json.loads(record.value) == {"id": "7", "text": "很好", "shop": "s"}
    assert record.key == b"7"
    file = ReviewFile(path, text_field="content", id_field="review_id")
    (renamed,) = feed_records(file, MessageFields(text="body", id="key"))
    assert json.loads(renamed.value) == {"key": "7", "body": "很好", "shop": "s"}


# --- csv --------------------------------------------------------------------------------------------------


def test_csv_builds_json_with_id_key_and_metadata_columns(tmp_path: Path) -> None:
    content = "id,text,stars,shop\nr1,物流很快，包装完好,5,旗舰店\n,没有编号,1,\n"
    path = write(tmp_path, "reviews.csv", content)

    records = read_reviews(path)

    assert [r.key for r in records] == [b"r1", None]
    assert [r.line for r in records] == [2, 3]
    first, second = (json.loads(r.value) for r in records)
    assert first == {"id": "r1", "text": "物流很快，包装完好", "stars": "5", "shop": "旗舰店"}
    assert second == {"text": "没有编号", "stars": "1", "shop": ""}
    review = decoded(records[0])
    assert (review.id, review.text, review.metadata) == (
        "r1",
        "物流很快，包装完好",
        {"stars": "5", "shop": "旗舰店"},
    )


def test_csv_quoted_multiline_field_and_line_numbers(tmp_path: Path) -> None:
    content = 'text,id\n"第一行\n第二行",a\n\n"有,逗号",b\nbad row without id column\n'
    path = write(tmp_path, "reviews.csv", content)

    first, second = read_reviews(path)

    assert (first.line, json.loads(first.value)["text"]) == (2, "第一行\n第二行")
    assert (second.line, second.key, json.loads(second.value)["text"]) == (5, b"b", "有,逗号")
    check = checked(path)
    assert [(row.line, row.kind) for row in check.bad] == [(4, "empty_text"), (6, "invalid_csv")]
    assert "1 fields but the header has 2" in check.bad[1].reason


def test_csv_bom_is_not_part_of_the_first_column_name(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.csv", "\ufefftext,id\n很好,7\n")

    records = read_reviews(path)

    assert json.loads(records[0].value) == {"text": "很好", "id": "7"}
    assert records[0].key == b"7"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("id,body\n1,x\n", "no `text` column (found: id, body): name the column that holds the review text "),
        ("", "empty file"),
        ("text,text\nx,y\n", "duplicate column names in the header: text"),
    ],
)
def test_csv_header_errors_name_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = write(tmp_path, "reviews.csv", content)

    with pytest.raises(FeedFileError) as caught:
        checked(path)

    assert caught.value.line == 1
    assert message in str(caught.value)


def test_csv_bad_rows_follow_the_one_rule(tmp_path: Path) -> None:
    content = "text,id\n好,1\n   ,2\n\u200b\u200d,3\n\x07,4\n" + "长" * 101 + ",5\n😀,6\n,,\n"
    path = write(tmp_path, "reviews.csv", content)

    check = checked(path)

    assert (check.read, check.good) == (7, 2)
    assert [(row.line, row.kind, row.id) for row in check.bad] == [
        (3, "empty_text", "2"),
        (4, "empty_text", "3"),
        (5, "empty_text", "4"),
        (6, "text_too_long", "5"),
        (8, "empty_text", None),
    ]


def test_csv_invalid_utf8_is_a_bad_row_not_the_end_of_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.csv", b"text,shop\n\xff\xfe,a\n\xe5\xa5\xbd,b\n")

    check = checked(path)

    assert [(row.line, row.kind) for row in check.bad] == [(2, "invalid_utf8")]
    assert check.good == 1


def test_csv_columns_by_name(tmp_path: Path) -> None:
    """The newcomer's export: `review_id,content,shop` becomes the worker's `id`, `text` and metadata."""
    path = write(tmp_path, "reviews.csv", "review_id,content,shop\nR1,好吃,川味\n,一般,面馆\n")

    first, second = read_reviews(path, text_field="content", id_field="review_id")

    assert json.loads(first.value) == {"id": "R1", "text": "好吃", "shop": "川味"}
    assert (first.key, second.key) == (b"R1", None)
    assert decoded(first).id == "R1" and decoded(first).metadata == {"shop": "川味"}
    with pytest.raises(FeedFileError, match="no `review_id2` column"):
        checked(path, text_field="content", id_field="review_id2")


def test_a_column_that_would_clash_with_the_worker_s_fields_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.csv", "text,content\nold,好吃\n")

    with pytest.raises(FeedFileError, match="the field `text` would be sent beside"):
        checked(path, text_field="content")


# --- txt --------------------------------------------------------------------------------------------------


def test_txt_lines_become_json_reviews(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.txt", '\ufeff手机很好用\n"引号" 和 \\ 反斜杠\r\n')

    records = read_reviews(path)

    assert [r.line for r in records] == [1, 2]
    assert [r.key for r in records] == [None, None]
    assert [json.loads(r.value) for r in records] == [{"text": "手机很好用"}, {"text": '"引号" 和 \\ 反斜杠'}]
    assert decoded(records[1]).text == '"引号" 和 \\ 反斜杠'


def test_txt_blank_lines_are_bad_rows_not_skipped_silently(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.txt", "好\n\n  \n差\n")

    check = checked(path)

    assert (check.read, check.good) == (4, 2)
    assert [(row.line, row.kind, row.reason) for row in check.bad] == [
        (2, "empty_text", "the line is empty"),
        (3, "empty_text", "the line holds only whitespace"),
    ]
    assert "nothing was sent" in check.refusal("reviews.txt") and "--skip-bad" in check.refusal("reviews.txt")
    with pytest.raises(FeedFileError, match="no columns"):
        ReviewFile(path, text_field="content")


def test_txt_raw_text_sends_the_line_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.txt", "屏幕清晰\n续航一般\n")

    records = read_reviews(path, raw_text=True)

    assert [r.value for r in records] == ["屏幕清晰".encode(), "续航一般".encode()]
    assert decoded(records[1], input_format="text").text == "续航一般"


def test_skipped_rows_go_to_the_callback_and_from_line_starts_later(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.txt", "一\n\n三\n四\n")
    skipped: list[BadRow] = []

    records = list(feed_records(ReviewFile(path), from_line=3, on_bad=skipped.append))
    everything = list(feed_records(ReviewFile(path), on_bad=skipped.append))

    assert [r.line for r in records] == [3, 4]
    assert [r.line for r in everything] == [1, 3, 4]
    assert [row.line for row in skipped] == [2]
    assert check_file(ReviewFile(path), from_line=3).read == 2


# --- format selection -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [("a.jsonl", "jsonl"), ("a.JSON", "jsonl"), ("a.ndjson", "jsonl"), ("a.csv", "csv"), ("a.txt", "txt")],
)
def test_auto_format_by_suffix(name: str, expected: str) -> None:
    assert detect_format(Path(name)) == expected


def test_unknown_suffix_and_missing_file_are_feed_errors(tmp_path: Path) -> None:
    with pytest.raises(FeedFileError, match="cannot tell the format"):
        ReviewFile(write(tmp_path, "reviews.xml", "<x/>"))
    with pytest.raises(FeedFileError, match="cannot open"):
        read_reviews(tmp_path / "missing.jsonl")


def test_explicit_format_overrides_suffix(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.data", "text\n好评\n")

    assert [json.loads(r.value) for r in read_reviews(path, "csv")] == [{"text": "好评"}]


# --- rate limiter -----------------------------------------------------------------------------------------


class FakeClock:
    """A manual monotonic clock; `sleep` advances it. Every other sleep returns after half the requested
    time when `early_returns` is set, as producer.poll does after serving a delivery callback."""

    def __init__(self, early_returns: bool = False) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        self.early_returns = early_returns

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        early = self.early_returns and len(self.sleeps) % 2 == 1
        self.now += seconds / 2 if early else seconds


def send_times(limiter: RateLimiter, clock: FakeClock, n: int, work_s: float = 0.0) -> list[float]:
    times = []
    for _ in range(n):
        limiter.wait()
        times.append(round(clock.now - 100.0, 9))
        clock.now += work_s  # time spent producing, between waits
    return times


def test_rate_limiter_schedules_by_start_time() -> None:
    clock = FakeClock()
    limiter = RateLimiter(10.0, clock=clock, sleep=clock.sleep)

    assert send_times(limiter, clock, 5) == [0.0, 0.1, 0.2, 0.3, 0.4]


def test_rate_limiter_does_not_drift_when_sending_takes_time() -> None:
    clock = FakeClock()
    limiter = RateLimiter(50.0, clock=clock, sleep=clock.sleep)

    times = send_times(limiter, clock, 1001, work_s=0.007)

    # sleep(1/rate) after each send would end at 1000 * (0.02 + 0.007) = 27 s.
    assert times[-1] == pytest.approx(20.0, abs=1e-6)
    assert times[:3] == pytest.approx([0.0, 0.02, 0.04])


def test_rate_limiter_keeps_waiting_when_sleep_returns_early() -> None:
    clock = FakeClock(early_returns=True)
    limiter = RateLimiter(4.0, clock=clock, sleep=clock.sleep)

    times = send_times(limiter, clock, 3)

    assert times == pytest.approx([0.0, 0.25, 0.5])
    assert clock.sleeps == pytest.approx([0.25, 0.125, 0.25, 0.125])


def test_rate_limiter_reanchors_after_a_stall_instead_of_bursting() -> None:
    clock = FakeClock()
    limiter = RateLimiter(10.0, clock=clock, sleep=clock.sleep, max_burst_s=1.0)
    send_times(limiter, clock, 3)  # due at 0.0, 0.1, 0.2
    clock.now += 10.0  # e.g. the broker was unreachable

    times = send_times(limiter, clock, 3)

    # Re-anchored at the stall's end: paced again, not 100 records at once.
    assert times == pytest.approx([10.2, 10.3, 10.4])


def test_rate_limiter_allows_catching_up_a_short_lag() -> None:
    clock = FakeClock()
    limiter = RateLimiter(10.0, clock=clock, sleep=clock.sleep, max_burst_s=1.0)
    send_times(limiter, clock, 1)
    clock.now += 0.35  # behind by 0.25 s: records due at 0.1, 0.2, 0.3 go at once

    times = send_times(limiter, clock, 4)

    assert times == pytest.approx([0.35, 0.35, 0.35, 0.4])


@pytest.mark.parametrize("rate", [0.0, -1.0, float("inf"), float("nan")])
def test_rate_limiter_rejects_nonsense_rates(rate: float) -> None:
    with pytest.raises(ValueError, match="positive finite"):
        RateLimiter(rate)


# --- after a failed send ----------------------------------------------------------------------------------


def test_the_resume_line_is_the_first_line_not_acknowledged_and_later_deliveries_are_counted() -> None:
    tally = DeliveryTally()
    for line in (2, 3, 5, 6, 8):
        tally.outstanding.add(line)
    tally.on_delivery(2, None, None)  # type: ignore[arg-type]
    tally.on_delivery(6, None, None)  # type: ignore[arg-type]  (another partition: acknowledged out of order)
    tally.on_delivery(5, FakeError("Broker: Message size too large"), None)  # type: ignore[arg-type]
    tally.on_delivery(3, None, None)  # type: ignore[arg-type]

    assert tally.resume_line() == 5
    assert (tally.acknowledged, tally.failed, tally.first_error) == (3, 1, "Broker: Message size too large")
    tally.on_delivery(8, None, None)  # type: ignore[arg-type]
    assert tally.resume_line() == 5  # line 8 was never in doubt; line 5 failed


def test_a_failed_send_says_what_went_and_where_to_resume() -> None:
    report = ProduceReport(
        sent=50, acknowledged=22, failed=28, seconds=1.0, first_error="Local: Message timed out",
        resume_line=24, delivered_after_resume=1,
    )  # fmt: skip

    said = summary("reviews.csv", "reviews", 50, 0, report, None)

    assert said.startswith("reviews.csv → reviews: read 50, sent 22, skipped 0, failed 28 in 1.0 s")
    assert "not sent: Local: Message timed out" in said
    assert "every row before line 24 is on the topic; to send the rest, run again with --from-line 24" in said
    assert "(1 rows after line 24 did arrive and would be sent twice)" in said


class FakeError:
    def __init__(self, text: str) -> None:
        self.text = text

    def str(self) -> str:
        return self.text
