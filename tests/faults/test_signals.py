"""The README's clean stop, on a real `sentiment-worker run` process: SIGINT stops like SIGTERM (label what
was fetched, flush, commit, exit 0); SIGUSR1 prints the threads' stacks; a second signal exits at once;
`SENTIMENT_SHUTDOWN_TIMEOUT_S` bounds a stop whose window the model never finishes. The model is the tiny
one, wrapped (faults/wrapped_worker.py) so that a batch holding a marked review stalls for ten minutes: no
timing is asserted, a stop that waited for the model would run into the test's deadline instead of
exiting."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.harness import REPO, produce_all, review, wait_for_log, worker_env
from tests.faults.wrapped_worker import STALL_LINE
from tests.integration.kafka_io import committed_offsets, read_topic
from tests.model_wrappers import SLOW_MARKER
from tests.polling import wait_until
from worker.bench.worker_process import WorkerProcess, free_port

pytestmark = pytest.mark.integration
STALL_S = "600"  # the marked window would take ten minutes; every wait below ends long before that
WRAPPED = (sys.executable, "-m", "tests.faults.wrapped_worker")


def _marked(i: int, prefix: str) -> tuple[bytes, bytes]:
    key, value = review(i, prefix)
    return key, value.replace(b'"text": "', f'"text": "{SLOW_MARKER}'.encode())


def _start(names: dict[str, str], model_dir: Path, log_dir: Path, name: str, **env: str) -> WorkerProcess:
    settings = worker_env(
        names["bootstrap"],
        names,
        model_dir,
        SENTIMENT_MAX_WINDOW_MESSAGES="4",
        TEST_MODEL_STALL_S=STALL_S,
        **env,
    )
    return WorkerProcess(settings, log_dir, name, http_port=free_port(), cwd=REPO, program=WRAPPED)


def _status(port: int | None) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.fixture
def names(kafka_bootstrap: str, fault_topics: Callable[..., dict[str, str]]) -> dict[str, str]:
    return {**fault_topics(1, 1), "bootstrap": kafka_bootstrap}


def test_sigint_stops_cleanly_like_sigterm(
    names: dict[str, str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    worker = _start(names, tiny_model_dir, tmp_path, "sigint")
    try:
        worker.wait_ready(300)
        produce_all(names["bootstrap"], names["reviews"], [review(i, "int") for i in range(12)])
        assert len(read_topic(names["bootstrap"], names["results"], expected=12, settle_s=0)) == 12
        worker.proc.send_signal(signal.SIGINT)
        code = worker.wait(120)
    finally:
        worker.stop()
    assert code == 0, worker.stderr_tail()
    assert "Traceback" not in worker.stderr() and "KeyboardInterrupt" not in worker.stderr()
    summary = worker.summary()
    assert summary["stopped"] == "stop requested"
    assert (summary["consumed"], summary["results"], summary["dead_letters"]) == (12, 12, 0)
    assert committed_offsets(names["bootstrap"], names["group"], names["reviews"], 1) == {0: 12}


def test_a_second_signal_exits_at_once(names: dict[str, str], tiny_model_dir: Path, tmp_path: Path) -> None:
    # A shutdown timeout longer than the stall: only the second signal can end this stop early.
    worker = _start(names, tiny_model_dir, tmp_path, "twice", SENTIMENT_SHUTDOWN_TIMEOUT_S="3600")
    try:
        worker.wait_ready(300)
        produce_all(names["bootstrap"], names["reviews"], [_marked(i, "two") for i in range(2)])
        wait_for_log(worker, STALL_LINE)
        # SIGUSR1 shows where a stuck worker is: every thread's stack, the stalled model call among them.
        worker.proc.send_signal(signal.SIGUSR1)
        wait_for_log(worker, "Current thread", timeout_s=30)
        wait_until(lambda: "in predict_ids" in worker.stderr(), 10, "the whole stack dump")
        assert worker.alive() and _status(worker.http_port) == 200, "SIGUSR1 must change nothing else"
        worker.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: _status(worker.http_port) == 503, 30, "/readyz to say stopping after SIGTERM")
        assert worker.alive(), "the first signal should stop cleanly, i.e. wait for the stalled window"
        worker.proc.send_signal(signal.SIGTERM)
        try:
            code = worker.proc.wait(timeout=60)  # the stall has ~10 minutes to go
        except subprocess.TimeoutExpired:
            pytest.fail("the second SIGTERM did not end the worker; it still waits for its window")
    finally:
        worker.stop()
    assert code == 128 + signal.SIGTERM, worker.stderr_tail()
    # Nothing of the stalled window was published or committed: the next owner labels it.
    assert read_topic(names["bootstrap"], names["results"], expected=1, timeout_s=3) == []
    assert committed_offsets(names["bootstrap"], names["group"], names["reviews"], 1)[0] < 0


def test_shutdown_timeout_bounds_a_stop_whose_window_never_finishes(
    names: dict[str, str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    worker = _start(names, tiny_model_dir, tmp_path, "bounded", SENTIMENT_SHUTDOWN_TIMEOUT_S="3")
    try:
        worker.wait_ready(300)
        produce_all(names["bootstrap"], names["reviews"], [review(i, "ok") for i in range(8)])
        assert len(read_topic(names["bootstrap"], names["results"], expected=8, settle_s=0)) == 8
        wait_until(
            lambda: committed_offsets(names["bootstrap"], names["group"], names["reviews"], 1) == {0: 8},
            30,
            "the first 8 offsets committed",
        )
        produce_all(names["bootstrap"], names["reviews"], [_marked(i, "stall") for i in range(2)])
        wait_for_log(worker, STALL_LINE)
        worker.proc.send_signal(signal.SIGTERM)
        code = worker.wait(120)  # bounded by the 3 s shutdown timeout, not by the ten-minute window
    finally:
        worker.stop()
    assert code == 0, worker.stderr_tail()
    assert "windows unlabelled after 3 s" in worker.stderr()
    summary = worker.summary()
    assert (summary["consumed"], summary["results"]) == (10, 8)
    # The unfinished window stays uncommitted, so the next owner labels it: nothing lost.
    assert committed_offsets(names["bootstrap"], names["group"], names["reviews"], 1) == {0: 8}
