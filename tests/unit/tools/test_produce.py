"""worker.tools.produce: review files → records (each format, errors with line numbers), the rate schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.stream.decode import DecodedReview, InputFormat, decode_review
from worker.tools.produce import FeedFileError, FeedRecord, RateLimiter, detect_format, read_reviews


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return path


def decoded(record: FeedRecord, input_format: InputFormat = "json") -> DecodedReview:
    """What the worker makes of the record: the files must produce valid reviews."""
    result = decode_review(
        record.value,
        input_format=input_format,
        max_value_bytes=100_000,
        max_text_chars=10_000,
        max_json_depth=8,
        default_id="t/0/0",
    )
    assert isinstance(result, DecodedReview), result
    return result


# --- jsonl ------------------------------------------------------------------------------------------------


def test_jsonl_lines_are_sent_byte_for_byte_with_id_keys(tmp_path: Path) -> None:
    lines = [
        '{"id": "r1", "text": "质量很好", "stars": 5}',
        "",
        '{"text": "没有编号"}',
        "   ",
        '{"id": 42, "text":"整数编号"}',
    ]
    path = write(tmp_path, "reviews.jsonl", "\n".join(lines) + "\n")

    records = list(read_reviews(path))

    assert [r.line for r in records] == [1, 3, 5]
    assert [r.value for r in records] == [lines[0].encode(), lines[2].encode(), lines[4].encode()]
    assert [r.key for r in records] == [b"r1", None, b"42"]
    assert decoded(records[0]).metadata == {"stars": 5}


def test_jsonl_bad_line_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.jsonl", '{"text": "好"}\n\n{"text": "坏"\n{"text": "never read"}\n')

    reader = read_reviews(path)
    assert next(reader).line == 1
    with pytest.raises(FeedFileError) as caught:
        next(reader)

    assert caught.value.line == 3
    assert caught.value.path == path
    assert str(caught.value).startswith(f"{path}:3: not valid JSON")


def test_jsonl_rejects_non_standard_constants(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.jsonl", '{"text": "a", "score": NaN}\n')

    with pytest.raises(FeedFileError, match=r":1: not valid JSON: NaN"):
        list(read_reviews(path))


def test_jsonl_invalid_utf8_names_line(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.jsonl", b'{"text": "ok"}\n{"text": "\xff\xfe"}\n')

    with pytest.raises(FeedFileError) as caught:
        list(read_reviews(path))

    assert caught.value.line == 2
    assert "UTF-8" in str(caught.value)


def test_jsonl_bom_and_crlf_are_not_part_of_the_value(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.jsonl", b'\xef\xbb\xbf{"id": "a", "text": "x"}\r\n{"text": "y"}\r\n')

    records = list(read_reviews(path))

    assert [r.value for r in records] == [b'{"id": "a", "text": "x"}', b'{"text": "y"}']
    assert records[0].key == b"a"


def test_pretty_printed_json_file_gets_a_hint(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.json", '[\n  {"text": "x"}\n]\n')

    with pytest.raises(FeedFileError, match="JSON Lines"):
        list(read_reviews(path))


# --- csv --------------------------------------------------------------------------------------------------


def test_csv_builds_json_with_id_key_and_metadata_columns(tmp_path: Path) -> None:
    content = "id,text,stars,shop\nr1,物流很快，包装完好,5,旗舰店\n,没有编号,1,\n"
    path = write(tmp_path, "reviews.csv", content)

    records = list(read_reviews(path))

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

    reader = read_reviews(path)
    first, second = next(reader), next(reader)
    with pytest.raises(FeedFileError) as caught:
        next(reader)

    assert (first.line, json.loads(first.value)["text"]) == (2, "第一行\n第二行")
    assert (second.line, second.key, json.loads(second.value)["text"]) == (5, b"b", "有,逗号")
    assert caught.value.line == 6
    assert "1 fields but the header has 2" in str(caught.value)


def test_csv_bom_is_not_part_of_the_first_column_name(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.csv", "\ufefftext,id\n很好,7\n")

    records = list(read_reviews(path))

    assert json.loads(records[0].value) == {"text": "很好", "id": "7"}
    assert records[0].key == b"7"


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        ("id,body\n1,x\n", 1, "must have a `text` column (found: id, body)"),
        ("", 1, "empty file"),
        ("text,text\nx,y\n", 1, "duplicate column names in the header: text"),
        ("text,id\n   ,1\n", 2, "empty `text`"),
    ],
)
def test_csv_errors_name_the_line(tmp_path: Path, content: str, line: int, message: str) -> None:
    path = write(tmp_path, "reviews.csv", content)

    with pytest.raises(FeedFileError) as caught:
        list(read_reviews(path))

    assert caught.value.line == line
    assert message in str(caught.value)


# --- txt --------------------------------------------------------------------------------------------------


def test_txt_lines_become_json_reviews(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.txt", '\ufeff手机很好用\n\n  \n"引号" 和 \\ 反斜杠\r\n')

    records = list(read_reviews(path))

    assert [r.line for r in records] == [1, 4]
    assert [r.key for r in records] == [None, None]
    assert [json.loads(r.value) for r in records] == [{"text": "手机很好用"}, {"text": '"引号" 和 \\ 反斜杠'}]
    assert decoded(records[1]).text == '"引号" 和 \\ 反斜杠'


def test_txt_raw_text_sends_the_line_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, "reviews.txt", "屏幕清晰\n\n续航一般\n")

    records = list(read_reviews(path, raw_text=True))

    assert [r.value for r in records] == ["屏幕清晰".encode(), "续航一般".encode()]
    assert decoded(records[1], input_format="text").text == "续航一般"


# --- format selection -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [("a.jsonl", "jsonl"), ("a.JSON", "jsonl"), ("a.ndjson", "jsonl"), ("a.csv", "csv"), ("a.txt", "txt")],
)
def test_auto_format_by_suffix(name: str, expected: str) -> None:
    assert detect_format(Path(name)) == expected


def test_unknown_suffix_and_missing_file_are_feed_errors(tmp_path: Path) -> None:
    with pytest.raises(FeedFileError, match="cannot tell the format"):
        read_reviews(write(tmp_path, "reviews.xml", "<x/>"))
    with pytest.raises(FeedFileError, match="cannot open"):
        list(read_reviews(tmp_path / "missing.jsonl"))


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
