"""`sentiment-worker run` as a subprocess: what the bench drives and what the fault tests start, kill and
restart. stdout and stderr go to files (a full pipe would block the worker). `start_worker` starts one with
the bench's settings; `served_inference` and `child_env` are what every measured subprocess shares with the
measuring process; `rss_summary` sums up its memory while it drains, `thread_cpu` reads each of its threads'
CPU time."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from worker.config import ModelSettings, WorkerSettings
from worker.errors import OperationError

REFUSAL_PREFIX = "sentiment-worker run: error:"


class WorkerProcessError(OperationError):
    """The worker subprocess did not do what was expected of it; the message carries its stderr tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_bytes(pid: int) -> int | None:
    """Resident set size of `pid` (Linux /proc), None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, all threads) `pid` has used so far (Linux /proc), None when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """{thread id: (kernel name, CPU seconds so far)} of every live thread of `pid` (Linux /proc): the
    nanoseconds of /proc/<pid>/task/<tid>/schedstat, else user + system ticks of its stat. Empty when `pid`
    is gone; a thread that ends while being read is left out."""
    threads: dict[int, tuple[str, float]] = {}
    try:
        tids = [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return threads
    for tid in tids:
        task = Path(f"/proc/{pid}/task/{tid}")
        try:
            name = (task / "comm").read_text(errors="replace").strip()
            try:
                seconds = int((task / "schedstat").read_text().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            continue
        threads[tid] = (name, seconds)
    return threads


def scrape_metrics(port: int) -> dict[str, float]:
    """The worker's /metrics as {name+labels: value} (samples only; empty when it doesn't answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {
        sample.name + json.dumps(sample.labels, sort_keys=True): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric_sum(scrape: dict[str, float], name: str) -> float | None:
    """The sum of every labelled sample of `name` in a `scrape_metrics` result, None when absent."""
    values = [v for key, v in scrape.items() if key.split("{", 1)[0] == name]
    return sum(values) if values else None


class WorkerProcess:
    """One `python -m worker run` process with `env` as its whole environment and `args` after `run`.

    Its worker id (client.id, transactional id) is `name` unless `env` sets SENTIMENT_WORKER_ID. `program`
    replaces `python -m worker` (the fault tests run the CLI with a wrapped model).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        log_dir: Path,
        name: str,
        *args: str,
        http_port: int | None = None,
        cwd: Path | None = None,
        program: Sequence[str] = (sys.executable, "-m", "worker"),
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.http_port = http_port
        self.stdout_path = log_dir / f"{name}.out"
        self.stderr_path = log_dir / f"{name}.err"
        port_args = ["--http-port", str(http_port)] if http_port is not None else []
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [*program, "run", *args, *port_args],
                cwd=cwd,
                env={"SENTIMENT_WORKER_ID": name, **env},
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self) -> None:
        """SIGTERM: a clean stop (finish fetched windows, flush, commit, exit 0)."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        """Its exit code; killed and WorkerProcessError when it runs past `timeout_s`."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise WorkerProcessError(
                f"{self.name} did not exit within {timeout_s:.0f} s:\n{self.stderr_tail()}"
            ) from None

    def wait_ready(self, timeout_s: float) -> None:
        """Until /readyz answers 200 (needs `http_port`); WorkerProcessError if it exits or times out."""
        if self.http_port is None:
            raise ValueError("wait_ready needs the worker started with http_port")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise WorkerProcessError(f"{self.name} exited early:\n{self.stderr_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/readyz", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise WorkerProcessError(f"{self.name} was not ready within {timeout_s:.0f} s")

    def metrics(self) -> dict[str, float]:
        """Its /metrics samples (`scrape_metrics`); empty without `http_port` or when it doesn't answer."""
        return scrape_metrics(self.http_port) if self.http_port is not None else {}

    def stop(self) -> None:
        """Kill it if it still runs (teardown)."""
        if self.alive():
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stderr_tail(self, chars: int = 3000) -> str:
        return self.stderr()[-chars:]

    def summary(self) -> dict[str, Any]:
        """The JSON summary `run` prints as its last stdout line on a clean stop."""
        lines = [line for line in self.stdout().splitlines() if line.startswith("{")]
        if not lines:
            raise WorkerProcessError(f"{self.name} printed no summary; stderr:\n{self.stderr_tail()}")
        return dict(json.loads(lines[-1]))

    def finish(self, timeout_s: float) -> dict[str, Any]:
        """Waits for a run that ends by itself (--max-messages / --idle-exit-s): exit 0, its summary."""
        code = self.wait(timeout_s)
        if code != 0:
            raise WorkerProcessError(f"{self.name} exited with {code}:\n{self.stderr_tail()}")
        return self.summary()

    def refusal_line(self, timeout_s: float = 120.0) -> str:
        """Waits for a worker expected to refuse to start: exit 2, no traceback. Returns its last
        ``sentiment-worker run: error:`` line (what the user is told to change)."""
        try:
            code = self.wait(timeout_s)
        finally:
            self.stop()
        err = self.stderr()
        lines = [line for line in err.splitlines() if line.startswith(REFUSAL_PREFIX)]
        if code != 2 or "Traceback" in err or not lines:
            raise WorkerProcessError(
                f"{self.name}: expected a clean refusal (exit 2), got exit {code}:\n{err[-3000:]}"
            )
        return lines[-1]


def rss_summary(samples: list[dict[str, float]], total: int) -> dict[str, Any]:
    """RSS while the backlog drains: growth = max/min − 1 over samples past 10 % of the messages."""
    draining = [s for s in samples if s["done"] >= 0.10 * total]
    if len(draining) < 2:
        draining = samples[len(samples) // 2 :]
    values = [s["rss_bytes"] for s in draining]
    return {
        "samples": len(samples),
        "samples_while_draining": len(values),
        "peak_bytes": max((s["rss_bytes"] for s in samples), default=None),
        "draining_min_bytes": min(values, default=None),
        "draining_max_bytes": max(values, default=None),
        "growth": (max(values) / min(values) - 1.0) if values else None,
        "series": [[round(s["t"], 2), int(s["rss_bytes"]), int(s["done"])] for s in samples],
    }


def served_inference(model: ModelSettings) -> dict[str, Any]:
    """The settings a measured subprocess (worker or server) must share with the model-only phase for the
    two to measure the same inference: backend (and whether the identity one may serve), precision,
    tokenizer, long-text rule, math threads."""
    return {
        "backend": model.backend,
        "use_bf16": model.use_bf16,
        "tokenizer": model.tokenizer,
        "long_text": model.long_text,
        "cpu_threads": model.cpu_threads,
        "cpu_threads_per_call": model.cpu_threads_per_call,
        "allow_identity_model": model.allow_identity_model,
    }


def child_env() -> dict[str, str]:
    """This process's environment minus SENTIMENT_* (which would override the child's config file)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SENTIMENT_")}


def start_worker(
    settings: WorkerSettings, topics: dict[str, str], max_messages: int | None, workdir: Path
) -> WorkerProcess:
    """`sentiment-worker run` with the bench's settings (a config file plus flags), metrics on a free port;
    it exits after `max_messages` inputs (None: when stopped, `WorkerProcess.terminate`)."""
    config = workdir / f"worker-{topics['group']}.json"
    s = settings.sections
    batching = s.batching
    shape = {
        "max_batch_size": (batching.max_batch_size, batching.max_batch_size_given),
        "max_batch_tokens": (batching.max_batch_tokens, batching.max_batch_tokens_given),
        "max_window_messages": (batching.max_window_messages, batching.max_window_messages_given),
        "max_wait_ms": (batching.max_wait_ms, batching.max_wait_ms_given),
    }
    values = {
        # Only the batch and window shape the bench was given: the others are the worker's own defaults
        # for its device (on a GPU: no count cap, windows that fill the token budget).
        **{name: value for name, (value, given) in shape.items() if given},
        "log_level": "WARNING",
        **served_inference(s.model),
    }
    config.write_text(json.dumps(values))
    args = [
        "--config", str(config),
        "--bootstrap-servers", s.kafka.bootstrap_servers, "--input-topic", topics["reviews"],
        "--output-topic", topics["results"], "--dlq-topic", topics["dlq"], "--group-id", topics["group"],
        "--model", s.model.model, "--device", s.model.device,
    ]  # fmt: skip
    if max_messages is not None:
        args += ["--max-messages", str(max_messages)]
    return WorkerProcess(child_env(), workdir, f"worker-{topics['group']}", *args, http_port=free_port())
