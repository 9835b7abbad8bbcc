"""C++ libraries' own lines (`[Paddle2ONNX] ...`, Paddle's PIR notices) go to the log at DEBUG, not to the
command's output; when the block fails they are logged at WARNING (they may say why)."""

from __future__ import annotations

import logging
import os

import pytest

from worker.model.native_output import native_output_to_log

LOG = logging.getLogger("test.native")


def test_fd_level_lines_go_to_the_log_at_debug(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="test.native"):
        with native_output_to_log(LOG, "paddle2onnx"):
            os.write(1, b"[Paddle2ONNX] Start parsing the Paddle model file...\n")
            os.write(2, b"W1206 pir.cc:12] PIR notice\n")
        print("after")
    out, err = capfd.readouterr()
    assert out == "after\n" and err == ""
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "paddle2onnx: [Paddle2ONNX] Start parsing the Paddle model file..."),
        (logging.DEBUG, "paddle2onnx: W1206 pir.cc:12] PIR notice"),
    ]


def test_a_failing_block_logs_its_lines_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    with (
        caplog.at_level(logging.DEBUG, logger="test.native"),
        pytest.raises(RuntimeError),
        native_output_to_log(LOG, "paddle2onnx"),
    ):
        os.write(2, b"[Paddle2ONNX] unsupported op\n")
        raise RuntimeError("failed")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "paddle2onnx: [Paddle2ONNX] unsupported op")
    ]
