"""C++ libraries' own lines (`[Paddle2ONNX] ...`, Paddle's PIR notices) go to the log at DEBUG, not to the
command's output; when the block fails they are logged at WARNING (they may say why)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from worker.model.native_output import native_output_to_log


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.levelno, record.getMessage()))


@pytest.fixture
def log() -> Iterator[tuple[logging.Logger, _Records]]:
    """A logger of the test's own that does not propagate: handlers other tests left on the root logger
    (a stream since closed) never see its records."""
    logger = logging.getLogger("test.native")
    records = _Records()
    logger.addHandler(records)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, records
    finally:
        logger.removeHandler(records)
        logger.propagate = True


def test_fd_level_lines_go_to_the_log_at_debug(
    capfd: pytest.CaptureFixture[str], log: tuple[logging.Logger, _Records]
) -> None:
    logger, records = log
    with native_output_to_log(logger, "paddle2onnx"):
        os.write(1, b"[Paddle2ONNX] Start parsing the Paddle model file...\n")
        os.write(2, b"W1206 pir.cc:12] PIR notice\n")
    print("after")
    out, err = capfd.readouterr()
    assert out == "after\n" and err == ""
    assert records.seen == [
        (logging.DEBUG, "paddle2onnx: [Paddle2ONNX] Start parsing the Paddle model file..."),
        (logging.DEBUG, "paddle2onnx: W1206 pir.cc:12] PIR notice"),
    ]


def test_a_failing_block_logs_its_lines_at_warning(log: tuple[logging.Logger, _Records]) -> None:
    logger, records = log
    with pytest.raises(RuntimeError), native_output_to_log(logger, "paddle2onnx"):
        os.write(2, b"[Paddle2ONNX] unsupported op\n")
        raise RuntimeError("failed")
    assert records.seen == [(logging.WARNING, "paddle2onnx: [Paddle2ONNX] unsupported op")]
