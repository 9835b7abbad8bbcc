"""The servers and workers a bench starts measure the same inference as its model-only phase."""

from __future__ import annotations

import os

import pytest

from worker.bench.http_bench import server_env
from worker.config import WorkerSettings


def test_the_http_bench_server_gets_the_model_only_phase_inference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENTIMENT_API_TOKEN", "from-the-shell")  # not the bench's setting: not passed on
    settings = WorkerSettings(
        model="models/x",
        backend="static",
        use_bf16=True,
        cpu_threads=1,
        cpu_threads_per_call=2,
        long_text="chunk",
        tokenizer="slow",
    )
    s = settings.sections
    env = server_env(s.model, s.batching, max_batch_tokens=2048, max_wait_ms=3)
    assert "SENTIMENT_API_TOKEN" not in env
    assert {k: v for k, v in env.items() if not k.startswith("SENTIMENT_")} == {
        k: v for k, v in os.environ.items() if not k.startswith("SENTIMENT_")
    }
    monkeypatch.delenv("SENTIMENT_API_TOKEN")
    for key, value in env.items():
        if key.startswith("SENTIMENT_"):
            monkeypatch.setenv(key, value)
    served = WorkerSettings()  # what the server process reads from that environment
    assert (served.model, served.backend, served.use_bf16, served.cpu_threads) == (
        "models/x",
        "static",
        True,
        1,
    )
    assert (served.long_text, served.tokenizer, served.cpu_threads_per_call) == ("chunk", "slow", 2)
    assert (served.max_batch_tokens, served.http_max_wait_ms) == (2048, 3)
