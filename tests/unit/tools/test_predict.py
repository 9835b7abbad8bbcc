"""`predict`'s path: chunks labelled on the inference thread while the next is tokenized, rows in input
order; the progress bar; reading a file with its byte count."""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from worker.tools.predict import FileLines, ProgressBar, predict_lines


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
    rows = list(predict_lines(model, (line + "\n" for line in lines), on_chunk=done.append))
    assert [r["line"] for r in rows] == list(range(1, 1301))
    assert done == [512, 512, 276]
    for line, row in zip(lines, rows, strict=True):
        if line.strip():
            assert row["text"] == line
            assert row["probabilities"]["positive"] == round(min(len(line), 50) / 100, 6)
        else:
            assert row["error"] == "empty_text"
    assert {name.split("_")[0] for name in model.predicted_on} == {"predict-lane"}  # the engine's lanes
    assert model.tokenized_on == {"predict-queue"}  # the engine's queue thread, not the reading one


def test_stopping_early_stops_the_engine_s_threads() -> None:
    before = {t.name for t in threading.enumerate()}
    rows = predict_lines(ThreadNotingModel(), (f"第{i}条\n" for i in range(5000)))
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


def test_file_lines_keep_undecodable_bytes_and_count_what_was_read(tmp_path: Path) -> None:
    path = tmp_path / "reviews.txt"
    path.write_bytes("好吃\r\n".encode() + b"\xff bad\n" + b"last")
    source = FileLines(path)
    assert list(source) == ["好吃\r\n", "\udcff bad\n", "last"]
    assert source.bytes_read == source.total_bytes == path.stat().st_size


def test_bad_lines_are_reported_as_lines_of_a_text_file_not_as_json() -> None:
    lines = ["好评", "", "   ", "差" * 12, "ab\udcffc", "最后一条"]  # \udcff: the undecodable byte 0xff
    rows = list(predict_lines(ThreadNotingModel(), (line + "\n" for line in lines), max_text_chars=10))
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["text"] for r in rows if "error" not in r] == ["好评", "最后一条"]
    errors = {r["line"]: (r["error"], r["reason"]) for r in rows if "error" in r}
    assert errors == {
        2: ("empty_text", "line 2 is empty: write one review per line (or remove the line)"),
        3: ("empty_text", "line 3 holds only whitespace: write one review per line (or remove the line)"),
        4: (
            "text_too_long",
            "line 4 has 12 characters, more than the limit of 10: "
            "shorten it, or split it into several reviews",
        ),
        5: (
            "invalid_utf8",
            "line 5: byte 3 (0xff) is not valid UTF-8: convert the input to UTF-8 (e.g. `iconv -t UTF-8`)",
        ),
    }
