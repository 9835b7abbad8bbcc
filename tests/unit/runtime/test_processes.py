"""`run --processes N`: each process's share of the settings (VRAM budget, cores, port, worker id), and the
supervisor on real child processes (small Python scripts): lines tagged, signals forwarded, a failed child
stops the others and is named."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time

import pytest

from worker.cli import run
from worker.cli.main import build_parser
from worker.config import WorkerSettings
from worker.errors import ConfigurationError
from worker.runtime.processes import Supervisor, combine_summaries, plan_lines, process_settings


def settings(**values: object) -> WorkerSettings:
    return WorkerSettings(**{"worker_id": "gpu-host", "http_port": 9108, **values})  # type: ignore[arg-type]


def test_one_process_keeps_the_settings_as_they_are() -> None:
    base = settings(vram_budget_mb=8000)
    assert process_settings(base, 0, 1, cpu_count=16) is base


def test_the_whole_device_is_split_when_no_budget_is_set() -> None:
    shares = [process_settings(settings(), i, 4, cpu_count=16) for i in range(4)]
    assert [s.vram_budget_fraction for s in shares] == [0.25] * 4
    assert all(s.vram_budget_mb is None for s in shares)


def test_a_budget_in_mib_or_as_a_fraction_is_split() -> None:
    assert process_settings(settings(vram_budget_mb=10_000), 1, 3, cpu_count=2).vram_budget_mb == 3333
    by_fraction = process_settings(settings(vram_budget_fraction=0.8), 1, 2, cpu_count=2)
    assert by_fraction.vram_budget_fraction == pytest.approx(0.4) and by_fraction.vram_budget_mb is None


def test_cores_are_split_unless_cpu_threads_is_set() -> None:
    assert [process_settings(settings(), i, 3, cpu_count=16).cpu_threads for i in range(3)] == [5, 5, 5]
    assert process_settings(settings(), 0, 4, cpu_count=2).cpu_threads == 1  # at least one
    assert process_settings(settings(cpu_threads=6), 0, 4, cpu_count=2).cpu_threads == 6


def test_process_i_gets_port_plus_i_and_its_own_worker_id() -> None:
    shares = [process_settings(settings(), i, 3, cpu_count=2) for i in range(3)]
    assert [s.http_port for s in shares] == [9108, 9109, 9110]
    assert [s.worker_id for s in shares] == ["gpu-host-0", "gpu-host-1", "gpu-host-2"]
    assert process_settings(settings(http_port=0), 2, 3, cpu_count=2).http_port == 0  # off stays off


def test_ports_past_65535_are_refused_with_what_to_change() -> None:
    with pytest.raises(ConfigurationError, match="65530-65537.*lower http_port"):
        process_settings(settings(http_port=65530), 0, 8, cpu_count=2)


def test_the_plan_names_each_process_share() -> None:
    lines = plan_lines(settings(vram_budget_mb=8000), 2, cpu_count=8)
    assert lines == [
        "process 0: worker_id gpu-host-0, http port 9108, vram_budget_mb=4000 (on GPU), cpu_threads=4",
        "process 1: worker_id gpu-host-1, http port 9109, vram_budget_mb=4000 (on GPU), cpu_threads=4",
    ]


def test_run_takes_processes_and_defaults_to_one() -> None:
    parser = build_parser()
    assert parser.parse_args(["run"]).processes == 1
    assert parser.parse_args(["run", "--processes", "4"]).processes == 4


def test_summaries_add_up_and_keep_each_process_line() -> None:
    a = {"process": 0, "stopped": "stop requested", "consumed": 7, "results": 5, "dead_letters": 1,
         "handed_back": 1, "unacknowledged_at_stop": 0, "dead_letters_by_kind": {"invalid_json": 1},
         "seconds": 3.0, "messages_per_second": 10.0}  # fmt: skip
    b = {"process": 1, "stopped": "stop requested", "consumed": 4, "results": 2, "dead_letters": 2,
         "handed_back": 0, "unacknowledged_at_stop": 0, "dead_letters_by_kind": {"invalid_json": 1,
         "text_too_long": 1}, "seconds": 4.0, "messages_per_second": 2.5}  # fmt: skip
    combined = combine_summaries([a, b])
    assert combined["stopped"] == "stop requested"
    assert (combined["consumed"], combined["results"], combined["dead_letters"], combined["handed_back"]) == (
        11, 7, 3, 1,
    )  # fmt: skip
    assert combined["dead_letters_by_kind"] == {"invalid_json": 2, "text_too_long": 1}
    assert combined["seconds"] == 4.0 and combined["messages_per_second"] == 12.5
    assert combined["processes"] == [a, b]


# The supervisor, on real child processes.

WAIT_FOR_TERM = (
    "import signal, sys, time\n"
    "def stop(*_): print('stopping', file=sys.stderr, flush=True); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('ready', file=sys.stderr, flush=True)\n"
    "while True: time.sleep(0.05)\n"
)
FAIL = (
    "import sys, time\ntime.sleep(0.3)\n"
    "print('sentiment-worker run: error: model: no such directory', file=sys.stderr)\nsys.exit(2)\n"
)
SLEEP = "import sys, time\nprint('ready', file=sys.stderr, flush=True)\ntime.sleep(60)\n"
SUMMARY = "import json\nprint('hello')\nprint(json.dumps({'stopped': 'done', 'consumed': 3, 'results': 3}))\n"


def supervise(scripts: list[str]) -> tuple[Supervisor, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    supervisor = Supervisor(
        lambda i: [sys.executable, "-c", scripts[i]], len(scripts), kill_after_s=30, stdout=out, stderr=err
    )
    return supervisor, out, err


def test_a_failed_process_stops_the_others_and_is_named() -> None:
    supervisor, _, err = supervise([WAIT_FOR_TERM, FAIL])
    failure = supervisor.run()
    assert failure is not None
    assert (failure.index, failure.returncode) == (1, 2)
    assert (
        failure.describe() == f"process 1 (pid {failure.pid}) failed, exit code 2: model: no such directory"
    )
    lines = err.getvalue().splitlines()
    assert "[process 0] stopping" in lines  # stopped by the parent's SIGTERM
    assert [s["exit_code"] for s in supervisor.summaries] == [0, 2]


def test_a_forwarded_signal_stops_every_process_cleanly() -> None:
    supervisor, _, err = supervise([WAIT_FOR_TERM, WAIT_FOR_TERM])

    def signal_when_both_are_ready() -> None:
        while err.getvalue().count("ready") < 2:
            time.sleep(0.05)
        supervisor.forward(signal.SIGTERM)

    sender = threading.Thread(target=signal_when_both_are_ready, daemon=True)
    sender.start()
    assert supervisor.run() is None
    lines = err.getvalue().splitlines()
    assert sorted(lines) == [
        "[process 0] ready",
        "[process 0] stopping",
        "[process 1] ready",
        "[process 1] stopping",
    ]


def test_a_process_ended_by_the_forwarded_signal_itself_counts_as_stopped() -> None:
    supervisor, _, err = supervise([SLEEP, WAIT_FOR_TERM])  # the first never handles SIGTERM

    def signal_when_both_are_ready() -> None:
        while err.getvalue().count("ready") < 2:
            time.sleep(0.05)
        supervisor.forward(signal.SIGTERM)

    threading.Thread(target=signal_when_both_are_ready, daemon=True).start()
    assert supervisor.run() is None
    assert [s["exit_code"] for s in supervisor.summaries] == [-signal.SIGTERM, 0]


def test_summaries_are_collected_and_other_lines_tagged() -> None:
    supervisor, out, _ = supervise([SUMMARY, SUMMARY])
    assert supervisor.run() is None
    assert sorted(out.getvalue().splitlines()) == ["[process 0] hello", "[process 1] hello"]
    assert [(s["process"], s["consumed"]) for s in supervisor.summaries] == [(0, 3), (1, 3)]


def test_each_process_runs_with_the_parents_flags_and_its_index() -> None:
    parser = build_parser()
    flags = [
        "--bootstrap-servers",
        "kafka:9092",
        "--config",
        "gpu.toml",
        "--http-port",
        "9200",
        "--device",
        "gpu",
    ]
    limits = ["--max-messages", "1000", "--idle-exit-s", "2.5"]
    parent = parser.parse_args(["run", "--processes", "3", *flags, *limits])
    command = run.process_command(parent, 2)
    assert command[:4] == [sys.executable, "-m", "worker", "run"]
    child = parser.parse_args(command[3:])
    assert vars(child) == {**vars(parent), "process_index": 2, "parent_pid": os.getpid()}
