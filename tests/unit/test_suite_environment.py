"""The suite never reads the developer's SENTIMENT_* variables (tests/conftest.py removes them before any
test module is imported), in this process and in the subprocesses tests start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import KEPT_ENVIRONMENT

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = {
    "SENTIMENT_DLQ_SIZE_CHECK": "false",
    "SENTIMENT_MAX_TEXT_CHARS": "1",
    "sentiment_api_token": "hostile-token",  # pydantic-settings matches names in any case
    "SENTIMENT_HTTP_MAX_TEXTS": "1",
    "SENTIMENT_KAFKA_EXTRA": '{"socket.timeout.ms": 10}',
    "SENTIMENT_CONFIG_FILE": "/nonexistent/worker.json",
}
"""Values that made tests fail when the suite read them (the first two of issue 50; the rest alike)."""
AFFECTED = [
    "tests/unit/kafka/test_app.py::"
    "test_topics_at_the_broker_defaults_start_with_a_warning_naming_the_stand_in_and_the_fix",
    "tests/unit/http/test_openapi.py",
    "tests/unit/http/test_validation.py",
]


def test_neither_this_process_nor_a_child_sees_a_sentiment_setting() -> None:
    left = [name for name in os.environ if name.upper().startswith("SENTIMENT_")]
    assert set(left) <= KEPT_ENVIRONMENT
    code = "import os; print([n for n in os.environ if n.upper().startswith('SENTIMENT_')])"
    child = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert set(eval(child.stdout)) <= KEPT_ENVIRONMENT  # noqa: S307 - our own child's repr of a list


def test_tests_that_read_settings_pass_with_hostile_sentiment_variables_set() -> None:
    env = {**os.environ, **HOSTILE, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *AFFECTED],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
