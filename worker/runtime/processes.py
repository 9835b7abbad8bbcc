"""`sentiment-worker run --processes N`: N worker processes on one host, each its own consumer-group member.

The parent loads no model: it starts N children (`run` again, with the same flags and environment, and
`--process-index i`), tags each line they write with `[process i]`, forwards SIGTERM/SIGINT to them, and
exits 0 when all of them stopped cleanly. When one fails, it stops the others and exits non-zero saying
which one failed and why.

What each child changes in its settings (`process_settings`, one rule for all of them):
- the GPU memory budget is split N ways: vram_budget_mb / N, or vram_budget_fraction / N, or 1/N of the
  device when neither is set (what `max_batch_tokens=auto` calibrates against);
- cpu_threads, when not set: the cores / N (at least 1), so that N processes do not oversubscribe the CPU;
- http_port: process i serves /metrics /healthz /readyz (and the API) on http_port + i (0 stays off);
- worker_id: `<worker_id>-<i>` (its Kafka client id, transactional id and dead-letter header).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from worker.config import WorkerSettings
from worker.errors import ConfigurationError

log = logging.getLogger(__name__)

__all__ = [
    "ProcessFailure",
    "Supervisor",
    "combine_summaries",
    "die_with_parent",
    "plan_lines",
    "process_settings",
    "supervise",
]

_POLL_S = 0.1
_KILL_MARGIN_S = 60.0  # past shutdown_timeout_s: a child still loading its model may take this long to stop
_TAIL_LINES = 20
_ERROR_PREFIX = "sentiment-worker run: error: "  # how `run` says why it failed (worker.cli.main)


def process_settings(settings: WorkerSettings, index: int, count: int, cpu_count: int) -> WorkerSettings:
    """Process `index` of `count`'s settings: the VRAM budget and (unset) cpu_threads split `count` ways,
    http_port + index, worker_id suffixed with `-index`. `count` 1 changes nothing."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"process {index} of {count}: the index must be in [0, {count})")
    if count == 1:
        return settings
    last_port = settings.http_port + count - 1
    if settings.http_port and last_port > 65535:
        raise ConfigurationError(
            f"--processes {count} needs ports {settings.http_port}-{last_port} (http_port + process index): "
            "lower http_port or the number of processes"
        )
    update: dict[str, Any] = {"worker_id": f"{settings.worker_id}-{index}"}
    if settings.vram_budget_mb is not None:
        update["vram_budget_mb"] = max(1, settings.vram_budget_mb // count)
    else:
        update["vram_budget_fraction"] = (settings.vram_budget_fraction or 1.0) / count
    if settings.cpu_threads is None:
        update["cpu_threads"] = max(1, cpu_count // count)
    if settings.http_port:
        update["http_port"] = settings.http_port + index
    return settings.model_copy(update=update)


def plan_lines(settings: WorkerSettings, count: int, cpu_count: int) -> list[str]:
    """What the parent logs at start: each process's worker id, ports and share of the GPU and the CPU."""
    lines = []
    for index in range(count):
        own = process_settings(settings, index, count, cpu_count)
        vram = (
            f"vram_budget_mb={own.vram_budget_mb}"
            if own.vram_budget_mb is not None
            else f"vram_budget_fraction={own.vram_budget_fraction:.4g}"
        )
        port = f"http port {own.http_port}" if own.http_port else "no http port"
        share = f"{vram} (on GPU), cpu_threads={own.cpu_threads}"
        lines.append(f"process {index}: worker_id {own.worker_id}, {port}, {share}")
    return lines


def die_with_parent(parent_pid: int) -> None:
    """A child's first step: SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG), so that a parent
    killed with SIGKILL leaves no worker behind; exits at once if the parent is gone already."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent_pid:
        raise ConfigurationError(f"the parent process {parent_pid} is gone: not starting")


@dataclass(frozen=True)
class ProcessFailure:
    """Which child failed and why: its exit code (a negative one: the signal that killed it) and last line."""

    index: int
    pid: int
    returncode: int
    last_line: str

    def describe(self) -> str:
        how = (
            f"killed by {signal.Signals(-self.returncode).name}"
            if self.returncode < 0
            else f"exit code {self.returncode}"
        )
        line = self.last_line.removeprefix(_ERROR_PREFIX)  # said once, by the parent
        said = f": {line}" if line else ""
        return f"process {self.index} (pid {self.pid}) failed, {how}{said}"


@dataclass
class _Child:
    index: int
    proc: subprocess.Popen[str]
    relays: list[threading.Thread] = field(default_factory=list)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))
    summary: dict[str, Any] | None = None


class Supervisor:
    """Starts `count` children from `command(index)`, relays their lines tagged `[process i]`, forwards each
    signal given to `forward` to all of them, and waits: `run()` returns the failure, if any."""

    def __init__(
        self,
        command: Callable[[int], Sequence[str]],
        count: int,
        *,
        kill_after_s: float,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
    ) -> None:
        self._command = command
        self._count = count
        self._kill_after_s = kill_after_s + _KILL_MARGIN_S
        self._stdout = stdout or sys.stdout
        self._stderr = stderr or sys.stderr
        self._write_lock = threading.Lock()
        self._signals: deque[int] = deque()  # appended by the signal handler, forwarded by the loop
        self._children: list[_Child] = []
        self._sent: set[int] = set()  # the signals sent to the children
        self.failure: ProcessFailure | None = None

    def forward(self, signum: int) -> None:
        """Safe from a signal handler: only queues `signum` for the loop to forward."""
        self._signals.append(signum)

    @property
    def summaries(self) -> list[dict[str, Any]]:
        """Each child's summary line (the JSON `run` prints), tagged with its index and exit code."""
        return [
            {"process": c.index, "exit_code": c.proc.returncode, **(c.summary or {})} for c in self._children
        ]

    def run(self) -> ProcessFailure | None:
        """Starts the children and waits for all of them: None when every one exited 0, else the first one
        that failed (the others were stopped when it did)."""
        for index in range(self._count):
            self._start(index)
        stopping_since: float | None = None
        while any(c.proc.poll() is None for c in self._children):
            while self._signals:
                signum = self._signals.popleft()
                stopping_since = stopping_since or time.monotonic()
                self._signal_all(signum)
            if self.failure is None and (failed := self._first_failure()) is not None:
                self.failure = failed
                log.error("%s; stopping the other processes", failed.describe())
                stopping_since = stopping_since or time.monotonic()
                self._signal_all(signal.SIGTERM)
            if stopping_since is not None and time.monotonic() - stopping_since > self._kill_after_s:
                self._kill_the_rest()
            time.sleep(_POLL_S)
        for child in self._children:
            for relay in child.relays:
                relay.join()
        return self.failure or self._first_failure()

    def _start(self, index: int) -> None:
        # A session of its own: a terminal's Ctrl-C reaches the parent only, which forwards it once.
        proc = subprocess.Popen(
            list(self._command(index)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        )
        child = _Child(index, proc)
        self._children.append(child)
        log.info("process %d started (pid %d)", index, proc.pid)
        assert proc.stdout is not None and proc.stderr is not None
        for stream, sink, is_stdout in (
            (proc.stdout, self._stdout, True),
            (proc.stderr, self._stderr, False),
        ):
            relay = threading.Thread(
                target=self._relay, args=(child, stream, sink, is_stdout), name=f"relay-{index}", daemon=True
            )
            relay.start()
            child.relays.append(relay)

    def _relay(self, child: _Child, stream: IO[str], sink: IO[str], is_stdout: bool) -> None:
        for line in stream:
            text = line.rstrip("\n")
            if is_stdout and (summary := _summary_of(text)) is not None:
                child.summary = summary  # the parent prints all of them in one line at the end
                continue
            if text.strip():
                child.tail.append(text)
            with self._write_lock:
                sink.write(f"[process {child.index}] {text}\n")
                sink.flush()

    def _kill_the_rest(self) -> None:
        for child in self._children:
            if child.proc.poll() is None:
                log.error(
                    "process %d did not stop within %.0f s: killing it", child.index, self._kill_after_s
                )
                child.proc.kill()

    def _signal_all(self, signum: int) -> None:
        self._sent.add(signum)
        for child in self._children:
            if child.proc.poll() is None:
                child.proc.send_signal(signum)

    def _first_failure(self) -> ProcessFailure | None:
        for child in self._children:
            code = child.proc.poll()
            # Ended by a signal it was sent before it could catch it (still starting): nothing to finish.
            stopped = code is not None and code < 0 and -code in self._sent
            if code is not None and code != 0 and not stopped:
                return ProcessFailure(child.index, child.proc.pid, code, child.tail[-1] if child.tail else "")
        return None


def _summary_of(line: str) -> dict[str, Any] | None:
    """The summary `run` prints last on stdout (a JSON object with "stopped"), else None."""
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) and "stopped" in value else None


_SUMMED = (
    "consumed",
    "results",
    "dead_letters",
    "handed_back",
    "unacknowledged_at_stop",
    "messages_per_second",
)


def combine_summaries(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The parent's summary: the children's counts and rates added up, the longest run, and each child's own
    line under "processes" (conservation holds for the sum: consumed = results + dead letters + handed back
    + unacknowledged)."""
    reasons = sorted({str(s.get("stopped", "no summary")) for s in summaries})
    combined: dict[str, Any] = {"stopped": reasons[0] if len(reasons) == 1 else "; ".join(reasons)}
    for key in _SUMMED:
        combined[key] = round(sum(float(s.get(key, 0)) for s in summaries), 1)
        if key != "messages_per_second":
            combined[key] = int(combined[key])
    by_kind: dict[str, int] = {}
    for s in summaries:
        for kind, n in (s.get("dead_letters_by_kind") or {}).items():
            by_kind[kind] = by_kind.get(kind, 0) + int(n)
    combined["dead_letters_by_kind"] = by_kind
    combined["seconds"] = max((float(s.get("seconds", 0)) for s in summaries), default=0.0)
    combined["processes"] = list(summaries)
    return combined


def supervise(
    settings: WorkerSettings, count: int, command: Callable[[int], Sequence[str]]
) -> tuple[dict[str, Any], ProcessFailure | None]:
    """`run --processes N` in the parent: logs each process's plan, starts `count` children from
    `command(index)`, forwards SIGTERM/SIGINT to them and waits. Returns their summaries added up, and the
    first failure (the others were stopped when it happened), if any."""
    log.info("%d worker processes, each its own member of group %s:", count, settings.group_id)
    for line in plan_lines(settings, count, os.cpu_count() or 1):
        log.info("  %s", line)
    supervisor = Supervisor(command, count, kill_after_s=settings.shutdown_timeout_s)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: supervisor.forward(received))
    failure = supervisor.run()
    return combine_summaries(supervisor.summaries), failure
