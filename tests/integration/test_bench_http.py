"""A short run of `bench --http`: two real server subprocesses (`serve`, `bench --naive-server`) under the
real load generator. Asserts counts, status codes and the CPU accounting, never timings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.bench.http_bench import HttpBenchOptions, format_http_table, run_http_bench
from worker.config import WorkerSettings


def test_http_bench_answers_every_request_and_accounts_its_cpu(
    tiny_model_dir: Path, tiny_classifier: Any, tmp_path: Path
) -> None:
    settings = WorkerSettings(model=str(tiny_model_dir), device="cpu", backend="dynamic")
    options = HttpBenchOptions.quick(
        concurrencies=(1, 8), requests=120, naive_requests=40, model_only_messages=200, overload_s=2.0
    )
    report = run_http_bench(
        settings.sections.model,
        settings.sections.batching,
        tiny_classifier,
        options,
        max_batch_tokens=512,
        log_dir=tmp_path,
        say=lambda _: None,
    )
    json.dumps(report)  # written as JSON by the command

    for name, sent in (("batched", 120), ("naive", 40)):
        for concurrency in ("1", "8"):
            level = report[name]["levels"][concurrency]
            assert level["sent"] == sent and level["codes"] == {"200": sent}, (name, level)
            # Both processes did work in every level: the server labelled, the generator sent.
            assert level["server_cpu_ms_per_request"] > 0 and level["client_cpu_ms_per_request"] > 0
        assert report[name]["exit_code"] == 0
    overload = report["batched"]["overload"]
    assert overload["lost_or_failed"] == 0 and overload["hung"] == 0
    assert report["targets"]["overload_all_answered"]["met"]

    budget = report["cpu_budget"]
    level = report["batched"]["levels"]["8"]
    assert budget["server_cpu_ms_per_request"] == level["server_cpu_ms_per_request"]
    assert budget["http_cpu_ms_per_request"] == round(
        level["server_cpu_ms_per_request"] - report["model_only"]["cpu_ms_per_text"], 4
    )
    expected_ceiling = (
        budget["cores"] * 1000 / (level["server_cpu_ms_per_request"] + level["client_cpu_ms_per_request"])
    )
    assert abs(budget["ceiling_same_machine_rps"] - expected_ceiling) < 0.1
    table = format_http_table(report)
    assert "CPU per request at the top concurrency" in table and "srv CPU" in table
