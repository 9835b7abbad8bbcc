"""`predict`'s path: chunks labelled on the inference thread while the next is tokenized, rows in input
order with their ids; CSV and JSONL read by column; the progress bar; reading a file with its byte count."""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from worker.files.predict import ProgressBar, predict_lines, predict_rows
from worker.files.review_files import ReviewFile
from worker.labelling.labeller import Labeller


class ThreadNotingModel:
    labels = ["negative", "positive"]
    call_overhead_tokens = None  # fewest batches
    parallel_calls = 1  # one call at a time

    def __init__(self) -> None:
        self.tokenized_on: set[str] = set()
        self.predicted_on: set[str] = set()

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        self.tokenized_on.add(threading.current_thread().name)
        return [[1] * min(len(t), 50) for t in texts]

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        self.predicted_on.add(threading.current_thread().name)
        return np.array([[1 - len(s) / 100, len(s) / 100] for s in batch], dtype=np.float32)


def test_rows_come_in_input_order_across_chunks_labelled_off_the_reading_thread() -> None:
    model = ThreadNotingModel()
    lines = [("好" * (1 + i % 40)) if i % 97 else "   " for i in range(1300)]  # 3 chunks, some blank
    done: list[int] = []
    rows = list(predict_lines(Labeller.of(model), (line + "\n" for line in lines), on_chunk=done.append))
    assert [r["line"] for r in rows] == list(range(1, 1301))
    assert done == [512, 512, 276]
    for line, row in zip(lines, rows, strict=True):
        if line.strip():
            assert row["text"] == line
            assert row["probabilities"]["positive"] == round(min(len(line), 50) / 100, 6)
        else:
            assert row["error"] == "empty_text"
    assert {name.split("_")[0] for name in model.predicted_on} == {"engine-lane"}  # the engine's lanes
    assert model.tokenized_on == {"engine-queue"}  # the engine's queue thread, not the reading one


def test_stopping_early_stops_the_engine_s_threads() -> None:
    before = {t.name for t in threading.enumerate()}
    rows = predict_lines(Labeller.of(ThreadNotingModel()), (f"第{i}条\n" for i in range(5000)))
    assert next(rows)["line"] == 1
    rows.close()
    assert not {
        name for name in {t.name for t in threading.enumerate()} - before if name.startswith("predict")
    }


def test_progress_bar_draws_share_lines_and_rate() -> None:
    now = [0.0]
    out = io.StringIO()
    bar = ProgressBar(1000, out, width=10, every_s=0.2, clock=lambda: now[0])
    now[0] = 1.0
    bar.update(450, 512)
    bar.update(460, 10)  # within every_s: not redrawn
    now[0] = 2.0
    bar.finish(1000)
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n")
    assert "\r[####------]  45%  512 lines  512 lines/s" in text
    assert "\r[##########] 100%  522 lines  261 lines/s" in text


def test_a_file_counts_what_was_read(tmp_path: Path) -> None:
    path = tmp_path / "reviews.txt"
    path.write_bytes("好吃\r\n".encode() + b"\xff bad\n" + b"last")
    source = ReviewFile(path)
    assert source.bytes_read == 0
    rows = list(source)
    assert [(row.line, getattr(row, "text", None)) for row in rows] == [(1, "好吃"), (2, None), (3, "last")]
    assert source.bytes_read == source.total_bytes == path.stat().st_size


def test_bad_lines_are_reported_as_lines_of_a_text_file_not_as_json() -> None:
    lines = ["好评", "", "   ", "差" * 12, "ab\udcffc", "\u200b\u200d", "最后一条"]  # \udcff: the byte 0xff
    rows = list(
        predict_lines(Labeller.of(ThreadNotingModel()), (line + "\n" for line in lines), max_text_chars=10)
    )
    assert [(r["id"], r["line"]) for r in rows] == [(str(n), n) for n in range(1, 8)]
    assert [r["text"] for r in rows if "error" not in r] == ["好评", "最后一条"]
    errors = {r["line"]: (r["error"], r["reason"]) for r in rows if "error" in r}
    assert errors == {
        2: ("empty_text", "the line is empty"),
        3: ("empty_text", "the line holds only whitespace"),
        4: (
            "text_too_long",
            "text is 12 characters, more than the limit of 10: "
            "split it into several reviews (or raise SENTIMENT_MAX_TEXT_CHARS)",
        ),
        5: (
            "invalid_utf8",
            "byte 3 (0xff) is not valid UTF-8: give the file's encoding with --encoding (e.g. gb18030), "
            "or save it as UTF-8 (e.g. `iconv -t UTF-8`)",
        ),
        6: (
            "empty_text",
            "text is empty or has no visible character (only whitespace, control or format characters "
            "such as zero-width spaces)",
        ),
    }


def test_a_csv_is_labelled_by_its_text_column_with_the_ids_of_its_id_column(tmp_path: Path) -> None:
    path = tmp_path / "reviews.csv"
    path.write_text("review_id,content,shop\nR1,好吃,川味\n\nR3,,面馆\n,一般,面馆\n", encoding="utf-8")

    source = ReviewFile(path, text_field="content", id_field="review_id")
    rows = list(predict_rows(Labeller.of(ThreadNotingModel()), source))

    assert [(r["id"], r["line"], r.get("text"), r.get("error")) for r in rows] == [
        ("R1", 2, "好吃", None),  # the header is not labelled, nor the id or shop cells
        ("3", 3, None, "empty_text"),
        ("R3", 4, None, "empty_text"),
        ("5", 5, "一般", None),  # no id: its line
    ]
    assert rows[0]["label"] in ("negative", "positive")


def test_a_jsonl_file_is_labelled_by_its_text_field_not_as_raw_json(tmp_path: Path) -> None:
    path = tmp_path / "reviews.jsonl"
    lines = ['{"id": 7, "text": "好吃"}', '{"text": "一般", "shop": "s"}', '{"body": "x", "id": "b"}']
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    rows = list(predict_rows(Labeller.of(ThreadNotingModel()), ReviewFile(path)))

    assert [(r["id"], r.get("text"), r.get("error")) for r in rows] == [
        ("7", "好吃", None),
        ("2", "一般", None),
        ("b", None, "missing_text"),  # a bad row keeps its id
    ]
