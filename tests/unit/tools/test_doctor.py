"""doctor's broker check: librdkafka's retry lines become the verdict's cause instead of stderr noise, and
the fix follows the cause (no broker, refused login, TLS)."""

from __future__ import annotations

import logging

import pytest

from worker.bench.worker_process import free_port
from worker.config import WorkerSettings
from worker.tools.broker_probe import BROKER_FIX, CREDENTIALS_FIX, TLS_FIX, broker_fix, check_broker
from worker.tools.checks import Check


def test_an_unreachable_broker_fails_with_librdkafkas_reason_and_prints_nothing(
    capfd: pytest.CaptureFixture[str],
) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"

    s = WorkerSettings(bootstrap_servers=bootstrap).sections
    check = check_broker(s.kafka, s.security)

    assert (check.name, check.verdict, check.fix) == ("broker", "FAIL", BROKER_FIX)
    assert check.detail.startswith(f"{bootstrap} did not answer within 10 s (")
    assert "Connection refused" in check.detail
    assert "[thrd:" not in check.detail  # librdkafka's prefix is cut
    assert "make kafka-up" in check.line() and "SENTIMENT_BOOTSTRAP_SERVERS" in check.line()
    out, err = capfd.readouterr()
    assert "%3|" not in err and out == ""


@pytest.mark.parametrize(
    ("message", "fix"),
    [
        ("127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused", BROKER_FIX),
        ("sasl.example:9093/bootstrap: SASL authentication error: Authentication failed", CREDENTIALS_FIX),
        ("tls.example:9093/bootstrap: SSL handshake failed: error:0A00010B:SSL routines", TLS_FIX),
    ],
)
def test_the_fix_follows_what_librdkafka_reported(message: str, fix: str) -> None:
    assert broker_fix([(logging.ERROR, message)]) == fix


def test_a_check_line_names_its_fix_after_what_was_found() -> None:
    assert (
        Check("topic reviews", "FAIL", "missing", "run `x`").line()
        == "[FAIL] topic reviews: missing; fix: run `x`"
    )
    assert Check("python", "OK", "3.11").line() == "[OK  ] python: 3.11"
