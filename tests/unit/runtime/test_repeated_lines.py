"""librdkafka's repeated lines (a broker that cannot be reached: the same line many times a second) reach the
log once per interval, the next one saying how many were held back."""

from __future__ import annotations

import logging

from worker.runtime.logs import NormalRetries, RepeatedLines, configure_logging


def _record(message: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("librdkafka", level, __file__, 1, message, None, None)


def test_lines_alike_but_for_numbers_pass_once_per_interval_and_then_say_how_many_were_held() -> None:
    now = [0.0]
    lines = RepeatedLines(interval_s=10.0, clock=lambda: now[0])
    passed = []
    for i in range(193):  # as seen: 193 "Connect failed" lines in 10 s
        now[0] = i * 0.05
        record = _record(
            f"FAIL [thrd:127.0.0.1:1/bootstrap]: Connect to ipv4#127.0.0.1:1 failed (after {i}ms)"
        )
        if lines.filter(record):
            passed.append(record.getMessage())
    assert len(passed) == 1
    now[0] = 10.0
    record = _record("FAIL [thrd:127.0.0.1:1/bootstrap]: Connect to ipv4#127.0.0.1:1 failed (after 7ms)")
    assert lines.filter(record)
    assert record.getMessage().endswith("(and 192 alike in the last 10 s)")


def test_different_lines_and_levels_pass_each_their_own_way() -> None:
    lines = RepeatedLines(interval_s=10.0, clock=lambda: 0.0)
    assert lines.filter(_record("Connect failed"))
    assert lines.filter(_record("Connect failed", logging.ERROR))
    assert lines.filter(_record("Metadata request timed out"))
    assert not lines.filter(_record("Connect failed"))


_PID_RETRY = (
    "GETPID [thrd:main]: Failed to acquire idempotence PID from broker localhost:9092/1: "
    "Broker: Coordinator load in progress: retrying"
)


def test_a_fresh_brokers_pid_retry_is_dropped_below_debug_and_marked_debug_at_debug() -> None:
    logger = logging.getLogger("librdkafka")
    before = logger.level
    try:
        logger.setLevel(logging.INFO)
        assert not NormalRetries().filter(_record(_PID_RETRY))
        logger.setLevel(logging.DEBUG)
        record = _record(_PID_RETRY)
        assert NormalRetries().filter(record)
        assert (record.levelno, record.levelname) == (logging.DEBUG, "DEBUG")
    finally:
        logger.setLevel(before)


def test_a_failure_that_is_no_normal_retry_keeps_its_level() -> None:
    record = _record("GETPID [thrd:main]: Failed to acquire idempotence PID: Broker: Not authorized", 40)
    assert NormalRetries().filter(record)
    assert record.levelno == logging.ERROR


def test_configure_logging_installs_the_retry_filter_on_librdkafka_lines() -> None:
    configure_logging("INFO")
    assert any(isinstance(f, NormalRetries) for f in logging.getLogger("librdkafka").filters)


def test_the_registry_clients_request_lines_stay_out_of_an_info_log() -> None:
    configure_logging("INFO")
    assert not logging.getLogger("httpx2").isEnabledFor(logging.INFO)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
